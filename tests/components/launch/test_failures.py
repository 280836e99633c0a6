"""The noise of a failure kept out of the step's log, and its cause named in one line."""

# ruff: noqa: E501 (torch's output, verbatim)

from __future__ import annotations

import json
from pathlib import Path

from sublimate.components.base.elastic_errors import ERROR_FILE_ENV, log_dir, write_failure
from sublimate.components.launch.failures import (
    explain,
    quiet,
    relaunch_note,
    relaunches_section,
    restarts,
)

# What one node printed when its rank 1 raised (torch 2.13, abridged where it repeats itself),
# around the lines that matter: the training's own.
NOISE = """\
[W1204 02:11:41.216770297 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
epoch 1/2 step 22/44 loss 2.2317
[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/me/fails.py", line 6, in <module>
[rank1]:     raise ValueError("bad shape")
[rank1]: ValueError: bad shape
E1204 02:02:56.609000 11207 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 11276) of binary: /venv/bin/python3
[W1204 02:25:03.211192428 TCPStore.cpp:115] [c10d] recvVector failed on SocketImpl(fd=3, addr=[::ffff:127.0.0.1]:33216, remote=[::ffff:127.0.0.1]:54009): Failed to recv, got 0 bytes.
Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f7d8af00b8d in libc10.so)
<omitting python frames>
frame #20: <unknown function> + 0x1098ec (0x7f7d8bb278ec in /lib/x86_64-linux-gnu/libc.so.6)

W1204 02:25:03.443000 13730 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1346] The node 'localhost_13730_0' has failed to send a keep-alive heartbeat to the rendezvous 'job' due to an error of type RendezvousConnectionError.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run
    time.sleep(monitor_interval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 3 got signal: 15

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.api.SignalException: Process 3 got signal: 15
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
sublimate.components.processes.entrypoint FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 11276)
============================================================
E1204 03:06:00.107000 3 torch/distributed/elastic/multiprocessing/api.py:836] Traceback (most recent call last):
E1204 03:06:00.107000 3 torch/distributed/elastic/multiprocessing/api.py:836]   File "/venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", line 200, in join
E1204 03:06:00.107000 3 torch/distributed/elastic/multiprocessing/api.py:836]     raise ProcessExitedException(
E1204 03:06:00.107000 3 torch/distributed/elastic/multiprocessing/api.py:836] torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 1
training finished: 44 steps
"""

# A traceback a program prints and goes on after: the user's own, kept whole.
HANDLED = """\
Traceback (most recent call last):
  File "/home/me/train.py", line 3, in <module>
    load(shard)
OSError: shard 3 unreadable, skipping it
epoch 2/2 step 44/44 loss 2.08
"""


def test_a_failures_noise_is_dropped_and_the_training_lines_kept() -> None:
    assert list(quiet(NOISE.splitlines())) == ["epoch 1/2 step 22/44 loss 2.2317",
                                               "training finished: 44 steps"]


def test_torchs_log_lines_are_known_by_a_whole_source_path_too() -> None:
    # A node whose working folder does not hold torch (a local_netns node runs in /) logs the
    # source as the whole file path: the same noise, dropped the same.
    whole_paths = NOISE.replace(
        " torch/distributed/elastic/",
        " work/.venv/lib/python3.11/site-packages/torch/distributed/elastic/")
    assert whole_paths != NOISE
    assert list(quiet(whole_paths.splitlines())) == ["epoch 1/2 step 22/44 loss 2.2317",
                                                     "training finished: 44 steps"]


# A cancelled agent whose stderr was closing as it printed SignalException's traceback: CPython
# describes the exception field by field instead (seen in CI on a local_netns node).
LOST_STDERR = """\
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 745, in run
    result = self._invoke_run(role)
object address  : 0x7f31aab93ee0
object refcount : 2
object type     : 0x55c208e1cd50
object type name: {name}
object repr     : {name}('Process 3 got signal: 15')
lost sys.stderr
epoch 12/12 step 276/276 loss 0.0160
"""


