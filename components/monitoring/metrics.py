"""Prometheus metrics for training processes, and the files that tell users where to scrape them.

Every training process (a torchrun worker, the async parameter server or a trainer) creates one
:class:`WorkerMetrics`. It owns a private registry, labelled ``run`` (the run folder's name),
``rank``, ``node`` and ``role``, and serves it over HTTP:

* bound to ``127.0.0.1`` unless ``SUBLIMATE_METRICS_ADDR`` (or ``--metrics-addr``) says otherwise
  (``0.0.0.0`` in a cluster pod, so Prometheus can reach it);
* on port ``SUBLIMATE_METRICS_PORT`` (default 9440) + local rank, falling back to a port the OS
  picks when that one is taken (simulated nodes on one machine share the base port);
* ``SUBLIMATE_METRICS=off`` turns the server, the DDP timing hook and TensorBoard off (the
  benchmark's "metrics off" case).

The address actually bound is recorded in ``<run_dir>/metrics-endpoints.json`` (see
:func:`record_endpoint`), so tests and users find every rank's endpoint.

The step loop must stay as fast as a hand-written one, so it never calls into this module per
step: it adds ``perf_counter`` differences to plain floats and hands them over in batches
(:meth:`WorkerMetrics.observe_steps`). Short-lived steps (staging, evaluation) do not serve HTTP:
they write JSON (and may push to a Pushgateway, see :func:`record_staging`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sublimate.components.base import run_files

# prometheus-client is imported where it is used: the train launcher imports this module for
# its constants and start-up clock, and every import before the job starts delays it.
if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

DEFAULT_PORT = 9440
ENDPOINTS_FILE = run_files.ENDPOINTS
PHASES = ("data", "compute", "comm")  # how one step's wall time is split
# Wall-clock times (time.time()) the train launcher hands its workers, so that a worker can say
# where the time between the step's start and its first optimizer step went.
LAUNCH_TIME_ENV = "SUBLIMATE_LAUNCH_TIME"  # the launcher process started
SUBMIT_TIME_ENV = "SUBLIMATE_SUBMIT_TIME"  # the launcher submitted the TorchX job
# A torchrun agent that forks its workers hands them its own marks ([[phase, time], ...]).
AGENT_MARKS_ENV = "SUBLIMATE_AGENT_MARKS"


def enabled() -> bool:
    """False when ``SUBLIMATE_METRICS`` is ``off``/``0``/``false`` (for overhead benchmarks)."""
    return os.environ.get("SUBLIMATE_METRICS", "on").lower() not in ("off", "0", "false", "no")


def bind_address(requested: str | None = None) -> str:
    return requested or os.environ.get("SUBLIMATE_METRICS_ADDR") or "127.0.0.1"


def base_port(requested: int | None = None) -> int:
    if requested is not None:
        return requested
    return int(os.environ.get("SUBLIMATE_METRICS_PORT", str(DEFAULT_PORT)))


class _LabelledProcessCollector:
    """prometheus-client's process collector (CPU seconds, RSS, open fds), with our labels.

    The stock collector has no labels; Prometheus would attach pod labels on a cluster, but
    locally several ranks share one machine, so their samples must say which rank they are.
    """

    def __init__(self, labels: dict[str, str]) -> None:
        from prometheus_client.process_collector import ProcessCollector

        self._inner = ProcessCollector(registry=None)
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import Metric

        for family in self._inner.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labelled.add_sample(sample.name, {**sample.labels, **self._labels}, sample.value,
                                    sample.timestamp, sample.exemplar)
            yield labelled


class _GpuCollector:
    """GPU memory from torch.cuda, utilisation from NVML when ``pynvml`` is importable."""

    def __init__(self, labels: dict[str, str], device_index: int) -> None:
        self._labels, self._device = labels, device_index
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:  # no pynvml, no driver access: memory figures only
            self._nvml = None

    def collect(self) -> Iterator[Metric]:
        import torch

        names = sorted(self._labels)
        values = [self._labels[name] for name in names]
        from prometheus_client.core import GaugeMetricFamily

        allocated = GaugeMetricFamily("sublimate_gpu_memory_allocated_bytes",
                                      "GPU memory held by tensors", labels=names)
        allocated.add_metric(values, float(torch.cuda.memory_allocated(self._device)))
        reserved = GaugeMetricFamily("sublimate_gpu_memory_reserved_bytes",
                                     "GPU memory reserved by the caching allocator", labels=names)
        reserved.add_metric(values, float(torch.cuda.memory_reserved(self._device)))
        yield from (allocated, reserved)
        if self._nvml is not None:
            utilisation = GaugeMetricFamily("sublimate_gpu_utilization_ratio",
                                            "GPU busy fraction (NVML)", labels=names)
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            utilisation.add_metric(values, rates.gpu / 100.0)
            yield utilisation


# Per-step recovery (recovery=per-step): gauges of this process's replica group. Counts since
# the process started (a replacement starts from 0), so gauges rather than counters.
REPLICA_GAUGES = {
    "sublimate_replica_groups_participating": "replica groups in the last step's quorum",
    "sublimate_replica_steps_committed": "steps this process committed with its group",
    "sublimate_replica_steps_dropped": "steps dropped and taken again (a peer lost mid-step, "
                                       "or fewer groups alive than the minimum)",
    "sublimate_replica_heals": "times this group took a live peer's state (a replacement: 1)",
}


class WorkerMetrics:
    """One training process's metrics: created once, updated per batch of steps and per epoch."""

    def __init__(self, run: str, rank: str, node: str, role: str = "worker",
                 gpu_index: int | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.labels = {"run": run, "rank": rank, "node": node, "role": role}
        self.registry = CollectorRegistry(auto_describe=True)
        names = list(self.labels)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, names, registry=self.registry).labels(**self.labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=self.registry).labels(**self.labels)

        # Children are bound once here, so an update is one locked float add.
        self.steps = counter("sublimate_train_steps", "optimizer steps done by this process")
        self.samples = counter("sublimate_train_samples", "training examples processed here")
        phase = Counter("sublimate_train_step_seconds", "step wall time by phase",
                        [*names, "phase"], registry=self.registry)
        self.phase_seconds = {p: phase.labels(**self.labels, phase=p) for p in PHASES}
        self.samples_per_second = gauge("sublimate_train_samples_per_second",
                                        "this process's recent throughput")
        self.loss = gauge("sublimate_train_loss", "mean training loss of the last epoch")
        self.learning_rate = gauge("sublimate_train_learning_rate", "current learning rate")
        self.epoch = gauge("sublimate_train_epoch", "epochs completed")
        self.progress = gauge("sublimate_train_progress_ratio", "steps done / total steps")
        self.registry.register(_LabelledProcessCollector(self.labels))
        if gpu_index is not None:
            self.registry.register(_GpuCollector(self.labels, gpu_index))
        self._step_ratio: Any = None  # created by observe_step_ratio
        self._replicas: dict[str, Any] | None = None  # created by observe_replica_groups
        self._straggler: Any = None
        self.address: str | None = None
        self._server: Any = None
        self._last_observe = time.perf_counter()

    def observe_steps(self, steps: int, samples: int, data_s: float, compute_s: float,
                      comm_s: float, total_steps: int, done_steps: int) -> None:
        """Fold a batch of steps into the counters (called every few steps, not every step)."""
        now = time.perf_counter()
        self.steps.inc(steps)
        self.samples.inc(samples)
        for phase, seconds in zip(PHASES, (data_s, compute_s, comm_s), strict=True):
            self.phase_seconds[phase].inc(max(seconds, 0.0))
        self.samples_per_second.set(samples / max(now - self._last_observe, 1e-9))
        self.progress.set(done_steps / max(total_steps, 1))
        self._last_observe = now

    def observe_epoch(self, epoch: int, loss: float | None, learning_rate: float | None) -> None:
        self.epoch.set(epoch)
        if loss is not None:
            self.loss.set(loss)
        if learning_rate is not None:
            self.learning_rate.set(learning_rate)

    def observe_startup(self, total: float, phases: dict[str, float]) -> None:
        """The launch-to-first-step time and its phases (created here: they exist once known)."""
        from prometheus_client import Gauge

        names = list(self.labels)
        Gauge(STARTUP_GAUGE, "seconds from the train step's start to this process's first "
              "optimizer step", names, registry=self.registry).labels(**self.labels).set(total)
        phase = Gauge("sublimate_startup_phase_seconds", "launch-to-first-step time by phase",
                      [*names, "phase"], registry=self.registry)
        for name, seconds in phases.items():
            phase.labels(**self.labels, phase=name).set(seconds)

    def observe_replica_groups(self, participants: int, committed: int, dropped: int,
                               heals: int) -> None:
        """Per-step recovery's figures for this process's group (created on the first call:
        a job that restarts as a whole does not expose them): the groups in the last step's
        quorum, and the steps this process committed, dropped (a peer lost mid-step, or too
        few groups) and the times its group took a live peer's state."""
        if self._replicas is None:
            from prometheus_client import Gauge

            names = list(self.labels)
            self._replicas = {name: Gauge(name, doc, names, registry=self.registry)
                              .labels(**self.labels) for name, doc in REPLICA_GAUGES.items()}
        for name, value in zip(REPLICA_GAUGES, (participants, committed, dropped, heals),
                               strict=True):
            self._replicas[name].set(value)

    def observe_step_ratio(self, ratio: float, straggler: bool) -> None:
        """This rank's own work per step against the median rank's, and whether that makes it
        a straggler (see :mod:`sublimate.components.monitoring.stragglers`), once per epoch.

        Each rank publishes its own figures, on its own endpoint: the series then carry the
        rank's and node's labels like every other metric, and they stop changing when that
        rank stops, instead of rank 0 speaking for peers it may have lost touch with. Every
        rank can: the epoch's collective hands every rank all ranks' timings. The gauges are
        created by the first call, so a process that never judges (async's ps, metrics from
        an older loop) does not expose a misleading 0.
        """
        if self._step_ratio is None:
            from prometheus_client import Gauge

            names = list(self.labels)
            self._step_ratio = Gauge(
                STEP_RATIO_GAUGE, "this rank's own work (data + compute) per step / the median "
                "rank's, last epoch", names, registry=self.registry).labels(**self.labels)
            self._straggler = Gauge(
                STRAGGLER_GAUGE, "1 when this rank was flagged as a straggler in the last "
                "epoch", names, registry=self.registry).labels(**self.labels)
        self._step_ratio.set(ratio)
        self._straggler.set(1.0 if straggler else 0.0)

    def serve(self, addr: str | None = None, port: int | None = None,
              local_rank: int = 0) -> str:
        """Start the HTTP endpoint; returns ``host:port`` as reachable by a scraper."""
        host = bind_address(addr)
        wanted = base_port(port)
        try:
            server = _start_http_server(wanted + local_rank if wanted else 0, host,
                                        self.registry)
        except OSError:  # taken (another simulated node on this host): let the OS choose
            server = _start_http_server(0, host, self.registry)
        self._server = server
        reachable = _reachable_host(host)
        self.address = f"{reachable}:{server.server_port}"
        return self.address

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# How often the endpoint's serving thread checks for a shutdown request. prometheus-client's
# own start_http_server uses the standard library's 0.5 s, which close() then waits out at the
# end of every training process (the end of the train step); 20 idle wake-ups a second cost
# nothing measurable.
SERVER_POLL_SECONDS = 0.05


