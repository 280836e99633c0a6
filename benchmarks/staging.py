"""Staging throughput from a loopback S3 server (SeaweedFS), against baselines measured in the
same run: boto3 downloading the same objects one at a time, and a plain local copy of the same
bytes (the disk's own limit).

    python benchmarks/staging.py [--small 500 --small-kb 64 --large 4 --large-mb 64 --repeat 2]

Two workloads: many small files and a few large ones. Staging includes listing, If-Match GETs,
the atomic renames and the SHA-256 verification of every byte; the baselines do none of that.
All writes land in the page cache (no fsync), for every contender alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.s3_server

from sublimate.components.datasets import FORMAT_VERSION, METADATA_FILE
from sublimate.components.stage_data import stage_url
from tests.s3_server import S3Server, seaweedfs


def make_dataset(folder: Path, count: int, size: int) -> Path:
    """A dataset folder in the layout whose shards are ``count`` random files of ``size`` bytes."""
    folder.mkdir(parents=True)
    shards = []
    for index in range(count):
        name = f"train-{index:05d}-of-{count:05d}.npz"
        data = os.urandom(size)
        (folder / name).write_bytes(data)
        shards.append({"file": name, "bytes": size, "sha256": hashlib.sha256(data).hexdigest()})
    (folder / METADATA_FILE).write_text(json.dumps({
        "format_version": FORMAT_VERSION, "name": folder.name, "feature_shape": [1],
        "num_classes": 2, "splits": {"train": {"examples": count, "shards": shards}}}))
    return folder


def boto3_loop(server: S3Server, bucket: str, prefix: str, target: Path) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint)
    target.mkdir(parents=True)
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/") for o in page.get("Contents", [])]
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        with open(target / key.rsplit("/", 1)[-1], "wb") as out:
            shutil.copyfileobj(body, out, 1 << 20)


def local_copy(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for path in source.iterdir():
        shutil.copyfile(path, target / path.name)


def timed(scratch: Path, action: Callable[[Path], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        target = Path(tempfile.mkdtemp(dir=scratch)) / "copy"
        started = time.perf_counter()
        action(target)
        best = min(best, time.perf_counter() - started)
        shutil.rmtree(target.parent)
    return best


def run_workload(server: S3Server, scratch: Path, label: str, count: int, size: int,
                 repeat: int) -> None:
    source = make_dataset(scratch / f"src-{label}", count, size)
    total = sum(p.stat().st_size for p in source.iterdir())
    bucket = f"bench-{label}"
    fs = server.filesystem()
    fs.mkdir(bucket)
    fs.put(str(source) + "/", f"{bucket}/ds/", recursive=True)
    url = f"s3://{bucket}/ds"
    results = {
        "sublimate stage": timed(scratch, lambda t: stage_url(url, t), repeat),
        "s3fs get (recursive)": timed(scratch, lambda t: fs.get(f"{bucket}/ds/", f"{t}/",
                                                                recursive=True), repeat),
        "boto3 one at a time": timed(scratch, lambda t: boto3_loop(server, bucket, "ds", t),
                                     repeat),
        "local copy": timed(scratch, lambda t: local_copy(source, t), repeat),
    }
    print(f"\n{label}: {count} files x {size / 2**20:g} MiB = {total / 1e6:.1f} MB "
          f"(best of {repeat})")
    baseline = results["boto3 one at a time"]
    for name, seconds in results.items():
        print(f"  {name:<22} {seconds:7.3f} s {total / 1e6 / seconds:8.1f} MB/s "
              f"{baseline / seconds:6.2f}x boto3 loop")
    fs.rm(bucket, recursive=True)
    shutil.rmtree(source)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--small-kb", type=int, default=64)
    parser.add_argument("--large", type=int, default=4)
    parser.add_argument("--large-mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sublimate-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        with seaweedfs(scratch / "weed") as server:
            os.environ.update(server.env())
            # Stage output lines (progress, "already complete") are noise here.
            sys.stdout.flush()
            run_workload(server, scratch, "small", args.small, args.small_kb << 10, args.repeat)
            run_workload(server, scratch, "large", args.large, args.large_mb << 20, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
