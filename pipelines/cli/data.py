"""`sublimate data ...`: publish and inspect datasets in object storage.

Credentials and endpoints come from the standard AWS variables and profiles (see
docs/datasets.md); no command takes a key as an argument.
"""

from __future__ import annotations

import argparse
import json

from .common import UsageError


def add_data_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``data push`` and ``data ls`` on the main CLI's subparsers."""
    data = subparsers.add_parser(
        "data", help="publish and inspect datasets in object storage",
        description="Publish and inspect datasets in sublimate's layout at any fsspec URL.")
    commands = data.add_subparsers(dest="data_command", required=True, metavar="COMMAND")

    push = commands.add_parser(
        "push", help="publish a dataset to a URL (metadata.json last)",
        description="Publish SOURCE (a built-in dataset such as 'digits', py:module:function, or "
                    "a local dataset folder) to URL (s3://bucket/prefix, file://..., any fsspec "
                    "URL). The dataset is verified first; metadata.json is uploaded last.")
    push.add_argument("source", metavar="SOURCE")
    push.add_argument("url", metavar="URL")
    push.add_argument("--create-bucket", action="store_true",
                      help="create the S3 bucket if it does not exist")
    push.set_defaults(handler=command_push)

    ls = commands.add_parser("ls", help="show the dataset published at a URL",
                             description="List the files of the dataset at URL and its splits.")
    ls.add_argument("url", metavar="URL")
    ls.set_defaults(handler=command_ls)


# The handlers import the storage modules (numpy, botocore, fsspec) themselves: registering these
# commands must not slow down every other `sublimate` command.


def _usage_error(error: Exception) -> Exception:
    from sublimate.components.data import object_store

    return UsageError(object_store.redact(str(error)))


def command_push(args: argparse.Namespace) -> int:
    from sublimate.components.data.datasets import DatasetError
    from sublimate.components.steps.publish import push

    try:
        report = push(args.source, args.url, create_bucket=args.create_bucket)
    except DatasetError as error:
        raise _usage_error(error) from error
    print(f"pushed {report.files} files, {report.bytes} bytes to {report.url} "
          f"in {report.seconds:.2f}s")
    return 0


def command_ls(args: argparse.Namespace) -> int:
    from sublimate.components.data import object_store
    from sublimate.components.data.datasets import METADATA_FILE, DatasetError

    fs, root = object_store.open_url(args.url)
    try:
        entries = [e for e in fs.ls(root, detail=True) if e.get("type") == "file"]
        metadata = json.loads(fs.cat_file(object_store.join(root, METADATA_FILE))) \
            if any(e["name"].endswith(f"/{METADATA_FILE}") for e in entries) else None
    except FileNotFoundError as error:
        if object_store.missing_bucket(error):
            raise _usage_error(object_store.explain(args.url, error)) from error
        raise _usage_error(DatasetError(f"dataset '{args.url}': no such directory")) from error
    except DatasetError as error:
        raise _usage_error(error) from error
    except Exception as error:  # every store error becomes one message naming the URL
        raise _usage_error(object_store.explain(args.url, error)) from error
    for entry in sorted(entries, key=lambda e: e["name"]):
        print(f"{entry['size']:>12}  {entry['name'].rsplit('/', 1)[-1]}")
    if metadata is None:
        print(f"{args.url}: not a complete sublimate dataset ({METADATA_FILE} is missing)")
        return 1
    splits = ", ".join(f"{name}={split['examples']}" for name, split in metadata["splits"].items())
    print(f"{metadata['name']}: {splits}; features {metadata['feature_shape']}, "
          f"{metadata['num_classes']} classes")
    return 0
