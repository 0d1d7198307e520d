"""The forms a weight-only quantized matmul can run as, and the measurement that picks one.

fx_weight_quant replaces ``x @ W`` by one of these (each computes x @ dequant(W) + bias):

* ``wq_linear``: graphopt's Triton kernel, ``torch.ops.graphopt.wq_linear`` (the torch
  reference where there is no GPU);
* ``dequant``: dequantize with torch ops, then ``F.linear`` (`wq_linear_reference` itself);
  inserted as a call of that Python function, which inductor's trace of the graph turns into
  ATen ops it fuses (the unpacking into one pointwise kernel);
* ``int4pack``: tinygemm, ``torch._weight_int4pack_mm`` on CUDA and
  ``torch._weight_int4pack_mm_for_cpu`` on the CPU (bf16 activations: the CPU kernel is ~30x
  slower on fp32 ones), with the weight repacked by ``torch._convert_weight_to_int4pack[_for_cpu]``;
* ``int8pack`` (CPU): ``torch._weight_int8pack_mm`` (bf16 activations), int8 with one scale per
  output channel: its own quantization, so its accuracy is measured like every form's (below);
* ``unquantized``: the original matmul, measured too: a quantized kernel is not faster by
  construction (issue 18), so where every quantized form is slower the weight stays as it was.

Each candidate is timed once per (shape, dtype, bits, block) on random inputs of the graph's
shape (the layers of a decoder share a few shapes), with the cache flushed before each run (a
decode step reads its weights from memory; a layer's weights fit an H100's L2 or a CPU's L3, so
timed repeatedly without the flush they measured a cache-bound matmul), and the fastest kept.
On the CPU the candidates are the packed kernels and the unquantized matmul: ``wq_linear``'s
CPU implementation is ``dequant`` itself, and ``dequant`` is the unquantized GEMM plus an
unpacking of the whole weight, so it cannot be the faster (timed at TinyLlama's shapes: 30-40x
slower than fp32 at one row; the torch path's int4 ran 1.7x slower than fp32 before the CPU forms).
Each quantized candidate's output is also checked against the exact product (`form_snr_db`):
a form whose activations or scales cost it the layer's SNR budget is no candidate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from graphopt.kernels.gpu_timing import gpu_time_ms, release_timing_buffers
from graphopt.kernels.wq_matmul import wq_linear_reference
from graphopt.quant import blockwise

__all__ = ["Quantized", "quantize_weight", "dequant_linear", "int4pack_linear", "int4pack_weight", "int8pack_linear", "int8pack_weight",
           "Candidate", "fastest", "form_snr_db", "TIMER", "release_timing_buffers", "gpu_time_ms"]

#: Rows of random x the accuracy budget is measured with.
SNR_ROWS = 64


@dataclass
class Quantized:
    """A [K, N] weight quantized, as the op's tensors (on the weight's device), and its SNR."""

    packed: torch.Tensor  # [N, k_blocks, block * bits / 8] uint8
    scales: torch.Tensor  # [N, k_blocks], the weight's dtype
    zeros: torch.Tensor | None  # [N, k_blocks] uint8, None when symmetric
    blocks: blockwise.BlockQuantized
    snr_db: float
    weight_snr_db: float  # the weight's own SNR (dequantized against original)
    int4pack: tuple[torch.Tensor, torch.Tensor] | None = None  # tinygemm's form, where it was a candidate
    int8pack: tuple[torch.Tensor, torch.Tensor] | None = None  # torch._weight_int8pack_mm's (per channel), where a candidate


def _output_snr(weight: np.ndarray, q: blockwise.BlockQuantized, seed: int = 0) -> float:
    """SNR of x @ W against x @ dequant(W) for x ~ N(0, 1) [SNR_ROWS, K] (for such x it is
    close to the weight-space SNR; the product is what the layer hands on)."""
    x = np.random.default_rng(seed).standard_normal((SNR_ROWS, weight.shape[0])).astype(np.float32)
    return blockwise.snr_db(x @ weight, x @ blockwise.dequantize(q).astype(np.float32))


def blockwise_quantize_torch(weight: torch.Tensor, bits: int, block_size: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """graphopt.quant.blockwise.quantize of a float32 [K, N] weight, on the weight's device: (q uint8
    [N, k_blocks, block], scales float32 [N, k_blocks], zero points uint8 [N, k_blocks]), the same
    values as numpy's (the same fp32 operations in the same order; round half to even in both;
    tests/test_torch_weight_quant.py compares them). A decoder's weights on the GPU quantize in
    milliseconds instead of numpy's seconds per layer on the host (a 1.1B model's two graphs: minutes)."""
    k, n = weight.shape
    k_blocks = -(-k // block_size)
    w = torch.zeros((n, k_blocks * block_size), dtype=torch.float32, device=weight.device)
    w[:, :k] = weight.t()
    w = w.reshape(n, k_blocks, block_size)
    q_max = (1 << bits) - 1
    if symmetric:
        zero = 1 << (bits - 1)
        scales = torch.maximum(-w.amin(dim=2) / zero, w.amax(dim=2) / (zero - 1))
        zero_points = torch.full((n, k_blocks), float(zero), dtype=torch.float32, device=weight.device)
    else:
        lo = torch.clamp(w.amin(dim=2), max=0.0)
        hi = torch.clamp(w.amax(dim=2), min=0.0)
        scales = (hi - lo) / q_max
        safe = torch.where(scales == 0, 1.0, scales)
        zero_points = torch.clamp(torch.round(-lo / safe), 0, q_max)
    scales = torch.where(scales == 0, 1.0, scales)
    q = torch.clamp(torch.round(w / scales[..., None]) + zero_points[..., None], 0, q_max).to(torch.uint8)
    return q, scales, zero_points.to(torch.uint8)


def _snr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """blockwise.snr_db in torch (float64)."""
    noise = float(((reference - approximation) ** 2).sum())
    signal = float((reference**2).sum())
    if noise == 0.0:
        return float("inf")
    return float("-inf") if signal == 0.0 else 10.0 * float(np.log10(signal / noise))


def _quantize_on_device(weight: torch.Tensor, bits: int, block_size: int, min_snr: float) -> Quantized:
    """quantize_weight's decisions, computed where the weight is (CUDA): same quantized values, SNRs in float64."""
    w = weight.detach().to(torch.float32)
    k = w.shape[0]
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((SNR_ROWS, k)).astype(np.float32)).to(w.device, torch.float64)
    exact = x @ w.double()

    def quantized(symmetric: bool) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor, float]:
        q, scales, zero_points = blockwise_quantize_torch(w, bits, block_size, symmetric)
        dequantized = ((q.float() - zero_points.float()[..., None]) * scales[..., None]).reshape(q.shape[0], -1)[:, :k].t()
        return (q, scales, zero_points), dequantized, _snr_db(exact, x @ dequantized.double())

    best, dequantized, snr = quantized(True)
    symmetric = True
    if snr < min_snr:
        asymmetric, asym_dequantized, asym_snr = quantized(False)
        if asym_snr > snr:
            best, dequantized, snr, symmetric = asymmetric, asym_dequantized, asym_snr, False
    q, scales, zero_points = best
    packed = q if bits == 8 else (q[..., 0::2] & 0x0F) | (q[..., 1::2] << 4)
    blocks = blockwise.BlockQuantized(q.cpu().numpy(), scales.cpu().numpy(), zero_points.cpu().numpy(), bits, block_size, k, symmetric)
    return Quantized(packed.contiguous(), scales.to(weight.dtype).contiguous(), None if symmetric else zero_points.contiguous(),
                     blocks, snr, _snr_db(w.double(), dequantized.double()))


