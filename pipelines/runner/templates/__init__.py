"""What each kind of Argo template does when it runs (the controller's ``operator.go``, by kind).

- :mod:`.context`: ``RunContext``, the protocol the engine's run implements for every kind;
- :mod:`.calls`: calling a template (arguments, ``continueOn``, parallelism slots);
- :mod:`.dag`, :mod:`.steps`: the two orchestration kinds; :mod:`.loops`: ``withItems``,
  ``withParam``, ``withSequence``; :mod:`.retry`: ``retryStrategy``;
- :mod:`.pod`: a container/script/resource pod, its outputs collected; :mod:`.daemons` and
  :mod:`.probes`: daemoned steps and their readiness; :mod:`.suspend`: ``suspend``;
  :mod:`.data_template`, :mod:`.http_template`: the ``data`` and ``http`` kinds;
- :mod:`.inputs`, :mod:`.outputs`: a template's inputs resolved, its outputs gathered;
- :mod:`.exit_handler`, :mod:`.hooks`: ``onExit`` and lifecycle hooks;
- :mod:`.synchronization`: mutexes and semaphores.

These modules never import the engine (``..engine``): they see a run through ``RunContext``.
"""
