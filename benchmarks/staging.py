"""Staging throughput from a loopback S3 server (SeaweedFS), against baselines measured in the
same run on the same objects:

- ``boto3 download_file loop``: what a user writes, ``client.download_file`` per object, one
  object at a time. boto3's TransferManager already splits an object above 8 MiB into concurrent
  ranged GETs (10 threads), so on large objects this loop is not single-stream; reported as is.
- ``boto3 get_object loop``: ``get_object()["Body"]`` streamed to a file, one object at a time,
  one stream per object: the plain single-stream baseline.
- ``s3fs get (recursive)``: fsspec's own concurrent copy (no integrity checks).
- ``local copy``: ``shutil.copyfile`` of the same bytes from local disk (the disk's own limit).
- ``ceiling: ...``: the same GETs with nothing written and nothing checked, from 32 botocore
  threads (large objects in 16 MiB ranges) and from 32 aiobotocore requests in flight: what the
  server and the HTTP client can deliver on this machine, whatever the copier does.

    python benchmarks/staging.py [--workloads small,tiny,large] [--repeat 3]

Three workloads: "small" (300 x 1 MiB, many small files as in RECIPES.md), "tiny" (500 x 64 KiB,
a request-rate stress case) and "large" (4 x 64 MiB). Staging includes listing, If-Match GETs, the
atomic renames and the SHA-256 verification of every byte; the baselines do none of that. All
writes land in the page cache (no fsync), for every contender alike. Each figure is the best of
``--repeat`` runs; the CPU seconds that the SeaweedFS server and this client process used during
that run are shown next to it, to tell a client-bound result from a server-bound one on a small
machine (the server and the client share its cores).

``--smoke`` (tests/test_benchmarks.py): the three workloads at a few files each ("large": one
object just over the ceiling's 16 MiB part, so it is fetched in ranges), best of 1: seconds,
figures that mean nothing. Needs boto3 (``pip install -e '.[bench]' -c constraints.txt``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.s3_server

from sublimate.components.data.datasets import FORMAT_VERSION, METADATA_FILE
from sublimate.components.steps.stage_data import stage_url
from tests.s3_server import S3Server, seaweedfs

WORKLOADS = {  # name: (files, bytes each)
    "small": (300, 1 << 20),
    "tiny": (500, 64 << 10),
    "large": (4, 64 << 20),
}
# --smoke's sizes: every workload, a few files each
SMOKE_WORKLOADS = {"small": (3, 64 << 10), "tiny": (3, 4 << 10), "large": (1, (16 << 20) + 1)}
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"
BASELINE = "boto3 download_file loop"


def make_dataset(folder: Path, count: int, size: int) -> Path:
    """A dataset folder in the layout whose shards are ``count`` files of about ``size`` bytes:
    real shards (staging checks each one's arrays), of random float32 examples (so no
    transfer can compress them) with one feature and an int64 label each (12 bytes a row)."""
    folder.mkdir(parents=True)
    rows = max(size // 12, 1)
    rng = np.random.default_rng(0)
    shards = []
    for index in range(count):
        name = f"train-{index:05d}-of-{count:05d}.npz"
        buffer = io.BytesIO()
        np.savez(buffer, x=rng.random((rows, 1), dtype=np.float32),
                 y=rng.integers(0, 2, rows, dtype=np.int64))
        data = buffer.getvalue()
        (folder / name).write_bytes(data)
        shards.append({"file": name, "bytes": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()})
    (folder / METADATA_FILE).write_text(json.dumps({
        "format_version": FORMAT_VERSION, "name": folder.name, "feature_shape": [1],
        "num_classes": 2, "splits": {"train": {"examples": count * rows, "shards": shards}}}))
    return folder


def _boto3_client(server: S3Server):  # -> botocore S3 client
    import boto3

    return boto3.client("s3", endpoint_url=server.endpoint)


def _keys(client, bucket: str, prefix: str) -> list[str]:
    return [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/") for o in page.get("Contents", [])]


def boto3_download_file_loop(server: S3Server, bucket: str, prefix: str, target: Path) -> None:
    """The loop a user writes: list, then ``download_file`` each object in turn."""
    client = _boto3_client(server)
    target.mkdir(parents=True)
    for key in _keys(client, bucket, prefix):
        client.download_file(bucket, key, str(target / key.rsplit("/", 1)[-1]))


def boto3_get_object_loop(server: S3Server, bucket: str, prefix: str, target: Path) -> None:
    """One ``get_object`` stream per object, one object at a time."""
    client = _boto3_client(server)
    target.mkdir(parents=True)
    for key in _keys(client, bucket, prefix):
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        with open(target / key.rsplit("/", 1)[-1], "wb") as out:
            shutil.copyfileobj(body, out, 1 << 20)


def raw_threads(server: S3Server, bucket: str, prefix: str, threads: int = 32,
                part: int = 16 << 20) -> None:
    """Ceiling: botocore GETs from ``threads`` threads into memory (large objects as ranged
    parts), nothing written, nothing checked."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=server.endpoint,
                          config=Config(max_pool_connections=threads))
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
    ranges = [(o["Key"], start, min(start + part, o["Size"])) for page in pages
              for o in page.get("Contents", []) for start in range(0, max(o["Size"], 1), part)]

    def get(key: str, start: int, end: int) -> int:
        extra = {"Range": f"bytes={start}-{end - 1}"} if end - start == part else {}
        return len(client.get_object(Bucket=bucket, Key=key, **extra)["Body"].read())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda r: get(*r), ranges))


