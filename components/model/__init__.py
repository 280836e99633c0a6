"""Models and their files: the built-in models and ``module:function`` entry points
(:mod:`.models`), the checkpoint file format (:mod:`.checkpoint`) and model versions with their
champion (:mod:`.registry`).
"""
