"""A manifest read and checked before anything runs (Argo's ``workflow/validate`` and
``workflow/templateresolution``).

- :mod:`.load`: ``load_manifest``, ``check_workflow``, ``unsupported_fields``;
- :mod:`.template_checks`: each template's fields checked; :mod:`.fields`: the fields a local run
  supports and those only a cluster has;
- :mod:`.library`: WorkflowTemplates and ClusterWorkflowTemplates that ``templateRef`` and
  ``workflowTemplateRef`` name;
- :mod:`.parameter_resolution`: ``-p`` values against the declared parameters;
- :mod:`.durations`: Argo's duration strings; :mod:`.repository`: artifact repository settings.
"""
