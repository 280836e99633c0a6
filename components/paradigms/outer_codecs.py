"""How DiLoCo's pseudo-gradient travels between the workers: the ``outer-codec`` setting.

==========  ===================================  ===========================  ===============
codec       on the wire                          how the workers average it   error feedback
==========  ===================================  ===========================  ===============
``none``    float32                              all-reduce (sum)             no
``bf16``    bfloat16                             all-reduce (sum)             no
``int8``    int8, one float32 scale per block    all-gather, decoded, summed  yes
            of ``block`` values (absmax / 127)
``topk``    per chunk of 4096, the k largest     all-gather, decoded, summed  yes
            magnitudes: int16 positions and
            ``bits``-bit values (SparseLoCo,
            arXiv 2508.15706)
==========  ===================================  ===========================  ===============

``none`` and ``bf16`` (:class:`SummedCodec`) are summed by the collective itself. The others
cannot be: int8 values of different per-worker scales do not add up, and each worker's top-k
indices differ. So each worker sends its encoded bytes to every other one (an all-gather: the
only collective besides the all-reduce that both the job's gloo group and the groups between
replicas under per-step recovery offer), and every worker decodes the payloads and sums them in
the same order (rank order), so that every worker holds exactly the same average. An all-gather
makes each process send (N - 1) x its payload where a ring all-reduce sends 2 (N - 1) / N x:
int8 sends a quarter of float32's bytes at N = 2, half at 4, as many at 8. Top-k sends far less
at any N that matters here. (torchft's quantised all-reduce, an all-to-all and an all-gather of
fp8 chunks, sends 2 (N - 1) / N x at any N, but needs Triton on a GPU.)

Error feedback (the codecs whose ``error_feedback`` is True): each worker keeps what its codec
dropped, the *residual*, and adds it to its next pseudo-gradient before encoding
(:func:`encode_with_feedback`), as SparseLoCo's error-feedback accumulator and MuLoCo's
low-bit outer updates do. Nothing a codec drops is lost for good, only delayed. The residual is
the paradigm's state (``DiLoCo.state_dict``): checkpointed, copied to a replacement, restored
with a discarded round.

Every payload is one flat ``uint8`` tensor, so a round is one collective, and an all-zero
payload decodes to zeros: what a group that is healing under per-step recovery sends.
Torch-only, no torchft: the paradigms' own tests run it on any machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from sublimate.components.base.settings import OUTER_CODECS as CODEC_NAMES

# what a codec decodes into, and what the pseudo-gradient is (torchft's flat bucket)
FLOAT = torch.float32


def _scalars_bytes(values: torch.Tensor) -> torch.Tensor:
    """float32 or int32 values as their bytes (little-endian, as the machine stores them)."""
    return values.contiguous().view(torch.uint8)


def _from_bytes(payload: torch.Tensor, start: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """``count`` values of ``dtype`` read from ``payload[start:]`` (a copy: a slice of a byte
    tensor need not be aligned for a wider type)."""
    size = torch.empty(0, dtype=dtype).element_size()
    return payload[start:start + count * size].clone().view(dtype)


@dataclass(frozen=True)
class SummedCodec:
    """``none`` and ``bf16``: the pseudo-gradient all-reduced as it is, in ``dtype``."""

    dtype: torch.dtype
    gathered: ClassVar[bool] = False
    error_feedback: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"a summed outer codec sends float32 or bfloat16, not {self.dtype}")


@dataclass(frozen=True)
class Int8Codec:
    """Blockwise absmax int8: each block of ``block`` values is sent as int8 values
    ``round(x / s)`` with its scale ``s = max|x| / 127`` in float32; decoded ``q * s``. Rounding is
    torch's (half to even). Payload: the scales' bytes, then one byte per value."""

    block: int = 256
    gathered: ClassVar[bool] = True
    error_feedback: ClassVar[bool] = True
    LEVEL: ClassVar[int] = 127  # symmetric: -127..127, so that -x encodes as -q

    def __post_init__(self) -> None:
        if not isinstance(self.block, int) or isinstance(self.block, bool) or self.block < 1:
            raise ValueError(f"int8 codec: block must be a positive integer, not {self.block!r}")

    def blocks(self, numel: int) -> int:
        return math.ceil(numel / self.block)

    def payload_bytes(self, numel: int) -> int:
        return 4 * self.blocks(numel) + numel

    def encode(self, tensor: torch.Tensor) -> torch.Tensor:
        values = _flat_float(tensor)
        numel = values.numel()
        blocks = self.blocks(numel)
        padded = torch.zeros(blocks * self.block, dtype=FLOAT, device=values.device)
        padded[:numel] = values
        rows = padded.view(blocks, self.block)
        scales = rows.abs().amax(dim=1) / self.LEVEL
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero block: q 0
        quantised = (rows / safe[:, None]).round().clamp(-self.LEVEL, self.LEVEL)
        quantised = quantised.to(torch.int8).reshape(-1)[:numel]
        return torch.cat([_scalars_bytes(scales), quantised.view(torch.uint8)])

    def decode(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        blocks = self.blocks(numel)
        scales = _from_bytes(payload, 0, blocks, FLOAT)
        quantised = payload[4 * blocks:4 * blocks + numel].view(torch.int8).to(FLOAT)
        return quantised * scales.repeat_interleave(self.block)[:numel]


@dataclass(frozen=True)
class TopKCodec:
    """SparseLoCo's compressor: the values cut into chunks of ``chunk`` (the last one padded
    with zeros; a tensor smaller than a chunk is one chunk), and in each chunk the
    ``k = round(fraction x chunk)`` values of largest magnitude (at least one), their
    positions in the chunk as int16, their values quantised to ``bits`` bits on the 2^bits
    evenly spaced levels from ``-a`` to ``a``, ``a`` the chunk's largest magnitude sent
    (float32): with 2 bits, -a, -a/3, a/3, a. A top-k per chunk reaches every part of the
    model, and its positions fit in 2 bytes. Payload: each chunk's ``a``, the positions
    (ascending in each chunk), then the levels' numbers packed 8 / bits to a byte, the first
    in the lowest bits."""

    fraction: float
    bits: int = 2
    chunk: int = 4096  # SparseLoCo's
    gathered: ClassVar[bool] = True
    error_feedback: ClassVar[bool] = True
    LARGEST_CHUNK: ClassVar[int] = 1 << 15  # a position in it fits an int16

    def __post_init__(self) -> None:
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, int | float) \
                or not 0 < self.fraction <= 1:
            raise ValueError(f"topk codec: fraction must be in (0, 1], not {self.fraction!r}")
        if self.bits not in (1, 2, 4, 8):
            raise ValueError(f"topk codec: bits must be 1, 2, 4 or 8 (a whole number to a "
                             f"byte), not {self.bits!r}")
        if not isinstance(self.chunk, int) or isinstance(self.chunk, bool) \
                or not 1 <= self.chunk <= self.LARGEST_CHUNK:
            raise ValueError(f"topk codec: chunk must be an integer from 1 to "
                             f"{self.LARGEST_CHUNK}, not {self.chunk!r}")

    def shape(self, numel: int) -> tuple[int, int, int]:
        """(the chunk's size, the chunks, the values kept in each) for ``numel`` values."""
        size = max(1, min(self.chunk, numel))
        return size, math.ceil(numel / size), max(1, min(size, round(self.fraction * size)))

    def payload_bytes(self, numel: int) -> int:
        _, chunks, kept = self.shape(numel)
        return 4 * chunks + 2 * chunks * kept + math.ceil(chunks * kept * self.bits / 8)

    def _steps(self, largest: torch.Tensor) -> torch.Tensor:
        return 2 * largest / (2 ** self.bits - 1)

    def encode(self, tensor: torch.Tensor) -> torch.Tensor:
        values = _flat_float(tensor)
        numel = values.numel()
        size, chunks, kept = self.shape(numel)
        padded = torch.zeros(chunks * size, dtype=FLOAT, device=values.device)
        padded[:numel] = values
        rows = padded.view(chunks, size)
        indices = torch.topk(rows.abs(), kept, dim=1, sorted=False).indices.sort(dim=1).values
        chosen = rows.gather(1, indices)
        largest = chosen.abs().amax(dim=1)
        steps = self._steps(largest)
        safe = torch.where(steps > 0, steps, torch.ones_like(steps))
        numbers = ((chosen + largest[:, None]) / safe[:, None]).round()
        numbers = torch.where(largest[:, None] > 0, numbers.clamp(0, 2 ** self.bits - 1), 0)
        positions = indices.to(torch.int16).reshape(-1)
        return torch.cat([_scalars_bytes(largest), _scalars_bytes(positions),
                          self._pack(numbers.to(torch.int32).reshape(-1))])

    def decode(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        size, chunks, kept = self.shape(numel)
        largest = _from_bytes(payload, 0, chunks, FLOAT)
        indices = _from_bytes(payload, 4 * chunks, chunks * kept, torch.int16)
        numbers = self._unpack(payload[4 * chunks + 2 * chunks * kept:], chunks * kept)
        values = numbers.view(chunks, kept).to(FLOAT) * self._steps(largest)[:, None] \
            - largest[:, None]
        rows = torch.zeros(chunks, size, dtype=FLOAT, device=payload.device)
        rows.scatter_(1, indices.to(torch.int64).view(chunks, kept), values)
        return rows.reshape(-1)[:numel]

    def _pack(self, numbers: torch.Tensor) -> torch.Tensor:
        per_byte = 8 // self.bits
        padded = torch.zeros(math.ceil(numbers.numel() / per_byte) * per_byte,
                             dtype=torch.int32, device=numbers.device)
        padded[:numbers.numel()] = numbers
        shifts = torch.arange(per_byte, dtype=torch.int32, device=numbers.device) * self.bits
        return (padded.view(-1, per_byte) << shifts).sum(dim=1).to(torch.uint8)

    def _unpack(self, packed: torch.Tensor, count: int) -> torch.Tensor:
        per_byte = 8 // self.bits
        shifts = torch.arange(per_byte, dtype=torch.int32, device=packed.device) * self.bits
        mask = 2 ** self.bits - 1
        size = math.ceil(count / per_byte)
        numbers = (packed[:size].to(torch.int32)[:, None] >> shifts) & mask
        return numbers.reshape(-1)[:count]


OuterCodec = SummedCodec | Int8Codec | TopKCodec
GatheredCodec = Int8Codec | TopKCodec


def _flat_float(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != FLOAT:
        raise ValueError(f"outer codecs encode float32 pseudo-gradients, not {tensor.dtype}")
    return tensor.reshape(-1)


def make_codec(name: str, topk_fraction: float = 0.03) -> OuterCodec:
    """The codec the ``outer-codec`` setting names (``outer-codec-topk``: topk's fraction)."""
    if name == "none":
        return SummedCodec(torch.float32)
    if name == "bf16":
        return SummedCodec(torch.bfloat16)
    if name == "int8":
        return Int8Codec()
    if name == "topk":
        return TopKCodec(topk_fraction)
    raise ValueError(f"outer-codec: '{name}' is not one of {', '.join(CODEC_NAMES)}")


def encode_with_feedback(codec: GatheredCodec, tensor: torch.Tensor,
                         residual: torch.Tensor | None) -> torch.Tensor:
    """``tensor`` plus ``residual`` (what the codec dropped before), encoded; ``residual``
    becomes what it drops now (``None``: no error feedback)."""
    corrected = tensor.reshape(-1) if residual is None else tensor.reshape(-1) + residual
    payload = codec.encode(corrected)
    if residual is not None:
        residual.copy_(corrected - codec.decode(payload, corrected.numel()))
    return payload
