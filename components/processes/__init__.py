"""What torchrun and TorchX start on every node: the built-in training loop (:mod:`.worker`),
users' own code (:mod:`.entrypoint`, with ``TF_CONFIG`` from :mod:`.tf_config`) and the
parameter server with its trainers (:mod:`.async_sgd`).

Each is a ``python -m`` module named by the launcher's ``AppDef``\\ s (``launch/apps.py``); a new
kind of training process is a module here and a TorchX component there.
"""
