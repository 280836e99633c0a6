"""CronWorkflows (Argo's ``server/cronworkflow/``): not served yet."""

from __future__ import annotations

from .routing import Route

CRON_ROUTES: list[Route] = []
