"""``rendezvous=etcd-v2``: torchrun's dynamic rendezvous on an etcd server that the launcher
starts beside a local job and stops, its data removed, however the job ends. Real processes:
Debian's ``etcd`` and python-etcd, which CI installs (a missing one fails there, via require)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import urllib.request
from pathlib import Path

import pytest
import torch

from sublimate.components.base import run_files
from sublimate.components.launch import etcd_server
from tests.components.launch.test_netns_scheduler import netns
from tests.components.launch.test_netns_training import finish_on_two_without
from tests.components.launch.test_per_step_recovery import _leftovers
from tests.conftest import (
    require,
    results_folder,
    run_cli,
)

__all__ = ["netns"]

ONE_EPOCH = ["-p", "epochs=1"]


@pytest.fixture(autouse=True)
def _etcd() -> None:
    require(shutil.which(etcd_server.BINARY), "no etcd on PATH (apt-get install etcd-server)")
    require(importlib.util.find_spec("etcd"), "python-etcd is not installed "
            "(pip install -e '.[test]' -c constraints.txt)")


def _model(home: Path) -> dict[str, torch.Tensor]:
    return torch.load(results_folder(home) / run_files.MODEL, weights_only=False)["state_dict"]


def _assert_nothing_left(home: Path) -> None:
    results = results_folder(home)
    assert not (results / run_files.ETCD).exists(), "the etcd server's data was left behind"
    assert not _leftovers(home), f"left running: {_leftovers(home)}"


def test_two_nodes_on_etcd_train_the_static_rendezvous_model_bit_for_bit(
        tmp_path: Path) -> None:
    etcd = run_cli("run", *ONE_EPOCH, "-p", "rendezvous=etcd-v2", home=tmp_path / "etcd")
    assert etcd.returncode == 0, etcd.stdout[-3000:] + etcd.stderr[-3000:]
    static = run_cli("run", *ONE_EPOCH, "-p", "rendezvous=static", home=tmp_path / "static")
    assert static.returncode == 0, static.stdout[-3000:] + static.stderr[-3000:]
    # The server ran (its log is kept with the job's), and went with its data.
    log = results_folder(tmp_path / "etcd") / run_files.LOGS / "etcd.log"
    assert log.is_file() and log.stat().st_size, "no etcd server ran"
    _assert_nothing_left(tmp_path / "etcd")
    # Only how the nodes met differs: same seed, data order and world, hence the same model.
    on_etcd, on_static = _model(tmp_path / "etcd"), _model(tmp_path / "static")
    assert on_etcd.keys() == on_static.keys()
    for name, tensor in on_static.items():
        assert torch.equal(tensor, on_etcd[name]), name


def test_a_failed_job_takes_its_etcd_server_and_data_with_it(tmp_path: Path) -> None:
    # Rank 1 is killed at step 3; with a fixed number of nodes nothing restarts: the job fails.
    done = run_cli("run", *ONE_EPOCH, "-p", "rendezvous=etcd-v2", "--env",
                   "SUBLIMATE_FAIL_AT_STEP=3", "--env", "SUBLIMATE_FAIL_RANK=1", home=tmp_path)
    assert done.returncode != 0, done.stdout[-3000:]
    assert (results_folder(tmp_path) / run_files.LOGS / "etcd.log").is_file()
    _assert_nothing_left(tmp_path)


def test_the_server_answers_on_its_port_and_stops_with_its_data(tmp_path: Path) -> None:
    server = etcd_server.EtcdServer(tmp_path / "etcd", tmp_path / "etcd.log")
    with server:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/version", timeout=5) as r:
            assert json.loads(r.read())["etcdserver"]
        assert (tmp_path / "etcd").is_dir()
    assert server.process is not None and server.process.returncode is not None
    assert not (tmp_path / "etcd").exists()


def test_a_missing_prerequisite_is_one_line_saying_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert etcd_server.missing_prerequisite(serve=True) == etcd_server.MISSING_BINARY
    assert "apt-get install etcd-server" in etcd_server.MISSING_BINARY
    assert etcd_server.missing_prerequisite(serve=False) is None  # the user's server: no binary
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert etcd_server.missing_prerequisite(serve=False) == etcd_server.MISSING_CLIENT
    assert "pip install 'sublimate[etcd]'" in etcd_server.MISSING_CLIENT


@pytest.mark.usefixtures("netns")
def test_an_elastic_job_on_etcd_goes_on_without_node0(tmp_path: Path) -> None:
    """nodes=2:3 on local_netns, node 0 killed after the first checkpoint. On c10d node 0 hosts
    the rendezvous's store, so the others cannot meet again and the job is relaunched
    (test_netns_training); on etcd the state outlives any node: the two that remain meet as a
    world of 2 and finish, with no relaunch."""
    home = tmp_path / "home"
    output = finish_on_two_without(home, 0, "-p", "rendezvous=etcd-v2")
    assert "relaunching" not in output, output[-3000:]
    _assert_nothing_left(home)