def _start_http_server(port: int, addr: str, registry: CollectorRegistry) -> Any:
    """prometheus-client's ``start_http_server``, serving with a short shutdown poll."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # a scrape is not a line for the training log

    family, _, _, _, sockaddr = socket.getaddrinfo(  # IPv6 addresses bind too
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(str(sockaddr[0]), port, make_wsgi_app(registry), Server,
                         handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SERVER_POLL_SECONDS},
                     name="sublimate-metrics", daemon=True).start()
    return server


def _reachable_host(bound: str) -> str:
    if bound not in ("0.0.0.0", "::", ""):
        return bound
    try:  # the pod IP on Kubernetes; what other hosts can dial
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def record_endpoint(run_dir: Path, key: str, address: str, labels: dict[str, str]) -> None:
    """Add this process's endpoint to ``run_dir/metrics-endpoints.json`` (read-modify-write).

    Ranks start together, so the update is serialised with a lock file and the JSON is replaced
    atomically: readers never see a half-written file.
    """
    path = Path(run_dir) / ENDPOINTS_FILE
    with _locked(path):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            document = {}
        document.setdefault("run", labels.get("run", Path(run_dir).name))
        endpoints = document.setdefault("endpoints", {})
        endpoints[key] = {"address": address, "url": f"http://{address}/metrics",
                          "pid": os.getpid(), "host": socket.gethostname(),
                          "started_at": round(time.time(), 3), **labels}
        document["endpoints"] = dict(sorted(endpoints.items()))
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(document, indent=2) + "\n")
        os.replace(temporary, path)


def read_endpoints(run_dir: Path) -> dict[str, dict[str, Any]]:
    """``{key: {"address": "host:port", "url": ..., "rank": ..., ...}}``; empty if none yet."""
    try:
        return json.loads((Path(run_dir) / ENDPOINTS_FILE).read_text())["endpoints"]
    except (OSError, ValueError, KeyError):
        return {}


def scrape(url: str, timeout: float = 2.0) -> dict[str, float]:
    """Fetch one endpoint; returns ``{"name{label=value,...}": value}`` (handy in notebooks)."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                              if k not in ("run", "node", "role"))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def serve_worker(run_dir: Path, rank: str, node: str, role: str = "worker",
                 local_rank: int = 0, gpu_index: int | None = None, addr: str | None = None,
                 port: int | None = None, key: str | None = None) -> WorkerMetrics | None:
    """Create, serve and record one process's metrics; ``None`` when metrics are off.

    A failure to serve is reported and ignored: monitoring must never fail a training run.
    """
    if not enabled():
        return None
    metrics = WorkerMetrics(Path(run_dir).name, rank, node, role, gpu_index)
    try:
        address = metrics.serve(addr, port, local_rank)
        record_endpoint(run_dir, key or rank, address, metrics.labels)
    except OSError as error:
        print(f"metrics: not served ({error})", flush=True)
    return metrics


