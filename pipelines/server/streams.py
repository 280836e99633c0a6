"""Streamed answers (Argo's ``WatchWorkflows`` and ``WorkflowLogs``): not served yet."""

from __future__ import annotations

from .routing import Route

STREAM_ROUTES: list[Route] = []
