"""Worked examples that pipelines name by their path: datasets (``-p
dataset=py:sublimate.components.examples.example_datasets:blobs``) and models (``-p
model=sublimate.components.examples.example_models:small_cnn``)."""