def record_staging(path: Path, *, dataset: str, bytes_transferred: int, files_transferred: int,
                   files_skipped: int = 0, seconds: float = 0.0) -> dict[str, Any]:
    """Staging's metrics, for the stage-data step to call once at its end.

    Staging is short-lived, so it is not scraped: this writes the figures to ``path`` (JSON,
    e.g. ``<dataset-dir>/../<id>.staging.json``) and, when ``SUBLIMATE_PUSHGATEWAY`` names a
    Prometheus Pushgateway (``host:port``), pushes them there under job ``sublimate-stage-data``.
    Returns the figures.
    """
    figures: dict[str, Any] = {"dataset": dataset, "bytes": int(bytes_transferred),
               "files": int(files_transferred), "files_skipped": int(files_skipped),
               "seconds": round(seconds, 3),
               "bytes_per_second": round(bytes_transferred / seconds, 1) if seconds > 0 else 0.0}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2) + "\n")
    gateway = os.environ.get("SUBLIMATE_PUSHGATEWAY")
    if gateway:
        from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

        registry = CollectorRegistry()
        for name, value in figures.items():
            if name != "dataset":
                Gauge(f"sublimate_staging_{name}", f"stage-data: {name}", ["dataset"],
                      registry=registry).labels(dataset=dataset).set(float(value))
        with contextlib.suppress(OSError):  # an unreachable gateway must not fail staging
            push_to_gateway(gateway, job="sublimate-stage-data", registry=registry)
    return figures