def test_an_agents_exception_printed_without_stderr_is_dropped_and_another_kept() -> None:
    agents = LOST_STDERR.format(name="SignalException").splitlines()
    assert list(quiet(agents)) == ["epoch 12/12 step 276/276 loss 0.0160"]
    users = LOST_STDERR.format(name="ValueError").splitlines()
    assert list(quiet(users)) == users


# A lost node's agent stopped (SIGTERM) while torch's formatter imported torch._dynamo to log
# its worker's death (torch 2.13, abridged: the frames between, in the same shapes).
STOPPED_WHILE_LOGGING = """\
--- Logging error ---
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 791, in _poll
    self._pc.join(-1)
  File "/venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", line 192, in join
    raise ProcessExitedException(
torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGKILL

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/usr/lib/python3.11/logging/__init__.py", line 1110, in emit
    msg = self.format(record)
  File "/venv/lib/python3.11/site-packages/torch/_logging/_internal.py", line 974, in format
    from torch._dynamo import config
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 23 got signal: 15
Call stack:
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 836, in _poll
    logger.exception(
Message: 'failed (exitcode: %s) local_rank: %s (pid: %s) of fn: %s (start_method: %s)'
Arguments: (-9, 0, 31, 'run_script_path', 'fork')
"""


def test_a_log_call_of_an_agent_stopped_while_it_logged_is_dropped() -> None:
    """Python's "--- Logging error ---" report (the record, the exception, the call stack) of
    an agent whose stop interrupted its logging; another program's logging error passes."""
    kept = ["epoch 1/2 step 22/44 loss 2.2317"]
    assert list(quiet([*kept, *STOPPED_WHILE_LOGGING.splitlines(), *kept])) == kept * 2
    users = STOPPED_WHILE_LOGGING.replace(
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 23 got signal: 15",
        "BrokenPipeError: [Errno 32] Broken pipe").splitlines()
    assert "--- Logging error ---" in list(quiet(users))
    # a report cut short (the process died in it) is not held back for ever
    assert list(quiet(STOPPED_WHILE_LOGGING.splitlines()[:5])) != []


# A node's agent stopped (SIGTERM) at the end of a successful run, inside its own
# multiprocessing bookkeeping: the chain ends in what that raised (torch 2.13, abridged).
STOPPED_IN_ITS_BOOKKEEPING = """\
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/synchronize.py", line 345, in set
    self._cond.notify_all()
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 9 got signal: 15

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 807, in _poll
    self._worker_finished_event.set()
  File "/usr/lib/python3.11/multiprocessing/synchronize.py", line 98, in __exit__
    return self._semlock.__exit__(*args)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: semaphore or lock released too many times
"""


def test_an_agent_stopped_in_its_own_bookkeeping_says_nothing() -> None:
    """The chain holds the agent's SignalException: the stop, not a failure, whatever the
    chain's last exception; a chain without it passes whole."""
    kept = ["training finished: 22 steps in 0.2s"]
    assert list(quiet([*kept, *STOPPED_IN_ITS_BOOKKEEPING.splitlines(), *kept])) == kept * 2
    other = STOPPED_IN_ITS_BOOKKEEPING.replace(
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 9 got signal: 15",
        "KeyError: 'x'").splitlines()
    assert list(quiet(other)) == other


def test_what_the_holder_of_a_killed_node_says_is_dropped() -> None:
    """util-linux's unshare, whose child (a local_netns node's init) a kill ended with SIGKILL,
    cannot die of the same signal and says so: the kill is the launcher's to report."""
    lines = ["epoch 1/2 step 22/44 loss 2.2317",
             "unshare: sigprocmask unblock failed: Invalid argument",
             "unshare: failed to execute python3: No such file or directory"]
    assert list(quiet(lines)) == [lines[0], lines[2]]


def test_a_traceback_that_is_not_a_failure_passes_whole() -> None:
    assert list(quiet(HANDLED.splitlines())) == HANDLED.splitlines()
    # at the end of a stream too (nothing after it decides)
    assert list(quiet(HANDLED.splitlines()[:4])) == HANDLED.splitlines()[:4]


