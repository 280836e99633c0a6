"""What every other room shares: the settings, the run folder's file names, the runtime's image
and paths, one-line failures, the contract a training process receives, durable writes and
process identity.

Imports nothing of ``sublimate.components`` outside ``base`` (the bottom layer), and nothing
heavy: the launcher and ``sublimate run`` import it on their way to starting something.

Add here only what every layer needs; a training setting is one ``Setting(...)`` in
:mod:`.settings`, a file of a run's folder one name in :mod:`.run_files`.
"""