class StepTimes:
    """Per-step phase seconds, accumulated by the step loop with plain float adds.

    ``data``/``compute``/``comm`` are the window since the last :meth:`flush`; ``flush`` moves
    the window into the epoch totals and into Prometheus. Communication that happens inside
    ``backward()`` (DDP's all-reduce, measured by a comm hook) is passed to ``flush`` and moved
    from compute to comm.
    """

    __slots__ = ("comm", "compute", "data", "epoch", "steps")

    def __init__(self) -> None:
        self.data = self.compute = self.comm = 0.0
        self.steps = 0
        self.epoch = [0.0, 0.0, 0.0]

    def flush(self, metrics: WorkerMetrics | None, hidden_comm: float, samples_per_step: int,
              done_steps: int, total_steps: int) -> None:
        self.compute -= hidden_comm
        self.comm += hidden_comm
        for index, seconds in enumerate((self.data, self.compute, self.comm)):
            self.epoch[index] += seconds
        if metrics is not None and self.steps:
            metrics.observe_steps(self.steps, self.steps * samples_per_step, self.data,
                                  self.compute, self.comm, total_steps, done_steps)
        self.data = self.compute = self.comm = 0.0
        self.steps = 0

    def take_epoch(self) -> tuple[float, float, float]:
        data, compute, comm = self.epoch
        self.epoch = [0.0, 0.0, 0.0]
        return data, compute, comm