def test_the_first_failing_rank_is_named_with_its_log(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "logs" / "torchx" / "job-1" / "worker" / "1" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("[rank1]: ValueError: bad shape\n")
    for rank, message in ((1, "ValueError: bad shape"), (0, "RuntimeError: peer closed")):
        path = log_dir(tmp_path, str(rank)) / "job-1_9x_y8z7w" / "attempt_0" / "0" / "error.json"
        path.parent.mkdir(parents=True)
        monkeypatch.setenv(ERROR_FILE_ENV, str(path))
        monkeypatch.setenv("RANK", str(rank))
        write_failure(message)
    assert explain(tmp_path, "local_cwd://torchx/job-1", "local_cwd", "FAILED",
                   [("worker", 0), ("worker", 1)]) == (
        f"rank 1 (node1) failed: ValueError: bad shape; its log: {log} "
        "(1 other rank failed after it)")
    # On a cluster the node's log is its pod's: the error file holds the traceback.
    assert explain(tmp_path, "kubernetes://sublimate/job-1", "kubernetes", "FAILED").startswith(
        "rank 1 (node1) failed: ValueError: bad shape; its traceback: "
        f"{log_dir(tmp_path, '1')}/job-1_9x_y8z7w/attempt_0/0/error.json")
    # A job whose processes wrote nothing (killed by a signal): the nodes that failed.
    assert explain(tmp_path, "local_cwd://torchx/job-2", "local_cwd", "FAILED",
                   [("worker", 0)]) == "training job local_cwd://torchx/job-2 ended FAILED: " \
                                       "node0 failed"
    assert explain(tmp_path, "local_cwd://torchx/job-2", "local_cwd", "UNKNOWN") == \
        "training job local_cwd://torchx/job-2 ended UNKNOWN"


def test_a_relaunch_says_where_it_starts(tmp_path: Path) -> None:
    assert relaunch_note(tmp_path) == "from step 0: no checkpoint was committed"
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.json").write_text(json.dumps({"step": 20}))
    assert relaunch_note(tmp_path) == "from the last checkpoint"


def test_a_worker_killed_by_a_signal_is_named_before_the_errors_that_followed(
        tmp_path: Path, monkeypatch) -> None:
    """SIGKILL (from outside, or the out-of-memory killer) leaves no error file: torchrun's own
    line says it, and the peer's connection error comes after it."""
    agent = ("E1204 02:02:56.609000 11207 torch/distributed/elastic/multiprocessing/api.py:1002]"
             " failed (exitcode: -9) local_rank: 0 (pid: 11276) of binary: /venv/bin/python3")
    assert list(quiet([agent], "job-9", 1)) == []
    path = log_dir(tmp_path, "0") / "job-9_9x_y8z7w" / "attempt_0" / "0" / "error.json"
    path.parent.mkdir(parents=True)
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))
    monkeypatch.setenv("RANK", "0")
    write_failure("RuntimeError: Connection reset by peer")
    assert explain(tmp_path, "local_cwd://torchx/job-9", "local_cwd", "FAILED") == (
        "local rank 0 of node1 was killed by SIGKILL (from outside, or out of memory); then "
        f"rank 0 (node0) failed: RuntimeError: Connection reset by peer; its traceback: {path}")
    # A job that torchrun restarted and that then succeeded says what made it restart.
    assert restarts(tmp_path, "local_cwd://torchx/job-9", "local_cwd") == [
        "local rank 0 of node1 was killed by SIGKILL (from outside, or out of memory); torchrun "
        "restarted the workers"]


def test_a_relaunch_is_timed_from_the_lost_attempt_to_training_again(tmp_path: Path) -> None:
    # The last relaunch wrote the summary: its start-up is timed from its own start.
    (tmp_path / "train-summary.json").write_text(
        json.dumps({"launch_to_first_step_seconds": 4.25, "resumed_from_step": 66}))
    section = relaunches_section(
        tmp_path, [{"previous_ended_at": 100.0, "relaunched_at": 100.5}])
    assert section == [{"previous_ended_at": 100.0, "relaunched_at": 100.5,
                        "trained_again_at": 104.75, "resumed_from_step": 66}]
