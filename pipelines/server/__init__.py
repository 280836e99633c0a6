"""``sublimate server``: the local runner behind Argo Server's REST API, so that Hera's
``WorkflowsService`` and ``sublimate submit/get/list`` talk to one machine as to a cluster.

One module per concern: ``app`` (HTTP, routing, authentication), ``store`` (the workflows
under ``SUBLIMATE_HOME``: run folders and the server's records), ``templates``
(WorkflowTemplates, and a Workflow submitted from one), ``convert`` (a run's ``status.json`` as
Argo's Workflow object), ``execution`` (accepted workflows run in the background by the
runner's engine; runs a dead server left, settled), ``selectors`` (label selectors),
``errors`` (grpc-gateway's error shape). The server imports the runner; the runner never
imports the server.
"""

from .app import DEFAULT_PORT, ArgoApiServer, make_server

__all__ = ["DEFAULT_PORT", "ArgoApiServer", "make_server"]
