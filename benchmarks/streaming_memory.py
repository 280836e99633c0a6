"""Training from a split several times larger than the memory cap, against in-memory training.

1. Generates a synthetic dataset in the layout (``datasets.write_synthetic_dataset``, shard by
   shard) of ``--size-factor`` x ``--cap-mb`` bytes of training rows (``--features`` float32 each).
2. Runs three training children, each under the cap, the same MLP (``--features`` ->
   ``--hidden`` -> ``--hidden`` -> 10, ReLU) and the built-in loop's step (forward, CrossEntropy,
   backward, SGD step):
   (a) **streaming**: ``streaming.ShardReader`` over one full epoch of the whole split
       (``--size-factor`` times the cap), ``--workers`` DataLoader workers: its peak memory;
   (b) **in-memory**: the built-in loop's way (the split as one tensor, rows of a seeded
       permutation) on a prefix of the same data that fits (``--prefix-mb``): its peak memory;
   (c) **paired** (``--rounds`` of them): both sources in one process, ``--pairs`` x 2 blocks of
       ``--block`` steps, alternating which goes first. Throughput is compared here, block
       against neighbouring block: on a shared host other processes' load swings samples/s by
       several times from one run to the next, far less between neighbouring blocks.
   Before (a) and (c) the shards are evicted from the page cache (``posix_fadvise(DONTNEED)``),
   so streaming reads the disk and the pages it reads are charged to its own cgroup.
3. Prints the peak RSS of the training process and of its largest DataLoader worker
   (``ru_maxrss``), the cgroup's peak charge (page cache included), samples/s once warm (after
   ``--warmup`` steps), the share of a step spent waiting for data, and the streaming /
   in-memory samples/s ratio over the paired blocks as median (min, max); the target is >= 0.9.

The cap is a cgroup memory limit: cgroup v1 (``/sys/fs/cgroup/memory``) or v2, made per child,
which needs root. Without one it falls back to ``RLIMIT_AS`` of cap + ``--as-slack-mb``, because
torch alone reserves ~0.8 GB of address space that it never touches (so an address-space cap is a
much weaker statement: it bounds mappings, not resident memory), and says so.

``--smoke`` (tests/test_benchmarks.py): the same three children and tables on a 1 MB split of 16
features (a temporary folder, removed afterwards), a few steps each: seconds, figures that mean
nothing.

Usage: python benchmarks/streaming_memory.py [--cap-mb 512] [--size-factor 4] [--rounds 1]
           [--workers 0] [--features 1024] [--hidden 512] [--batch 256] [--data-dir DIR]
       python benchmarks/streaming_memory.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sublimate.components.data.datasets import read_metadata, write_synthetic_dataset

MB = 1 << 20
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
# --smoke's sizes: a split of 1 MB (not the cap's multiple: the cap must still hold torch)
SMOKE = {"size_factor": 1 / 512, "prefix_mb": 1, "features": 16, "hidden": 16,
         "shard_rows": 4096, "buffer": 1024, "warmup": 2, "steps": 5, "pairs": 2, "block": 3}
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


# ---------------------------------------------------------------------------------------------
# the child: one training run under the cap, reporting JSON on its last line


def child(args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    from torch import nn

    from sublimate.components.data.streaming import ShardReader

    torch.manual_seed(0)
    # Once the model fits, gradients shrink into denormals, which x86 computes many times slower:
    # that would measure how far each run has converged, not how fast data arrives.
    torch.set_flush_denormal(True)
    metadata = read_metadata(args.data_dir)
    width = int(torch.tensor(metadata["feature_shape"]).prod())
    model = nn.Sequential(nn.Linear(width, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, metadata["num_classes"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    perf_counter = time.perf_counter
    waits: list[float] = []
    computes: list[float] = []

    def train(batches) -> int:  # type: ignore[no-untyped-def]
        """The built-in loop's step over an iterator of (x, y); returns the steps taken."""
        steps = 0
        started = perf_counter()
        for x, y in batches:
            loaded = perf_counter()
            loss = loss_fn(model(x.reshape(len(x), -1)), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done = perf_counter()
            waits.append(loaded - started)
            computes.append(done - loaded)
            started = done
            steps += 1
        return steps

    def streaming():  # type: ignore[no-untyped-def]
        reader = ShardReader(args.data_dir, local_batch=args.batch, seed=0,
                             buffer_size=args.buffer)
        return reader.batches(0, num_workers=args.workers, prefetch_factor=args.prefetch)

    def in_memory():  # type: ignore[no-untyped-def]
        """The built-in loop's data: a prefix of the split as one tensor, rows of a seeded
        permutation (the first shards, up to --prefix-mb of rows)."""
        rows = args.prefix_mb * MB // (4 * width)
        xs, ys, held = [], [], 0
        for shard in metadata["splits"]["train"]["shards"]:
            with np.load(args.data_dir / shard["file"]) as arrays:
                xs.append(torch.from_numpy(arrays["x"][:rows - held].reshape(-1, width).copy()))
                ys.append(torch.from_numpy(arrays["y"][:rows - held].copy()))
            held += len(ys[-1])
            if held >= rows:
                break
        features, labels = torch.cat(xs), torch.cat(ys)
        del xs, ys
        epoch = 0
        while True:
            order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(
                100_003 + epoch))
            for start in range(0, len(labels) - args.batch + 1, args.batch):
                chosen = order[start:start + args.batch]
                yield features[chosen], labels[chosen]
            epoch += 1

    result: dict = {}
    if args.child == "streaming":  # the whole split (size-factor x the cap), for its memory
        loader = streaming()
        steps = train(iter(loader))
        del loader  # joins the DataLoader workers: RUSAGE_CHILDREN has their peak
    elif args.child == "in-memory":
        source = in_memory()
        steps = train(next(source) for _ in range(args.warmup + args.steps))
    else:
        # Paired: blocks of --block steps from each source in turn, in one process, so both
        # see the same machine (other processes' load on a shared host swings samples/s by
        # several times between runs, not between neighbouring blocks).
        streamed, held = iter(streaming()), in_memory()
        sources = {"streaming": streamed, "in-memory": held}
        for name in sources:  # warm both: first mapping, first permutation, allocator
            train(next(sources[name]) for _ in range(args.warmup))
        pairs = []
        for pair in range(args.pairs):
            rates = {}
            for name in (("streaming", "in-memory") if pair % 2 == 0 else
                         ("in-memory", "streaming")):
                waits.clear()
                computes.clear()
                train(next(sources[name]) for _ in range(args.block))
                rates[name] = (args.block * args.batch / (sum(waits) + sum(computes)),
                               sum(waits) / (sum(waits) + sum(computes)))
            pairs.append(rates)
        result["pairs"] = pairs
        steps = args.pairs * args.block * 2
        waits.extend([0.0] * args.warmup)  # (the summary below is not used for paired runs)
        computes.extend([0.0] * args.warmup)
    warm_waits, warm_computes = waits[args.warmup:], computes[args.warmup:]
    seconds = sum(warm_waits) + sum(warm_computes)
    print(json.dumps({
        **result,
        "steps": steps,
        "samples_per_second": len(warm_waits) * args.batch / max(seconds, 1e-9),
        "data_wait_share": sum(warm_waits) / max(seconds, 1e-9),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }), flush=True)


