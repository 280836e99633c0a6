"""Datasets: the on-disk layout and the built-in datasets (:mod:`.datasets`, with their bundled
files in ``builtin/``), reading shards larger than memory (:mod:`.streaming`), and object
storage (:mod:`.object_store`).

A new data format or a new built-in dataset goes here (the layout's writer and reader in
:mod:`.datasets`, a streaming reader in :mod:`.streaming`); staging it onto the shared volume is
the ``stage_data`` step's business (``steps/``).
"""
