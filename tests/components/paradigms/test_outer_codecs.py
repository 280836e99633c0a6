"""DiLoCo's outer codecs (paradigms/outer_codecs.py) on hand-computed numbers: each codec's
bytes and decoded values, the error-feedback residual after one and two rounds, and the
average of the decoded payloads across three real gloo processes, with the bytes counted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.base.ports import free_port
from sublimate.components.paradigms import Paradigm, ParadigmConfig
from sublimate.components.paradigms.outer_codecs import (
    Int8Codec,
    SummedCodec,
    TopKCodec,
    encode_with_feedback,
    make_codec,
)
from tests.ranks import run_ranks


def _bytes(*parts: torch.Tensor) -> torch.Tensor:
    return torch.cat([part.contiguous().view(torch.uint8) for part in parts])


def test_int8_sends_a_scale_per_block_and_one_byte_per_value() -> None:
    codec = Int8Codec(block=4)
    values = torch.tensor([1.4, -2.5, 127.0, 0.5,  # absmax 127: scale 1
                           0.0, 0.0, 0.0, 0.0,  # all zero: scale 0, every value 0
                           63.5, -1.3])  # a partial block, absmax 63.5: scale 0.5
    payload = codec.encode(values)
    # round(x / scale), half to even (-2.5 -> -2, 0.5 -> 0), -1.3 / 0.5 = -2.6 -> -3
    assert torch.equal(payload, _bytes(torch.tensor([1.0, 0.0, 0.5]),
                                       torch.tensor([1, -2, 127, 0, 0, 0, 0, 0, 127, -3],
                                                    dtype=torch.int8)))
    assert payload.numel() == codec.payload_bytes(10) == 3 * 4 + 10
    assert torch.equal(codec.decode(payload, 10),
                       torch.tensor([1.0, -2.0, 127.0, 0.0, 0, 0, 0, 0, 63.5, -1.5]))
    # what a healing group sends: zeros, which decode to zeros
    assert torch.equal(codec.decode(torch.zeros_like(payload), 10), torch.zeros(10))


def test_topk_sends_the_largest_values_at_two_bits_with_their_indices() -> None:
    codec = TopKCodec(fraction=0.5, bits=2)
    values = torch.tensor([0.5, 3.0, -1.8, 0.25, -1.0, 0.0])
    payload = codec.encode(values)
    # one chunk (6 values, fewer than a chunk), k = 3: positions 1, 2, 4 (|3|, |-1.8|, |-1|);
    # a = 3, levels -3, -1, 1, 3 numbered 0..3: 3 -> 3, -1.8 -> 1 (nearest -1), -1 -> 1;
    # packed first-lowest: 3 + 1 * 4 + 1 * 16 = 23
    assert torch.equal(payload, _bytes(torch.tensor([3.0]),
                                       torch.tensor([1, 2, 4], dtype=torch.int16),
                                       torch.tensor([23], dtype=torch.uint8)))
    assert payload.numel() == codec.payload_bytes(6) == 4 + 3 * 2 + 1
    assert torch.equal(codec.decode(payload, 6), torch.tensor([0.0, 3.0, -1.0, 0.0, -1.0, 0.0]))
    assert torch.equal(codec.decode(torch.zeros_like(payload), 6), torch.zeros(6))


def test_topk_takes_its_largest_values_in_each_chunk() -> None:
    codec = TopKCodec(fraction=1 / 3, bits=2, chunk=3)
    payload = codec.encode(torch.tensor([0.5, -2.0, 1.0, 0.0, 0.25, 4.0]))
    # chunks [0.5, -2, 1] and [0, 0.25, 4], one value each: -2 at 1 (a = 2, level 0) and 4 at
    # 2 (a = 4, level 3); the levels packed 0 + 3 * 4 = 12
    assert torch.equal(payload, _bytes(torch.tensor([2.0, 4.0]),
                                       torch.tensor([1, 2], dtype=torch.int16),
                                       torch.tensor([12], dtype=torch.uint8)))
    assert payload.numel() == codec.payload_bytes(6) == 2 * 4 + 2 * 2 + 1
    assert torch.equal(codec.decode(payload, 6), torch.tensor([0.0, -2.0, 0.0, 0.0, 0.0, 4.0]))
    # a partial last chunk is padded with zeros, which are never sent
    assert torch.equal(codec.decode(codec.encode(torch.tensor([1.0, 0.0, 0.0, -3.0])), 4),
                       torch.tensor([1.0, 0.0, 0.0, -3.0]))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_topk_levels_span_the_largest_magnitude_at_every_width(bits: int) -> None:
    # 2^bits levels from -a to a: a value at a level is sent exactly
    codec = TopKCodec(fraction=1.0, bits=bits)
    levels = 2 ** bits - 1
    step = 2 * torch.tensor(7.0) / levels
    values = torch.arange(levels + 1, dtype=torch.float32).flip(0) * step - 7.0
    payload = codec.encode(values)
    assert payload.numel() == 4 + 2 * (levels + 1) + max(1, (levels + 1) * bits // 8)
    assert torch.equal(codec.decode(payload, values.numel()), values)


def test_error_feedback_keeps_what_the_codec_dropped_and_sends_it_next_round() -> None:
    codec = TopKCodec(fraction=0.5, bits=2)
    residual = torch.zeros(6)
    first = torch.tensor([0.5, 3.0, -1.5, 0.25, -1.0, 0.0])
    encode_with_feedback(codec, first, residual)
    # round 1 sends indices 1, 2, 4 at levels -3, -1, 1, 3: [0, 3, -1, 0, -1, 0] (-1.5 is
    # nearer -1 than -3); the rest stays
    assert torch.equal(residual, torch.tensor([0.5, 0.0, -0.5, 0.25, 0.0, 0.0]))
    second = torch.tensor([0.5, -0.25, -0.25, 0.25, 2.0, 0.0])
    payload = encode_with_feedback(codec, second, residual)
    # round 2 encodes second + residual = [1, -0.25, -0.75, 0.5, 2, 0]: k = 3 at indices 0,
    # 2, 4; a = 2, levels -2, -2/3, 2/3, 2 (step 4/3): 1 -> 2/3, -0.75 -> -2/3, 2 -> 2
    step = 2 * torch.tensor(2.0) / 3
    sent = torch.tensor([2 * step - 2, 0, 1 * step - 2, 0, 2.0, 0])
    assert torch.equal(codec.decode(payload, 6), sent)
    assert torch.equal(residual, torch.tensor([1.0, -0.25, -0.75, 0.5, 2.0, 0.0]) - sent)
    assert torch.allclose(residual, torch.tensor([1 / 3, -0.25, -0.75 + 2 / 3, 0.5, 0, 0]))


def test_int8_error_feedback_over_two_rounds() -> None:
    codec = Int8Codec(block=2)
    residual = torch.zeros(2)
    encode_with_feedback(codec, torch.tensor([127.0, 1.25]), residual)  # scale 1: 1.25 -> 1
    assert torch.equal(residual, torch.tensor([0.0, 0.25]))
    payload = encode_with_feedback(codec, torch.tensor([127.0, 1.25]), residual)
    # 1.25 + 0.25 = 1.5 -> 2 (half to even): the dropped quarter arrives, overshooting by half
    assert torch.equal(codec.decode(payload, 2), torch.tensor([127.0, 2.0]))
    assert torch.equal(residual, torch.tensor([0.0, -0.5]))


def test_codecs_check_their_arguments_on_entry() -> None:
    for fraction in (0, -0.1, 1.5, True, "0.1"):
        with pytest.raises(ValueError, match="topk codec: fraction must be in"):
            TopKCodec(fraction)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="topk codec: bits must be 1, 2, 4 or 8"):
        TopKCodec(0.1, bits=3)
    for chunk in (0, 1 << 15 | 1, 2.0):
        with pytest.raises(ValueError, match="topk codec: chunk must be an integer from 1 to"):
            TopKCodec(0.1, chunk=chunk)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="int8 codec: block must be a positive integer"):
        Int8Codec(block=0)
    with pytest.raises(ValueError, match="a summed outer codec sends float32 or bfloat16"):
        SummedCodec(torch.float16)
    with pytest.raises(ValueError, match="outer-codec: 'fp8' is not one of none, bf16"):
        make_codec("fp8")
    with pytest.raises(ValueError, match=r"encode float32 pseudo-gradients, not torch\.float64"):
        Int8Codec().encode(torch.zeros(3, dtype=torch.float64))
    assert make_codec("bf16") == SummedCodec(torch.bfloat16)
    assert make_codec("topk", 0.1) == TopKCodec(0.1)


WORLD = 3
# each rank's pseudo-gradient, and what int8 (block 2) decodes it to
INT8_SENT = {0: ([127.0, -3.0, 63.5, 0.5], [127.0, -3.0, 63.5, 0.5]),  # scales 1, 0.5
             1: ([-127.0, 1.4, 0.0, 0.0], [-127.0, 1.0, 0.0, 0.0]),  # scales 1, 0
             2: ([31.75, 0.3, -63.5, 20.1], [31.75, 0.25, -63.5, 20.0])}  # 0.25, 0.5
# topk, half of 4 values (one chunk) at 2 bits: rank 0 sends 4 at 0, -4 at 3; rank 1 2 at 1, -2 at 2
# (a = 2: levels -2, -2/3, 2/3, 2, -1.9 -> -2); rank 2 3 at 0 and 3 at 2
TOPK_SENT = {0: ([4.0, 0.1, 0.2, -4.0], [4.0, 0.0, 0.0, -4.0]),
             1: ([0.0, 2.0, -1.9, 0.5], [0.0, 2.0, -2.0, 0.0]),
             2: ([3.0, 0.0, 3.0, 1.0], [3.0, 0.0, 3.0, 0.0])}


def _average(rank: int, port: int, results: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    model = nn.Linear(1, 1)
    paradigm = Paradigm(model, torch.optim.SGD(model.parameters(), lr=0.1), ParadigmConfig())
    averaged = {}
    for name, codec, sent in (("int8", Int8Codec(block=2), INT8_SENT),
                              ("topk", TopKCodec(0.5), TOPK_SENT)):
        tensor = torch.tensor(sent[rank][0])
        payload = codec.encode(tensor)
        paradigm.average_encoded_(payload, lambda p, c=codec: c.decode(p, 4), tensor)
        averaged[name] = tensor
    torch.save({"averaged": averaged, "traffic": paradigm.traffic.state_dict()},
               results / f"rank-{rank}.pt")
    dist.destroy_process_group()


def test_every_worker_gets_the_mean_of_the_decoded_payloads_and_counts_its_bytes(
        tmp_path: Path) -> None:
    run_ranks(_average, (free_port(), tmp_path), WORLD)
    for rank in range(WORLD):
        record = torch.load(tmp_path / f"rank-{rank}.pt")
        for name, sent in (("int8", INT8_SENT), ("topk", TOPK_SENT)):
            decoded_sum = sum(torch.tensor(sent[r][1]) for r in range(WORLD))
            assert torch.equal(record["averaged"][name], decoded_sum / WORLD), (name, rank)
        # int8: 2 scales + 4 values = 12 bytes; topk: a, 2 positions, 1 byte = 9 bytes; an
        # all-gather sends each to the N - 1 = 2 others
        assert record["traffic"] == {"payload_bytes": 12 + 9, "wire_bytes": 2.0 * (12 + 9),
                                     "collectives": 2}
    assert torch.equal(torch.load(tmp_path / "rank-0.pt")["averaged"]["int8"],
                       torch.tensor([31.75, -1.75, 0.0, 20.5]) / 3)
