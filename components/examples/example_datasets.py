"""A worked example of bringing your own dataset: a function that returns the splits.

Run it by entry point, no publishing needed::

    sublimate run -p dataset=py:sublimate.components.examples.example_datasets:blobs

or publish it like any dataset and stage it from there::

    sublimate data push py:sublimate.components.examples.example_datasets:blobs s3://bucket/blobs
    sublimate run -p dataset=s3://bucket/blobs

The contract (see docs/datasets.md): a function with no required arguments that returns
``{split name: datasets.Split}`` with at least ``train`` and ``test``; ``x`` is float32 of shape
``(N, *feature_shape)``, ``y`` int64 class labels ``0 .. num_classes-1``.
"""

from __future__ import annotations

import numpy as np

from sublimate.components.data.datasets import Split


def blobs(num_classes: int = 6, num_features: int = 20, train_per_class: int = 500,
          test_per_class: int = 100, spread: float = 1.6, seed: int = 7) -> dict[str, Split]:
    """Gaussian clusters, one per class, around random centres: generated, never downloaded.

    ``spread`` (the clusters' standard deviation relative to the centres' scale) is set so the
    classes overlap a little and a linear model does not solve it perfectly.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(num_classes, num_features))

    def draw(per_class: int) -> Split:
        y = np.repeat(np.arange(num_classes), per_class)
        x = centres[y] + rng.normal(scale=spread, size=(len(y), num_features))
        order = rng.permutation(len(y))
        return Split(x[order].astype(np.float32), y[order].astype(np.int64))

    return {"train": draw(train_per_class), "test": draw(test_per_class)}


def digit_images(test_fraction: float = 0.2, seed: int = 0) -> dict[str, Split]:
    """The built-in digits as 1x8x8 images (``feature_shape`` [1, 8, 8]): the image dataset of
    the CNN example (``examples/cnn_bmuf``)."""
    from sublimate.components.data.datasets import digits_splits

    return {name: Split(split.x.reshape(-1, 1, 8, 8), split.y)
            for name, split in digits_splits(test_fraction, seed).items()}