def raw_aiobotocore(fs, bucket: str, prefix: str, concurrency: int = 32) -> None:
    """Ceiling: s3fs's aiobotocore client, ``concurrency`` GETs in flight into memory, nothing
    written, nothing checked."""
    import asyncio

    from fsspec.asyn import sync

    async def run() -> None:
        limit = asyncio.Semaphore(concurrency)

        async def get(key: str) -> None:
            async with limit:
                response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
                await response["Body"].read()
                response["Body"].close()

        listing = await fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=f"{prefix}/")
        await asyncio.gather(*(get(o["Key"]) for o in listing.get("Contents", [])))

    sync(fs.loop, run)


def local_copy(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for path in source.iterdir():
        shutil.copyfile(path, target / path.name)


def _weed_pids() -> list[int]:
    """The SeaweedFS processes this benchmark started (children of this process)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        if comm == "weed" and int(rest.split()[1]) == os.getpid():
            pids.append(int(entry.name))
    return pids


def _server_cpu(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (all their threads)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def _client_cpu() -> float:
    times = os.times()
    return times.user + times.system


def timed(scratch: Path, action: Callable[[Path], object], repeat: int,
          pids: list[int]) -> tuple[float, float, float]:
    """Best wall time of ``repeat`` runs, with the server's and the client's CPU in that run."""
    best = (float("inf"), 0.0, 0.0)
    for _ in range(repeat):
        target = Path(tempfile.mkdtemp(dir=scratch)) / "copy"
        server0, client0 = _server_cpu(pids), _client_cpu()
        started = time.perf_counter()
        action(target)
        seconds = time.perf_counter() - started
        if seconds < best[0]:
            best = (seconds, _server_cpu(pids) - server0, _client_cpu() - client0)
        shutil.rmtree(target.parent)
    return best


def run_workload(server: S3Server, scratch: Path, label: str, count: int, size: int,
                 repeat: int, pids: list[int]) -> dict[str, float]:
    source = make_dataset(scratch / f"src-{label}", count, size)
    total = sum(p.stat().st_size for p in source.iterdir())
    bucket = f"bench-{label}"
    fs = server.filesystem()
    fs.mkdir(bucket)
    fs.put(str(source) + "/", f"{bucket}/ds/", recursive=True)
    url = f"s3://{bucket}/ds"
    contenders: dict[str, Callable[[Path], object]] = {
        "sublimate stage": lambda t: stage_url(url, t),
        "s3fs get (recursive)": lambda t: fs.get(f"{bucket}/ds/", f"{t}/", recursive=True),
        BASELINE: lambda t: boto3_download_file_loop(server, bucket, "ds", t),
        "boto3 get_object loop": lambda t: boto3_get_object_loop(server, bucket, "ds", t),
        "local copy": lambda t: local_copy(source, t),
        "ceiling: threads GET->RAM": lambda t: raw_threads(server, bucket, "ds"),
        "ceiling: aiobotocore->RAM": lambda t: raw_aiobotocore(fs, bucket, "ds"),
    }
    results = {name: timed(scratch, action, repeat, pids) for name, action in contenders.items()}
    print(f"\n{label}: {count} files x {size / 2**20:g} MiB = {total / 1e6:.1f} MB "
          f"(best of {repeat}; CPU seconds of the server and of this process in that run)",
          flush=True)
    baseline, single = results[BASELINE][0], results["boto3 get_object loop"][0]
    print(f"  {'':<26} {'wall':>9} {'rate':>13} {'vs download_file loop':>22} "
          f"{'vs get_object loop':>19} {'server cpu':>11} {'client cpu':>11}")
    for name, (seconds, server_cpu, client_cpu) in results.items():
        print(f"  {name:<26} {seconds:7.3f} s {total / 1e6 / seconds:8.1f} MB/s "
              f"{baseline / seconds:21.2f}x {single / seconds:18.2f}x "
              f"{server_cpu:9.2f} s {client_cpu:9.2f} s", flush=True)
    fs.rm(bucket, recursive=True)
    shutil.rmtree(source)
    return {name: total / 1e6 / seconds for name, (seconds, _, _) in results.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated, from: " + ", ".join(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    workloads = WORKLOADS
    if args.smoke:
        parser.set_defaults(repeat=1)
        args = parser.parse_args()
        workloads = SMOKE_WORKLOADS
        print(SMOKE_LINE, flush=True)
    print(f"{os.cpu_count()} CPUs; server and client share them", flush=True)
    with tempfile.TemporaryDirectory(prefix="sublimate-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        with seaweedfs(scratch / "weed") as server:
            os.environ.update(server.env())
            pids = _weed_pids()
            for label in args.workloads.split(","):
                count, size = workloads[label]
                run_workload(server, scratch, label, count, size, args.repeat, pids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
