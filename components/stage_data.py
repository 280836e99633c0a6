"""The ``stage-data`` step: materialise a dataset on the shared volume.

``--dataset`` is a built-in name (``digits``) or a path / fsspec URL of a folder in the layout
described in :mod:`sublimate.components.datasets`. The staged copy lands in
``<data-root>/<dataset-id>`` under a temporary name and is renamed into place once every shard is
verified, so a failed or interrupted staging never leaves a folder that looks complete, and a
re-run over a complete copy transfers nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sublimate.components.datasets import (
    BUILTIN_DATASETS,
    METADATA_FILE,
    DatasetError,
    build_builtin,
    verify_dataset,
)


def dataset_id(dataset: str) -> str:
    """A stable folder name for ``dataset``: readable, and unique per source URL."""
    if dataset in BUILTIN_DATASETS:
        return dataset
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", dataset.rstrip("/").rsplit("/", 1)[-1]) or "dataset"
    return f"{stem}-{hashlib.sha256(dataset.encode()).hexdigest()[:10]}"


def _copy_from_url(dataset: str, target: Path) -> None:
    import fsspec  # deferred: only URL datasets pay for it

    try:
        fs, root = fsspec.core.url_to_fs(dataset)
    except (ValueError, ImportError) as error:
        raise DatasetError(f"dataset '{dataset}': {error}") from error
    if not fs.isdir(root):
        raise DatasetError(f"dataset '{dataset}': no such directory")
    if not fs.isfile(f"{root.rstrip('/')}/{METADATA_FILE}"):
        raise DatasetError(f"dataset '{dataset}': not a sublimate dataset ({METADATA_FILE} is "
                           "missing; publish it with the documented layout)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fs.get(f"{root.rstrip('/')}/", f"{staging}/", recursive=True)
        verify_dataset(staging)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def stage(dataset: str, data_root: Path) -> Path:
    """Make ``dataset`` available under ``data_root`` and return its verified folder."""
    target = data_root / dataset_id(dataset)
    if (target / METADATA_FILE).is_file():
        print(f"stage-data: {target} is already complete; nothing to transfer", flush=True)
    elif dataset in BUILTIN_DATASETS:
        build_builtin(dataset, target)
    elif "://" in dataset or Path(dataset).exists():
        _copy_from_url(dataset if "://" in dataset else str(Path(dataset).resolve()), target)
    elif "/" in dataset or dataset.startswith("."):
        raise DatasetError(f"dataset '{dataset}': no such directory")
    else:
        raise DatasetError(f"dataset '{dataset}' is neither a built-in dataset "
                           f"({', '.join(BUILTIN_DATASETS)}) nor an existing path or URL")
    verify_dataset(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stage-data", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="built-in name, path or fsspec URL")
    parser.add_argument("--data-root", required=True, type=Path,
                        help="folder on the shared volume that holds staged datasets")
    parser.add_argument("--output-path", type=Path,
                        help="file to write the staged folder's path to (an Argo output)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        folder = stage(args.dataset, args.data_root)
    except DatasetError as error:
        print(f"stage-data: error: {error}", file=sys.stderr)
        return 2
    metadata = verify_dataset(folder)
    counts = ", ".join(f"{name}={split['examples']}" for name, split in metadata["splits"].items())
    print(f"stage-data: {metadata['name']} ready at {folder} ({counts}) "
          f"in {time.perf_counter() - started:.2f}s", flush=True)
    if args.output_path:
        args.output_path.parent.mkdir(parents=True, exist_ok=True)
        args.output_path.write_text(str(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def template(name: str = "stage-data", **step_options: object):
    """The ``stage-data`` step: input ``dataset``; output ``dataset-dir`` (the staged folder)."""
    from sublimate.components.runtime import DATASETS_PATH, python_step

    return python_step(
        name, "sublimate.components.stage_data",
        inputs={"dataset": "--dataset"},
        outputs={"dataset-dir": "--output-path"},
        extra_args=["--data-root", DATASETS_PATH],
        **step_options,  # type: ignore[arg-type]
    )
