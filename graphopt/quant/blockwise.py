"""Round-to-nearest block-wise weight quantization, in numpy (both front doors use it).

A weight of a MatMul is [K, N] (K the reduction dim). It is quantized per output column n
and per block of `block_size` consecutive k: one scale (and, asymmetric, one zero point) per
(n, block). The layout follows onnxruntime's com.microsoft.MatMulNBits contract, because that is
the one format both runtimes agree on:

* q:      [N, k_blocks, block_size] unsigned ints in [0, 2**bits - 1] (K padded with zeros);
* scales: [N, k_blocks] in the weight's float type;
* zero points: [N, k_blocks] unsigned ints; symmetric quantization uses the default
  zero point 2**(bits-1) (what MatMulNBits assumes when its zero_points input is absent);
* packed: [N, k_blocks, block_size * bits // 8] uint8, low bits first (int4: element 2i in
  the low nibble, 2i+1 in the high one).

Dequantized: w[k, n] = (q[n, k // block, k % block] - zero_point[n, k // block]) * scale[n, k // block].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUPPORTED_BITS = (4, 8)


@dataclass(frozen=True)
class BlockQuantized:
    """A [K, N] weight quantized per (column, block of K)."""

    q: np.ndarray  # [N, k_blocks, block_size] uint8, values in [0, 2**bits - 1]
    scales: np.ndarray  # [N, k_blocks], the weight's float dtype
    zero_points: np.ndarray  # [N, k_blocks] uint8
    bits: int
    block_size: int
    k: int  # the original K (q is padded to k_blocks * block_size)
    symmetric: bool

    @property
    def n(self) -> int:
        return int(self.q.shape[0])

    @property
    def k_blocks(self) -> int:
        return int(self.q.shape[1])


def _check(bits: int, block_size: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bits {bits} (supported: {', '.join(map(str, SUPPORTED_BITS))})")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block size {block_size} must be a power of two >= 16")


def quantize(weight: np.ndarray, bits: int = 4, block_size: int = 32, symmetric: bool = True) -> BlockQuantized:
    """Quantize a [K, N] float weight round-to-nearest, per column and block of K."""
    _check(bits, block_size)
    if weight.ndim != 2:
        raise ValueError(f"expected a 2-D [K, N] weight, got shape {weight.shape}")
    k, n = weight.shape
    k_blocks = -(-k // block_size)
    w = np.zeros((n, k_blocks * block_size), dtype=np.float32)
    w[:, :k] = weight.astype(np.float32).T
    w = w.reshape(n, k_blocks, block_size)
    q_max = (1 << bits) - 1
    if symmetric:
        zero = 1 << (bits - 1)
        # The symmetric range is [-zero, zero - 1] steps: the smallest scale that holds both
        # extremes (a negative extreme may use the one extra level).
        scales = np.maximum(-w.min(axis=2) / zero, w.max(axis=2) / (zero - 1))
        zero_points = np.full((n, k_blocks), zero, dtype=np.float32)
    else:
        lo = np.minimum(w.min(axis=2), 0.0)
        hi = np.maximum(w.max(axis=2), 0.0)
        scales = (hi - lo) / q_max
        safe = np.where(scales == 0, 1.0, scales)
        zero_points = np.clip(np.round(-lo / safe), 0, q_max)
    scales = np.where(scales == 0, 1.0, scales).astype(weight.dtype)
    scales32 = scales.astype(np.float32)
    q = np.clip(np.round(w / scales32[..., None]) + zero_points[..., None], 0, q_max).astype(np.uint8)
    return BlockQuantized(q, scales, zero_points.astype(np.uint8), bits, block_size, k, symmetric)


def dequantize(quantized: BlockQuantized) -> np.ndarray:
    """The [K, N] weight the quantized values stand for (in the scales' dtype)."""
    qz = quantized.q.astype(np.float32) - quantized.zero_points.astype(np.float32)[..., None]
    w = qz * quantized.scales.astype(np.float32)[..., None]
    return w.reshape(quantized.n, -1)[:, : quantized.k].T.astype(quantized.scales.dtype)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned `bits`-bit values along the last axis into uint8, low bits first."""
    if bits == 8:
        return q.astype(np.uint8)
    if bits != 4:
        raise ValueError(f"unsupported bits {bits}")
    if q.shape[-1] % 2:
        raise ValueError("int4 packing needs an even last dimension")
    q = q.astype(np.uint8)
    return (q[..., 0::2] & 0x0F) | ((q[..., 1::2] & 0x0F) << 4)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of `pack`."""
    if bits == 8:
        return packed.astype(np.uint8)
    if bits != 4:
        raise ValueError(f"unsupported bits {bits}")
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def pack_zero_points(zero_points: np.ndarray, bits: int) -> np.ndarray:
    """MatMulNBits' packed zero points: per column, k_blocks values packed (padded to a byte)."""
    if bits == 8:
        return zero_points.astype(np.uint8)
    n, k_blocks = zero_points.shape
    padded = np.zeros((n, k_blocks + (k_blocks % 2)), dtype=np.uint8)
    padded[:, :k_blocks] = zero_points
    return pack(padded, 4)


def snr_db(reference: np.ndarray, approximation: np.ndarray) -> float:
    """Signal-to-noise ratio of `approximation` against `reference`, in dB (inf when exact)."""
    ref = reference.astype(np.float64)
    noise = float(np.sum((ref - approximation.astype(np.float64)) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * np.log10(signal / noise)
