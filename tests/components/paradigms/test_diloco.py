"""DiLoCo (torchft's, driven at sublimate's round boundaries): the outer step against the
paper's equations with exact numbers, a discarded round that leaves every tensor as it was
(an outer codec's error-feedback residual included), Streaming DiLoCo's fragments taking turns,
and a checkpoint that resumes bit for bit, with each outer codec. Real gloo groups of two
processes; the replica groups are stood in for by :class:`VetoingReplicas`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.base.ports import free_port
from sublimate.components.base.settings import BY_NAME, SettingError, check
from sublimate.components.paradigms import flat_parameters
from sublimate.components.paradigms.diloco import DiLoCo, model_fragments, outer_codec_name
from tests.ranks import run_ranks

from .test_per_step_rounds import VetoingReplicas, _local_step

WORLD = 2


def _join(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)


def _outer_steps(rank: int, port: int, results: Path) -> None:
    _join(rank, port)
    for wire in WIRES:
        _outer_steps_on(rank, results, wire)
    dist.destroy_process_group()


WIRES = ("float32", "bfloat16")


def _outer_steps_on(rank: int, results: Path, wire: str) -> None:
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    paradigm = DiLoCo(model, inner, {"sync_period": 4, "outer_gradient_dtype": wire})
    weights = []
    # The inner steps' outcome is set directly: round 1 ends with the workers at 0.5 and 0.0,
    # round 2 at (global - 0.1) and (global - 0.2).
    for round_end, local in ((4, lambda g: 0.5 - 0.5 * rank), (8, lambda g: g - 0.1 * (rank + 1))):
        with torch.no_grad():
            model.weight.fill_(local(paradigm.global_parameters[0].item()))
        paradigm.after_step(round_end)
        weights.append((model.weight.item(), flat_parameters(paradigm.result_model()).item()))
    # finish() after 2 more steps: the partial round is a plain average of the workers' models
    # (global + 0.25 and global + 0.5: their mean, global + 0.375), and the outer momentum
    # stays the full rounds'
    momentum = paradigm.state_dict()["outer_optimizers"][0]["state"][0]["momentum_buffer"]
    with torch.no_grad():
        model.weight.fill_(paradigm.global_parameters[0].item() + 0.25 * (rank + 1))
    paradigm.finish(10)
    weights.append((model.weight.item(), flat_parameters(paradigm.result_model()).item()))
    assert torch.equal(momentum, paradigm.state_dict()["outer_optimizers"][0]["state"][0][
        "momentum_buffer"])
    torch.save({"weights": weights, "rounds": paradigm.rounds,
                "ops": paradigm.communication_ops, "sent": paradigm.traffic.payload_bytes},
               results / f"{wire}-rank-{rank}.pt")


def test_the_outer_step_is_the_papers_nesterov_step_on_the_mean_pseudo_gradient(
        tmp_path: Path) -> None:
    run_ranks(_outer_steps, (free_port(), tmp_path), WORLD)
    for wire in WIRES:
        _check_outer_steps(tmp_path, wire)


def _check_outer_steps(tmp_path: Path, wire: str) -> None:
    # Douillard et al., Algorithm 1 with outer SGD, Nesterov momentum mu = 0.9, lr 0.7:
    #   delta = theta - mean(theta_i);  m = mu m + delta;  theta -= lr (delta + mu m)
    # round 1: theta 1.0, workers 0.5 and 0.0: delta 0.75, m 0.75,
    #          theta = 1 - 0.7 (0.75 + 0.675) = 0.0025
    # round 2: workers 0.0025 - 0.1 and - 0.2: delta 0.15, m = 0.675 + 0.15 = 0.825,
    #          theta = 0.0025 - 0.7 (0.15 + 0.7425) = -0.62225
    # (every delta is exact in bfloat16 too: 0.75 and 0.15 rounded to bfloat16 are 0.75 and
    # 0.150390625, which the bfloat16 case's expected value accounts for)
    delta2 = 0.15 if wire == "float32" else float(torch.tensor(0.15).to(torch.bfloat16))
    expected = [0.0025, 0.0025 - 0.7 * (delta2 + 0.9 * (0.9 * 0.75 + delta2))]
    expected.append(expected[1] + 0.375)
    for rank in range(WORLD):
        record = torch.load(tmp_path / f"{wire}-rank-{rank}.pt")
        assert record["rounds"] == record["ops"] == 3
        # one weight per round, in the wire's type: 4 bytes in float32, 2 in bfloat16
        assert record["sent"] == 3 * (4 if wire == "float32" else 2)
        for (local, result), theta in zip(record["weights"], expected, strict=True):
            # every worker starts the next round at the new global weights, the result (to
            # float32's rounding: the model's type)
            assert local == pytest.approx(theta, abs=1e-6)
            assert result == local


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3))


def _snapshot(model: nn.Module, paradigm: DiLoCo) -> dict[str, Any]:
    state = paradigm.state_dict()
    return {"parameters": flat_parameters(model),
            "buffers": [b.clone() for b in model.buffers()],
            "global": [w.clone() for w in state["global_parameters"]],
            "momentum": [[s["momentum_buffer"].clone() for s in o["state"].values()]
                         for o in state["outer_optimizers"]],
            "rounds": state["rounds"], "ops": state["communication_ops"],
            "residuals": [r.clone() for r in state["outer_residuals"]]}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (torch.equal(a["parameters"], b["parameters"])
            and all(torch.equal(x, y) for x, y in zip(a["buffers"], b["buffers"], strict=True))
            and all(torch.equal(x, y) for x, y in zip(a["global"], b["global"], strict=True))
            and all(torch.equal(x, y) for xs, ys in zip(a["momentum"], b["momentum"], strict=True)
                    for x, y in zip(xs, ys, strict=True))
            and a["rounds"] == b["rounds"] and a["ops"] == b["ops"]
            and len(a["residuals"]) == len(b["residuals"])
            and all(torch.equal(x, y) for x, y in zip(a["residuals"], b["residuals"],
                                                      strict=True)))


SYNC_PERIOD = 4
ROUNDS = 4


# (fragments, outer codec): int8 keeps a residual per fragment, which a refused round restores
CASES = ((1, "none"), (2, "none"), (2, "int8"))


def _rounds(rank: int, port: int, results: Path) -> None:
    _join(rank, port)
    for fragments, codec in CASES:
        _rounds_of(rank, results, fragments, codec)
    dist.destroy_process_group()


def _rounds_of(rank: int, results: Path, fragments: int, codec: str) -> None:
    config = {"sync_period": SYNC_PERIOD, "fragments": fragments, "outer_codec": codec}
    period = SYNC_PERIOD // fragments
    record: dict[str, Any] = {}
    # The same rounds three ways: the restart mode's, per-step with every round committed, and
    # per-step with round 3 refused (after it, everything must be as it was before it).
    for name, replicas in (("restart", None), ("committed", VetoingReplicas(set())),
                           ("vetoed", VetoingReplicas({3}))):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        paradigm = DiLoCo(model, optimizer, config, replicas)
        globals_by_round = []
        for step in range(1, ROUNDS * period + 1):
            _local_step(model, optimizer, rank, step)
            vetoed_next = replicas is not None and step % period == 0 \
                and replicas.rounds + 1 in replicas.vetoed
            before = _snapshot(model, paradigm) if vetoed_next else None
            paradigm.after_step(step)
            if before is not None:
                record.setdefault(name, {})["unchanged"] = _same(before, _snapshot(model,
                                                                                   paradigm))
            if step % period == 0:
                globals_by_round.append([w.clone() for w in paradigm.global_parameters])
        record.setdefault(name, {}).update(final=_snapshot(model, paradigm),
                                           globals_by_round=globals_by_round)
    torch.save(record, results / f"{fragments}-{codec}-rank-{rank}.pt")


def test_a_discarded_round_leaves_every_tensor_as_it_was_and_a_committed_one_is_the_restart_modes(
        tmp_path: Path) -> None:
    run_ranks(_rounds, (free_port(), tmp_path), WORLD)
    for fragments, codec in CASES:  # 2 fragments: Streaming DiLoCo
        _check_rounds(tmp_path, fragments, codec)


def _check_rounds(tmp_path: Path, fragments: int, codec: str) -> None:
    records = [torch.load(tmp_path / f"{fragments}-{codec}-rank-{rank}.pt")
               for rank in range(WORLD)]
    for record in records:
        # int8 keeps one residual per fragment, and some of it is not zero (what it dropped)
        residuals = record["vetoed"]["final"]["residuals"]
        assert len(residuals) == (fragments if codec == "int8" else 0)
        assert all(residual.abs().sum() > 0 for residual in residuals)
        restart, committed = record["restart"]["final"], record["committed"]["final"]
        assert _same(restart, committed)  # per-step, every round committed: bit for bit
        assert restart["rounds"] == ROUNDS
        # the refused round: local weights, buffers, global weights, outer momentum, the
        # count of rounds exactly as before it; the next rounds committed
        assert record["vetoed"]["unchanged"]
        assert record["vetoed"]["final"]["rounds"] == ROUNDS - 1
        assert not torch.equal(record["vetoed"]["final"]["parameters"],
                               committed["parameters"])
        # Streaming DiLoCo: a round moves only the fragment whose turn it is
        rounds = record["restart"]["globals_by_round"]
        for index in range(1, ROUNDS):
            moved = {number for number, (a, b) in enumerate(zip(rounds[index - 1],
                                                                 rounds[index], strict=True))
                     if not torch.equal(a, b)}
            # fragment 0: the first Linear and the BatchNorm (parameters 0-3), 1: the last
            turn = set(range(6)) if fragments == 1 else {4, 5} if index % 2 else {0, 1, 2, 3}
            if codec == "none":
                assert moved == turn, (index, moved)
            else:  # int8 may send a tensor as zeros (all below half its block's step) while
                # its residual grows, and a tensor the outer momentum has not reached stays
                assert moved and moved <= turn, (index, moved)
    # every worker holds the same global weights
    for a, b in zip(records[0]["restart"]["final"]["global"],
                    records[1]["restart"]["final"]["global"], strict=True):
        assert torch.equal(a, b)


# outer-gradient-dtype bfloat16 (outer-codec bf16), and the codecs with error feedback
RESUMED = {"bf16": {"outer_gradient_dtype": "bfloat16"}, "int8": {"outer_codec": "int8"},
           "topk": {"outer_codec": "topk", "outer_codec_topk": 0.2}}


def _resume(rank: int, port: int, results: Path) -> None:
    _join(rank, port)
    for name, codec in RESUMED.items():
        _resume_with(rank, results / name, codec)
    dist.destroy_process_group()


def _resume_with(rank: int, results: Path, codec: dict[str, Any]) -> None:
    results.mkdir(exist_ok=True)
    config = {"sync_period": SYNC_PERIOD, "fragments": 2, **codec}

    def build() -> tuple[nn.Module, torch.optim.Optimizer, DiLoCo]:
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return model, optimizer, DiLoCo(model, optimizer, config)

    model, optimizer, paradigm = build()
    saved: dict[str, Any] = {}
    for step in range(1, 15):
        _local_step(model, optimizer, rank, step)
        paradigm.after_step(step)
        if step == 7:  # mid-round: a checkpoint, through the file format's torch.save
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "paradigm": paradigm.state_dict()}, results / f"ckpt-{rank}.pt")
    paradigm.finish(14)
    saved["straight"] = flat_parameters(paradigm.result_model())
    model, optimizer, paradigm = build()
    state = torch.load(results / f"ckpt-{rank}.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    paradigm.load_state_dict(state["paradigm"])
    for step in range(8, 15):
        _local_step(model, optimizer, rank, step)
        paradigm.after_step(step)
    paradigm.finish(14)
    saved["resumed"] = flat_parameters(paradigm.result_model())
    saved["residuals"] = paradigm.state_dict()["outer_residuals"]
    torch.save(saved, results / f"rank-{rank}.pt")


def test_a_checkpoint_mid_round_resumes_bit_for_bit(tmp_path: Path) -> None:
    run_ranks(_resume, (free_port(), tmp_path), WORLD)
    for name in RESUMED:
        for rank in range(WORLD):
            saved = torch.load(tmp_path / name / f"rank-{rank}.pt")
            assert torch.equal(saved["straight"], saved["resumed"]), name
            # the codecs with error feedback carried a residual through the checkpoint
            assert len(saved["residuals"]) == (0 if name == "bf16" else 2)


def _delayed_outer_step(rank: int, port: int, results: Path) -> None:
    _join(rank, port)
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    paradigm = DiLoCo(model, inner, {"sync_period": 4, "fragment_delay": 1,
                                     "fragment_update_alpha": 0.5})
    begun = results / "begun"
    for step in range(1, 5):
        # the inner steps' outcome set directly: the workers at 0.5 and 0.0 when the round
        # begins (step 3), one step further (- 0.1) when it ends (step 4)
        with torch.no_grad():
            model.weight.fill_(0.5 - 0.5 * rank if step < 4 else 0.4 - 0.5 * rank)
        if step == 3 and rank == 1:  # rank 1 joins the round only once rank 0 is past its
            while not begun.exists():  # beginning: a begin that waited would never end
                time.sleep(0.01)
        paradigm.after_step(step)
        if step == 3:
            in_flight = paradigm.in_flight is not None
            if rank == 0:
                begun.touch()
    torch.save({"local": model.weight.item(), "global": paradigm.global_parameters[0].item(),
                "in_flight": in_flight, "rounds": paradigm.rounds,
                "synced_step": paradigm.synced_step}, results / f"delayed-rank-{rank}.pt")
    dist.destroy_process_group()


def test_a_delayed_round_sends_at_its_beginning_and_mixes_the_steps_taken_meanwhile(
        tmp_path: Path) -> None:
    run_ranks(_delayed_outer_step, (free_port(), tmp_path), WORLD)
    # the pseudo-gradient is the weights' at the round's beginning: delta = mean(1 - 0.5,
    # 1 - 0) = 0.75, the outer step as above: theta = 1 - 0.7 (0.75 + 0.9 x 0.75) = 0.0025;
    # then each worker's fragment is lerp(theta, its weights at the end, alpha 0.5)
    theta = 0.0025
    for rank in range(WORLD):
        record = torch.load(tmp_path / f"delayed-rank-{rank}.pt")
        assert record["in_flight"] and record["rounds"] == 1 and record["synced_step"] == 3
        assert record["global"] == pytest.approx(theta, abs=1e-6)
        local_at_end = 0.4 - 0.5 * rank
        assert record["local"] == pytest.approx(theta + 0.5 * (local_at_end - theta), abs=1e-6)


DELAYED = {"sync_period": SYNC_PERIOD, "fragments": 2, "fragment_delay": 1,
           "fragment_update_alpha": 0.5, "outer_codec": "int8"}


def _delayed_rounds(rank: int, port: int, results: Path) -> None:
    _join(rank, port)
    period = SYNC_PERIOD // 2
    record: dict[str, Any] = {}
    # restart mode, per-step with every round committed, per-step with round 3 refused: the
    # refused round must leave the local weights as they were when it ended (the steps taken
    # meanwhile kept) and the paradigm's state as it was when it began
    for name, replicas in (("restart", None), ("committed", VetoingReplicas(set())),
                           ("vetoed", VetoingReplicas({3}))):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        paradigm = DiLoCo(model, optimizer, DELAYED, replicas)
        began: dict[str, Any] | None = None
        for step in range(1, ROUNDS * period + 1):
            _local_step(model, optimizer, rank, step)
            vetoed = name == "vetoed" and replicas is not None \
                and replicas.rounds + 1 in replicas.vetoed
            if vetoed and step % period == period - 1:  # the refused round begins
                began = _snapshot(model, paradigm)
            ending = _snapshot(model, paradigm) if began is not None \
                and step % period == 0 else None
            if replicas is not None and step % period == period - 1:
                replicas.start_step()  # the loop forms the quorum where the round begins
                paradigm.begin_round(step)
            elif replicas is not None and step % period == 0:
                paradigm.end_round(step)
            elif replicas is None:
                paradigm.after_step(step)
            if ending is not None and began is not None:
                after = _snapshot(model, paradigm)
                record["vetoed_locals_kept"] = _same(
                    {**after, "global": [], "momentum": [], "residuals": []},
                    {**ending, "global": [], "momentum": [], "residuals": []})
                record["vetoed_state_restored"] = _same(
                    {**after, "parameters": ending["parameters"], "buffers": ending["buffers"]},
                    {**began, "parameters": ending["parameters"], "buffers": ending["buffers"]})
                began = None
        paradigm.finish(ROUNDS * period)
        record[name] = _snapshot(model, paradigm)
    torch.save(record, results / f"delayed-rounds-rank-{rank}.pt")
    dist.destroy_process_group()


def test_a_refused_delayed_round_keeps_the_steps_taken_meanwhile_and_the_state_before_it(
        tmp_path: Path) -> None:
    run_ranks(_delayed_rounds, (free_port(), tmp_path), WORLD)
    for rank in range(WORLD):
        record = torch.load(tmp_path / f"delayed-rounds-rank-{rank}.pt")
        assert _same(record["restart"], record["committed"])  # bit for bit
        assert record["vetoed_locals_kept"] and record["vetoed_state_restored"]
        # finish's plain round per fragment comes after the last delayed ones
        assert record["committed"]["rounds"] == ROUNDS + 2
        assert record["vetoed"]["rounds"] == ROUNDS + 1
        assert not _same(record["vetoed"], record["committed"])


def test_fragments_are_consecutive_top_level_modules() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.Linear(2, 2))
    parts = model_fragments(model, 2)
    assert [len(list(part.parameters())) for part in parts] == [4, 2]
    with pytest.raises(ValueError, match="fragments 4: the model has 3 top-level"):
        model_fragments(model, 4)


def test_settings_refuse_a_schedule_torchfts_diloco_cannot_keep() -> None:
    with pytest.raises(SettingError, match="fragments 3: sync-period 8 must be a multiple"):
        check({"algorithm": "diloco", "fragments": 3})
    check({"algorithm": "diloco", "fragments": 4, "sync_period": 8})
    with pytest.raises(SettingError, match=r"^fragment-delay 2: a fragment's round must end "
                                           r"before its next one starts; give fewer than "
                                           r"sync-period / fragments = 2 steps"):
        check({"algorithm": "diloco", "fragments": 4, "sync_period": 8, "fragment_delay": 2})
    check({"algorithm": "diloco", "fragments": 4, "sync_period": 8, "fragment_delay": 1})


def test_settings_refuse_an_outer_codec_that_contradicts_the_outer_gradient_dtype() -> None:
    with pytest.raises(SettingError, match=r"^outer-gradient-dtype bfloat16 contradicts "
                                           r"outer-codec int8: drop outer-gradient-dtype"):
        check({"algorithm": "diloco", "outer_gradient_dtype": "bfloat16", "outer_codec": "int8"})
    with pytest.raises(SettingError, match=r"^outer-codec-topk 0\.0: topk must send some"):
        check({"algorithm": "diloco", "outer_codec": "topk", "outer_codec_topk": 0.0})
    with pytest.raises(SettingError, match=r"^outer-codec: 'fp8' is not one of none, bf16, int8"):
        BY_NAME["outer-codec"].parse("fp8")
    for codec in ("none", "bf16"):  # the same thing said twice: bfloat16 on the wire
        check({"algorithm": "diloco", "outer_gradient_dtype": "bfloat16", "outer_codec": codec})
    assert outer_codec_name("none", "bfloat16") == outer_codec_name("bf16", "float32") == "bf16"
    with pytest.raises(ValueError, match="outer-gradient-dtype bfloat16 contradicts outer-codec"):
        outer_codec_name("topk", "bfloat16")  # the paradigm's own check, for users' own loops