def time_split(data_s: float, compute_s: float, comm_s: float) -> dict[str, float]:
    """Fractions of the step time per phase (for the live line and the report)."""
    total = data_s + compute_s + comm_s
    if total <= 0:
        return dict.fromkeys(PHASES, 0.0)
    return {p: s / total for p, s in zip(PHASES, (data_s, compute_s, comm_s), strict=True)}


def format_split(split: dict[str, float]) -> str:
    """``compute 71% comm 22% data 7%``: the order users read first."""
    return " ".join(f"{p} {split[p] * 100:.0f}%" for p in ("compute", "comm", "data"))


def iter_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        with contextlib.suppress(ValueError):  # a line cut short by a crash is skipped
            records.append(json.loads(line))
    return records


# --- bytes on the wire ----------------------------------------------------------------------------

# The kernel's per-interface counters of the *network namespace* of the reading process: in a
# pod, the pod's interfaces; on a local_netns node, the node's veth; on local_cwd, the host's.
NET_DEV = "/proc/self/net/dev"
LOOPBACK = "lo"


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``{interface: (received bytes, sent bytes)}`` from the text of ``/proc/net/dev``.

    After two header lines, each line is ``name: rx_bytes rx_packets errs drop fifo frame
    compressed multicast tx_bytes ...``: sent bytes are the 9th number after the colon.
    """
    counters = {}
    for line in text.splitlines()[2:]:
        name, separator, numbers = line.partition(":")
        fields = numbers.split()
        if separator and len(fields) >= 9:
            counters[name.strip()] = (int(fields[0]), int(fields[8]))
    return counters


def network_bytes_sent(path: str = NET_DEV) -> int | None:
    """Bytes sent so far by every interface of this process's network namespace except
    loopback (traffic between processes of one namespace never leaves it); None where the file
    cannot be read (not Linux)."""
    try:
        with open(path, encoding="ascii") as counters:
            text = counters.read()
    except OSError:
        return None
    return sum(sent for name, (_, sent) in parse_net_dev(text).items() if name != LOOPBACK)


class NetworkCounter:
    """Bytes this process's namespace sent since the counter was created (one small file read
    per call): created when a training process starts recording, read once per epoch."""

    def __init__(self, path: str = NET_DEV) -> None:
        self.path = path
        self.start = network_bytes_sent(path)

    def sent(self) -> int | None:
        now = network_bytes_sent(self.path)
        if now is None or self.start is None:
            return None
        # an interface that went away (a veth deleted) takes its count with it: never negative
        return max(now - self.start, 0)


# --- start-up: from the train step's start to a process's first optimizer step -------------------

STARTUP_GAUGE = "sublimate_launch_to_first_step_seconds"
# Straggler detection's per-rank figures (observe_step_ratio).
STEP_RATIO_GAUGE = "sublimate_step_time_ratio_to_median"
STRAGGLER_GAUGE = "sublimate_straggler"


def process_start_time() -> float:
    """Wall-clock time at which this process was created (fork or exec), to 10 ms.

    Linux keeps a process's creation time in ``/proc/self/stat`` (field 22, clock ticks since
    boot); it includes the interpreter's own start-up, which no line of Python can see. Other
    systems get "now", so the interpreter's share counts in the phase before.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # the name in (...) may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def _env_time(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def _env_marks(name: str) -> list[tuple[str, float]]:
    try:
        return [(str(phase), float(at)) for phase, at in json.loads(os.environ[name])]
    except (KeyError, ValueError, TypeError):
        return []