# ---------------------------------------------------------------------------------------------
# the parent: data, caps, rounds, the table


class Cap:
    """A memory cap for one child: a fresh cgroup (v1 or v2), or RLIMIT_AS as a fallback."""

    def __init__(self, cap_bytes: int, as_slack: int) -> None:
        self.cap, self.as_slack = cap_bytes, as_slack
        self.path: Path | None = None
        self.kind = "RLIMIT_AS"
        name = f"sublimate-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        for root, limit_file, kind in (
                (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes", "cgroup v1"),
                (Path("/sys/fs/cgroup"), "memory.max", "cgroup v2")):
            if kind == "cgroup v2" and not (root / "cgroup.controllers").is_file():
                continue
            try:
                path = root / name
                path.mkdir()
            except OSError:
                continue
            try:
                (path / limit_file).write_text(str(cap_bytes))
                swap = path / ("memory.memsw.limit_in_bytes" if kind == "cgroup v1"
                               else "memory.swap.max")
                if swap.exists():  # no swapping out of the cap either
                    swap.write_text(str(cap_bytes) if kind == "cgroup v1" else "0")
            except OSError:
                path.rmdir()
                continue
            self.path, self.kind = path, kind
            break

    def enter(self) -> None:
        """In the child, before exec: join the cgroup, or limit the address space."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
        else:
            limit = self.cap + self.as_slack
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def peak_mb(self) -> float | None:
        if self.path is None:
            return None
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            if (self.path / name).is_file():
                return int((self.path / name).read_text()) / MB
        return None

    def close(self) -> None:
        if self.path is not None:
            for _ in range(50):  # the child's exit is seen by the cgroup a moment later
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def evict(folder: Path) -> None:
    """Drop the dataset's pages from the page cache: the next reader reads the disk."""
    for path in folder.glob("*.npz"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_child(mode: str, args: argparse.Namespace) -> dict:
    cap = Cap(args.cap_mb * MB, args.as_slack_mb * MB)
    try:
        if mode != "in-memory":
            evict(args.data_dir)
        command = [sys.executable, str(Path(__file__).resolve()), "--child", mode,
                   "--data-dir", str(args.data_dir), "--batch", str(args.batch),
                   "--hidden", str(args.hidden), "--workers", str(args.workers),
                   "--prefetch", str(args.prefetch), "--buffer", str(args.buffer),
                   "--prefix-mb", str(args.prefix_mb), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--pairs", str(args.pairs),
                   "--block", str(args.block)]
        started = time.perf_counter()
        completed = subprocess.run(command, env=ENV, capture_output=True, text=True,
                                   preexec_fn=cap.enter, timeout=args.timeout)
        if completed.returncode:
            raise SystemExit(f"{mode} child failed (status {completed.returncode}; -9 is the "
                             f"cgroup's OOM kill) under a {args.cap_mb} MB cap "
                             f"({cap.kind}):\n{completed.stderr[-3000:]}")
        result = json.loads(completed.stdout.strip().splitlines()[-1])
        result["wall"] = time.perf_counter() - started
        result["cgroup_peak_mb"] = cap.peak_mb()
        result["cap_kind"] = cap.kind
        return result
    finally:
        cap.close()


def make_data(args: argparse.Namespace) -> Path:
    row_bytes = 4 * args.features
    train_examples = int(args.size_factor * args.cap_mb * MB) // row_bytes
    folder = args.data_dir or Path(tempfile.mkdtemp(prefix="sublimate-stream-")) / "data"
    if (folder / "metadata.json").is_file():
        metadata = read_metadata(folder)
        if metadata["splits"]["train"]["examples"] == train_examples \
                and metadata["feature_shape"] == [args.features]:
            return folder
        raise SystemExit(f"{folder} holds another dataset; remove it or pick another --data-dir")
    started = time.perf_counter()
    write_synthetic_dataset(folder, train_examples=train_examples, test_examples=1024,
                            feature_shape=(args.features,), shard_size=args.shard_rows,
                            noise=32.0, name="streaming-benchmark")  # not trivially separable
    size = sum(p.stat().st_size for p in folder.glob("train-*.npz")) / MB
    print(f"generated {train_examples:,} rows x {args.features} float32 ({size:,.0f} MB, "
          f"shards of {args.shard_rows} rows) in {time.perf_counter() - started:.1f} s: {folder}")
    return folder


def _spread(values: list[float], fmt: str = ".0f") -> str:
    return (f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"
            if values else "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mb", type=int, default=512, help="memory cap per training child")
    parser.add_argument("--size-factor", type=float, default=4, help="training split / cap")
    parser.add_argument("--prefix-mb", type=int, default=48,
                        help="rows the in-memory run holds (must fit under the cap with torch)")
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--shard-rows", type=int, default=8192)
    parser.add_argument("--buffer", type=int, default=8192, help="shuffle window, in examples")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (streaming)")
    parser.add_argument("--prefetch", type=int, default=4, help="DataLoader prefetch_factor")
    parser.add_argument("--rounds", type=int, default=1, help="paired runs")
    parser.add_argument("--warmup", type=int, default=30, help="steps not timed")
    parser.add_argument("--steps", type=int, default=300, help="timed steps, in-memory run")
    parser.add_argument("--as-slack-mb", type=int, default=1024,
                        help="address space added to the cap when falling back to RLIMIT_AS")
    parser.add_argument("--data-dir", type=Path, help="keep (and reuse) the dataset here")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--pairs", type=int, default=8, help="paired blocks per paired run")
    parser.add_argument("--block", type=int, default=40, help="steps in one paired block")
    parser.add_argument("--child", choices=("streaming", "in-memory", "paired"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if not args.smoke:
        measure(args)
        return
    parser.set_defaults(**SMOKE)
    args = parser.parse_args()
    print(SMOKE_LINE, flush=True)
    with tempfile.TemporaryDirectory(prefix="sublimate-stream-smoke-") as folder:
        args.data_dir = args.data_dir or Path(folder) / "data"
        measure(args)


def measure(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    args.data_dir = make_data(args)
    runs = {mode: [run_child(mode, args) for _ in range(args.rounds if mode == "paired" else 1)]
            for mode in ("streaming", "in-memory", "paired")}
    split_mb = sum(p.stat().st_size for p in args.data_dir.glob("train-*.npz")) / MB
    streaming, in_memory = runs["streaming"][0], runs["in-memory"][0]
    print(f"cap {args.cap_mb} MB per training child ({streaming['cap_kind']}); training split "
          f"{split_mb:,.0f} MB ({split_mb / args.cap_mb:.1f}x the cap); MLP {args.features}-"
          f"{args.hidden}-{args.hidden}-10, batch {args.batch}; streaming: buffer {args.buffer}, "
          f"{args.workers} DataLoader worker(s), prefetch {args.prefetch}; in-memory: "
          f"{args.prefix_mb} MB prefix")
    print(f"{'':<28}{'steps':>7}{'peak RSS MB':>13}{'worker RSS MB':>15}{'cgroup MB':>11}"
          f"{'samples/s':>11}{'data wait':>11}")
    for name, run in (("streaming, whole split", streaming), ("in-memory, prefix", in_memory)):
        worker = run["peak_rss_worker_mb"] if name.startswith("streaming") and args.workers \
            else float("nan")
        print(f"{name:<28}{run['steps']:>7}{run['peak_rss_mb']:>13.0f}{worker:>15.0f}"
              f"{run['cgroup_peak_mb'] or float('nan'):>11.0f}"
              f"{run['samples_per_second']:>11.0f}{run['data_wait_share']:>11.1%}")
    pairs = [pair for run in runs["paired"] for pair in run["pairs"]]
    ratios = [pair["streaming"][0] / pair["in-memory"][0] for pair in pairs]
    waits = {name: statistics.median(pair[name][1] for pair in pairs)
             for name in ("streaming", "in-memory")}
    print(f"paired blocks ({len(pairs)} pairs of {args.block} steps, alternating, one capped "
          f"process): streaming {_spread([p['streaming'][0] for p in pairs])} samples/s, "
          f"in-memory {_spread([p['in-memory'][0] for p in pairs])}; data wait "
          f"{waits['streaming']:.1%} vs {waits['in-memory']:.1%}")
    print(f"streaming / in-memory samples/s: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}; target >= 0.9)")
    print("peak RSS: ru_maxrss (anonymous memory + mapped file pages touched, shared library "
          "pages included); cgroup: peak charge, page cache included (reclaimable)")
    print(f"total {time.perf_counter() - started:.0f} s")

if __name__ == "__main__":
    main()
