"""Sharded checkpoint folders (``checkpoint-format=dcp``), read back under the weights-only rule.

``torch.distributed.checkpoint`` (DCP) writes a step as one ``__<rank>_<n>.distcp`` file per rank
(each rank only its share: replicated tensors are written once, by one rank) and a ``.metadata``
file that maps every tensor to its file and offsets. Any number of ranks can read it back, each
taking the slices it needs, so a checkpoint saved by 2 ranks resumes on 1 or 3.

DCP reads ``.metadata`` with a plain ``pickle.load`` and non-tensor values (an optimizer's
learning rate, ...) with ``torch.load(weights_only=False)``: a folder planted on the shared volume
could then run code on the next resume, which :mod:`.checkpoint`'s files never allow. Here the
metadata is unpickled with an allow-list of the classes DCP writes there (its metadata records,
``torch.Size``, dtypes, paths) and values with ``weights_only=True``; anything else is refused
with :class:`~.checkpoint.CheckpointError` naming the file, before any tensor is read.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.planner import ReadItem

from sublimate.components.model.checkpoint import CheckpointError

METADATA_FILE = ".metadata"  # DCP's name for the map of a checkpoint's tensors

# What DCP's .metadata may name besides torch.distributed.checkpoint.metadata's own classes.
_ALLOWED_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name (torch.strided, ...)
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # a tensor's file and offsets
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata records and nothing else (see the module's docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        found = getattr(dcp_metadata, name, None) if module == dcp_metadata.__name__ else None
        # a class defined there (a dataclass or enum of DCP's records), not one it imports
        if isinstance(found, type) and found.__module__ == dcp_metadata.__name__:
            return found
        raise pickle.UnpicklingError(f"{module}.{name}")


class WeightsOnlyReader(FileSystemReader):
    """DCP's folder reader with the metadata unpickled under the allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        path = Path(self.path) / METADATA_FILE
        try:
            with path.open("rb") as stream:
                metadata = _MetadataUnpickler(stream).load()
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing; the step's checkpoint is incomplete") \
                from None
        except (pickle.UnpicklingError, EOFError, AttributeError) as error:
            raise CheckpointError(f"{path}: not a checkpoint's metadata, so it is not loaded "
                                  f"(it names {error})") from None
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise CheckpointError(f"{path}: not a checkpoint's metadata, so it is not loaded")
        storage_meta = getattr(metadata, "storage_meta", None) or dcp_metadata.StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner with non-tensor values read weights-only (numbers, strings, ...)."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as error:
            raise CheckpointError(f"{self.folder}: value {read_item.dest_index.fqn} "
                                  f"holds more than plain values ({error})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                        loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load(state: dict[str, Any], folder: Path) -> None:
    """Fill ``state`` (tensors in place, values replaced) from the checkpoint in ``folder``; a
    collective over the default process group when there is one, whatever its size."""
    # Read here first (it is small), so that a refused file is this one clear error rather than
    # DCP's report of every rank's failure.
    WeightsOnlyReader(folder).read_metadata()
    try:
        dcp.load(state, storage_reader=WeightsOnlyReader(folder),
                 planner=WeightsOnlyLoadPlanner(folder),
                 no_dist=not torch.distributed.is_initialized())
    except CheckpointException as error:
        # each failure as torch wraps it: (the exception, its traceback)
        refused = [failure[0] for failure in error.failures.values()
                   if isinstance(failure[0], CheckpointError)]
        if refused:
            raise refused[0] from None
        raise