def quantize_weight(weight: torch.Tensor, bits: int, block_size: int, min_snr: float) -> Quantized:
    """Round-to-nearest in blocks (graphopt.quant.blockwise, shared with the ONNX path): symmetric
    first; with zero points where symmetric misses the budget and they do better. A CUDA weight is
    quantized on its device (the same values; _quantize_on_device)."""
    if weight.device.type == "cuda":
        return _quantize_on_device(weight, bits, block_size, min_snr)
    w = weight.detach().to("cpu", torch.float32).numpy()
    best = blockwise.quantize(w, bits, block_size, symmetric=True)
    snr = _output_snr(w, best)
    if snr < min_snr:
        asymmetric = blockwise.quantize(w, bits, block_size, symmetric=False)
        asym_snr = _output_snr(w, asymmetric)
        if asym_snr > snr:
            best, snr = asymmetric, asym_snr
    device = weight.device
    packed = torch.from_numpy(np.ascontiguousarray(blockwise.pack(best.q, bits))).to(device)
    scales = torch.from_numpy(best.scales.astype(np.float32)).to(device, weight.dtype).contiguous()
    zeros = None if best.symmetric else torch.from_numpy(best.zero_points).to(device).contiguous()
    weight_snr = blockwise.snr_db(w, blockwise.dequantize(best).astype(np.float32))
    return Quantized(packed, scales, zeros, best, snr, weight_snr)


def dequant_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                   bias: torch.Tensor | None, bits: int, block_size: int, k: int) -> torch.Tensor:
    """The "dequant" form: torch ops only (inductor fuses the unpacking)."""
    return wq_linear_reference(x, packed, scales, zeros, bias, bits, block_size, k)


