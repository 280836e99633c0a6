"""One module per workflow step: its Hera template (``template()``) and the ``main()`` its
container runs (``python -m sublimate.components.steps.<step>``).

``stage_data``, ``train`` (the launcher is ``launch/``), ``evaluate``, ``gate`` (champion
against challenger), ``register_model``, ``notify`` (the exit handler's webhook),
``sweep_grid`` and ``compare`` (a sweep's grid and its report), ``publish`` (``sublimate data
push``).

A new step is a module here with ``template()`` and ``main()`` (failing with
``base.termination.fail`` on bad input), used by a pipeline in ``pipelines/``.
"""