class StartupClock:
    """Where the time between the launcher's start and this process's first step went.

    Phases are the gaps between consecutive marks, named by the mark that ends them, so they
    sum to the total. The first marks come from the environment: the launcher's
    (:data:`LAUNCH_TIME_ENV`, :data:`SUBMIT_TIME_ENV`) and, for a worker forked by its torchrun
    agent, the agent's own (:data:`AGENT_MARKS_ENV`: its imports, its rendezvous), then this
    process's creation time; run without the launcher, the clock starts with the first process
    there is a time for. Times are wall clock because they cross processes (and, on a cluster,
    machines whose clocks NTP keeps a few milliseconds apart). After a torchrun restart the
    figures are the restarted attempt's, still counted from the launcher's start.
    """

    def __init__(self, started: float, spawned_by: str = "agents") -> None:
        """``started``: when this process's own code began (before its heavy imports);
        ``spawned_by``: the name of the phase that ends with this process's creation
        (torchrun's ``agents``; ``scheduler`` where TorchX starts the process itself; ``fork``
        after a forking agent's own phases)."""
        launched, submitted = _env_time(LAUNCH_TIME_ENV), _env_time(SUBMIT_TIME_ENV)
        agent = _env_marks(AGENT_MARKS_ENV)
        marks: list[tuple[str, float]] = []
        if launched is not None and submitted is not None:
            marks.append(("launcher", submitted))
        if agent:
            marks += agent
            spawned_by = "fork"
        marks += [(spawned_by, min(process_start_time(), started)), ("interpreter", started)]
        if launched is not None:
            self.origin = launched
        else:  # run by hand: from the first process start known
            self.origin = marks.pop(0)[1]
        self.marks = marks

    def mark(self, phase: str, at: float | None = None) -> None:
        """End ``phase`` now, or at wall-clock time ``at`` (an event another thread saw)."""
        self.marks.append((phase, time.time() if at is None else at))

    def total(self) -> float:
        return round(self._ends()[-1][1] - self.origin, 3) if self.marks else 0.0

    def phases(self) -> dict[str, float]:
        phases, previous = {}, self.origin
        for name, at in self._ends():
            phases[name] = round(at - previous, 3)
            previous = at
        return phases

    def _ends(self) -> list[tuple[str, float]]:
        # Process creation times are whole clock ticks (10 ms), so one can read a little before
        # the mark preceding it; a phase is never negative, and the phases still sum to total.
        ends, latest = [], self.origin
        for name, at in self.marks:
            latest = max(latest, at)
            ends.append((name, latest))
        return ends


def format_startup(total: float, phases: dict[str, float]) -> str:
    """``launch to first step 4.1s (launcher 0.6s, agents 1.9s, ...)``: the train log's line."""
    parts = ", ".join(f"{name.replace('_', ' ')} {seconds:.1f}s"
                      for name, seconds in phases.items())
    return f"launch to first step {total:.1f}s ({parts})"