def tinygemm_operands(q: blockwise.BlockQuantized) -> tuple[torch.Tensor, torch.Tensor]:
    """(q as int32 [N, K], scales_and_zeros [K/g, N, 2] fp32) in tinygemm's contract:
    w = (q - 8) * scale + zero with q in [0, 15]. Ours is w = (q - zp) * scale, so
    zero = (8 - zp) * scale (tests check it with the CPU twin, _weight_int4pack_mm_for_cpu)."""
    flat = torch.from_numpy(q.q.reshape(q.n, -1).astype(np.int32))
    scales = torch.from_numpy(q.scales.astype(np.float32))
    zero = (8.0 - torch.from_numpy(q.zero_points.astype(np.float32))) * scales
    return flat, torch.stack([scales, zero], dim=-1).transpose(0, 1).contiguous()


def int4pack_weight(q: blockwise.BlockQuantized, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(packed, scales_and_zeros bf16) for tinygemm, or None where it cannot take this weight
    (CUDA or CPU; K a multiple of 32 with no padding; N a multiple of 8). The CUDA packing takes
    uint8 [N, K/2] with element 2i in the HIGH nibble (the opposite of MatMulNBits'); the CPU
    packing takes the int32 values [N, K]."""
    if device.type not in ("cuda", "cpu") or q.bits != 4 or q.k % 32 or q.k != q.k_blocks * q.block_size or q.n % 8:
        return None
    inner_k_tiles = 8 if q.k % 128 == 0 else 4 if q.k % 64 == 0 else 2
    flat, scales_and_zeros = tinygemm_operands(q)
    if device.type == "cpu":
        return torch._convert_weight_to_int4pack_for_cpu(flat, inner_k_tiles), scales_and_zeros.to(torch.bfloat16)
    uint8 = ((flat[:, 0::2] << 4) | flat[:, 1::2]).to(torch.uint8).to(device)
    return torch._convert_weight_to_int4pack(uint8, inner_k_tiles), scales_and_zeros.to(device, torch.bfloat16)


def int4pack_linear(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int, n: int,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """The "int4pack" form: tinygemm on bf16 rows (x cast there and back when it is not bf16)."""
    x2d = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    if x.device.type == "cpu":
        y = torch._weight_int4pack_mm_for_cpu(x2d.contiguous(), packed, group, scales_and_zeros).to(x.dtype)
    else:
        y = torch._weight_int4pack_mm(x2d, packed, group, scales_and_zeros).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], n)


def int8pack_weight(weight_kn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(int8 [N, K], bf16 scales [N]) for torch._weight_int8pack_mm: symmetric, one scale per output
    channel (round to nearest, half to even). None off the CPU (the kernel is the CPU's and MPS's)."""
    if weight_kn.device.type != "cpu":
        return None
    w = weight_kn.detach().to(torch.float32).t()
    scales = w.abs().amax(dim=1) / 127.0
    scales = torch.where(scales == 0, 1.0, scales)
    q = torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8)
    return q.contiguous(), scales.to(torch.bfloat16).contiguous()


def int8pack_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """The "int8pack" form: torch._weight_int8pack_mm on bf16 rows."""
    x2d = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch._weight_int8pack_mm(x2d, q, scales).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], n)


def form_snr_db(run: Callable[[torch.Tensor], Any], weight_kn: torch.Tensor, bias: torch.Tensor | None) -> float:
    """Output SNR (dB) of a candidate form against the exact product, x ~ N(0, 1) [SNR_ROWS, K] in
    the weight's dtype (the form's own rounding: its quantization, its activation cast, its kernel)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SNR_ROWS, weight_kn.shape[0], generator=gen).to(weight_kn.device, weight_kn.dtype)
    exact = x.double() @ weight_kn.double()
    if bias is not None:
        exact = exact + bias.double()
    with torch.no_grad():
        return _snr_db(exact, run(x).double())


@dataclass
class Candidate:
    name: str
    run: Callable[[torch.Tensor], Any]  # x -> the product


def _default_timer(name: str, fn: Callable[[], Any]) -> float:
    return gpu_time_ms(fn)


#: How a candidate is timed: (candidate name, thunk) -> milliseconds (tests replace it).
TIMER: Callable[[str, Callable[[], Any]], float] = _default_timer

_TIMES: dict[tuple[Any, ...], dict[str, float]] = {}


def fastest(key: tuple[Any, ...], x: torch.Tensor, candidates: list[Candidate]) -> dict[str, float]:
    """Every candidate's time on x (cached per key: one timing per shape and form), milliseconds.
    A candidate that fails (a kernel refusing the shape) is left out."""
    cached = _TIMES.get(key)
    if cached is not None and set(cached) <= {c.name for c in candidates}:
        return cached
    times: dict[str, float] = {}
    with torch.no_grad():
        for candidate in candidates:
            try:
                times[candidate.name] = TIMER(candidate.name, functools.partial(candidate.run, x))
            except Exception:  # noqa: BLE001 - a form that cannot run here is no candidate
                continue
    _TIMES[key] = times
    return times


def unquantized_linear(x: torch.Tensor, weight_kn: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The matmul as it was (the baseline candidate)."""
    return F.linear(x, weight_kn.t(), bias)
