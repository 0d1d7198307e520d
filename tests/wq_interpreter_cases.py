"""graphopt::wq_linear's Triton kernel in Triton's interpreter (or compiled, on a GPU).

Not collected by the normal run: tests/test_wq_kernels.py runs this file in a child pytest
with TRITON_INTERPRET=1 (Triton reads it at import). On a GPU machine:

    GRAPHOPT_KERNELS_DEVICE=cuda python -m pytest -q tests/wq_interpreter_cases.py

Each case quantizes a random weight with graphopt.quant.blockwise (the numpy module both
front doors share), then checks the kernel against the reference (dequantize with torch,
then matmul) and the reference against numpy's dequantized weight. The cases name the launch
config they cover (the GEMV at M = 1, the dot tiles at small and large M, a K tile smaller
or larger than the quantization block, K not a multiple of either, split-K); a case without
one runs the op's own choice (the autotuners: one config each under the interpreter, all of
them on a GPU). bf16 is left to the GPU run: the interpreter's bf16 dot multiplies raw bits
(tests/kernels_interpreter_cases.py).
"""

import os

import numpy as np
import pytest
import torch

DEVICE = torch.device(os.environ.get("GRAPHOPT_KERNELS_DEVICE", "cpu"))
if os.environ.get("TRITON_INTERPRET") != "1" and DEVICE.type != "cuda":
    raise RuntimeError("run this file with TRITON_INTERPRET=1 (tests/test_wq_kernels.py does) or GRAPHOPT_KERNELS_DEVICE=cuda")

from graphopt.kernels import _triton  # noqa: E402
from graphopt.kernels.wq_matmul import (  # noqa: E402
    GEMV_CONFIGS,
    PREFILL_CONFIGS,
    SMALL_M_CONFIGS,
    split_for,
    wq_linear_reference,
    wq_linear_triton,
)
from graphopt.quant import blockwise  # noqa: E402

F16, F32 = torch.float16, torch.float32
TOL = {F32: dict(atol=1e-4, rtol=1e-4), F16: dict(atol=2e-2, rtol=2e-2)}


def quantized(k: int, n: int, bits: int, block: int, symmetric: bool, dtype: torch.dtype, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k)
    q = blockwise.quantize(weight, bits, block, symmetric)
    packed = torch.from_numpy(blockwise.pack(q.q, bits)).to(DEVICE)
    scales = torch.from_numpy(q.scales).to(DEVICE, dtype)
    zeros = None if symmetric else torch.from_numpy(q.zero_points).to(DEVICE)
    return q, packed, scales, zeros


def cfg(bm: int, bn: int, bk: int) -> dict[str, int]:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": 1, "num_warps": 4, "num_stages": 1}


# name: (M, K, N, block, symmetric, bias, dtype, split_k, config); each runs at 4 and 8 bits
SHAPES = {
    # M = 1, the GEMV: K tile smaller than, equal to, larger than the block; K not a multiple of the tile
    "m1_gemv_tile_in_block": (1, 256, 48, 64, True, False, F32, 1, cfg(1, 16, 32)),
    "m1_gemv_tile_spans_blocks": (1, 256, 40, 32, False, True, F32, 1, cfg(1, 16, 128)),
    "m1_gemv_k_not_multiple": (1, 200, 33, 32, False, True, F32, 1, cfg(1, 8, 64)),
    "m1_gemv_tile_past_k": (1, 96, 24, 32, True, False, F16, 1, cfg(1, 16, 256)),
    "m1_gemv_split3": (1, 512, 40, 32, True, True, F32, 3, cfg(1, 16, 64)),
    "m1_gemv_split_uneven_zero_points_fp16": (1, 450, 56, 64, False, True, F16, 4, cfg(1, 32, 64)),
    "m1_dot_config": (1, 256, 48, 32, True, True, F32, 1, cfg(16, 32, 64)),
    "m1_auto": (1, 320, 40, 64, True, True, F16, None, None),
    "m1_gemv_one_block_per_row": (1, 500, 24, 512, True, False, F32, 1, cfg(1, 4, 128)),  # per-channel scales
    "m4_dot_one_block_per_row_split2": (4, 500, 24, 512, False, True, F32, 2, cfg(16, 16, 64)),
    # M = 2..16: dot tiles of 16 rows, split or not
    "m3_dot_k_not_multiple_split2": (3, 150, 20, 64, False, True, F32, 2, cfg(16, 16, 32)),
    "m3_dot_tile_spans_blocks": (3, 256, 36, 32, True, False, F32, 1, cfg(16, 16, 128)),
    "m5_auto_zero_points": (5, 200, 33, 32, False, True, F32, None, None),
    "m16_dot_fp16": (16, 256, 48, 128, True, True, F16, 1, cfg(16, 32, 64)),
    "m16_dot_split4": (16, 384, 24, 32, True, False, F32, 4, cfg(16, 16, 32)),
    # M > 16: the prefill tiles (several row tiles)
    "m64_prefill": (64, 160, 24, 32, False, False, F32, 1, cfg(32, 16, 32)),
    "m64_prefill_fp16_tile_spans_blocks": (64, 128, 50, 32, True, True, F16, 1, cfg(16, 32, 64)),
    "m37_auto": (37, 160, 24, 64, False, False, F16, None, None),
}
CASES = {f"int{bits}_{name}": (shape[0], shape[1], shape[2], bits, *shape[3:]) for name, shape in SHAPES.items() for bits in (4, 8)}
if DEVICE.type == "cuda":  # compiled only: the interpreter's bf16 dot is wrong; the GPU's autotuned configs too
    BF16 = torch.bfloat16
    TOL[BF16] = dict(atol=5e-2, rtol=5e-2)
    CASES.update({
        "int4_m1_bf16_gpu": (1, 2048, 2560, 4, 32, True, False, BF16, None, None),
        "int4_m8_bf16_zero_points": (8, 2048, 512, 4, 64, False, True, BF16, None, None),
        "int8_m1_fp16_gpu": (1, 5632, 2048, 8, 128, True, False, F16, None, None),
        "int4_m1_narrow_split_gpu": (1, 2048, 256, 4, 32, True, True, F16, None, None),
        "int4_tiled_m256_fp16": (256, 2048, 1024, 4, 128, True, True, F16, None, None),
        "int8_m16_fp16_gpu": (16, 2048, 2048, 8, 64, True, False, F16, None, None),
    })
    for i, config in enumerate(GEMV_CONFIGS + SMALL_M_CONFIGS + PREFILL_CONFIGS):
        m = 1 if config["BLOCK_M"] == 1 else 8 if config in SMALL_M_CONFIGS else 100
        for bits in (4, 8):
            CASES[f"int{bits}_gpu_config{i}_m{m}"] = (m, 2048 - 96, 320, bits, 32, bits == 4, True, F16, None, config)


def test_triton_runs_the_kernel() -> None:
    assert _triton.HAS_TRITON and (_triton.INTERPRET or DEVICE.type == "cuda")


@pytest.mark.parametrize("name", sorted(CASES))
def test_wq_linear(name: str) -> None:
    m, k, n, bits, block, symmetric, with_bias, dtype, split_k, config = CASES[name]
    q, packed, scales, zeros = quantized(k, n, bits, block, symmetric, dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    bias = torch.randn(n, generator=gen).to(DEVICE, dtype) if with_bias else None
    got = wq_linear_triton(x, packed, scales, zeros, bias, bits, block, k, split_k=split_k, config=config)
    want = wq_linear_reference(x, packed, scales, zeros, bias, bits, block, k)
    assert got.shape == (m, n) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    # the reference means what numpy's dequantization means
    w = torch.from_numpy(blockwise.dequantize(q)).to(DEVICE, F32)
    exact = x.float() @ w + (bias.float() if bias is not None else 0)
    torch.testing.assert_close(want.float(), exact, **TOL[dtype])


def test_split_k_is_deterministic_and_resets_its_locks() -> None:
    """The last program of a tile sums the partials in split order: the same bits every call
    (the counter resets itself, so a second launch with the same lock buffer works too)."""
    _, packed, scales, _ = quantized(512, 40, 4, 32, True, F32, seed=5)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    first = wq_linear_triton(x, packed, scales, None, None, 4, 32, 512, split_k=4, config=cfg(1, 16, 64))
    again = wq_linear_triton(x, packed, scales, None, None, 4, 32, 512, split_k=4, config=cfg(1, 16, 64))
    unsplit = wq_linear_triton(x, packed, scales, None, None, 4, 32, 512, split_k=1, config=cfg(1, 16, 64))
    assert torch.equal(first, again)
    torch.testing.assert_close(first, unsplit, atol=1e-5, rtol=1e-5)


def test_split_for_splits_narrow_decode_shapes_only() -> None:
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count if DEVICE.type == "cuda" else 4
    assert split_for(1, 16 * sms, 4096, DEVICE) == 1  # enough column tiles
    assert split_for(64, 16, 4096, DEVICE) == 1  # prefill never splits
    assert split_for(1, 16, 256, DEVICE) == 1  # too little K to share
    assert 1 < split_for(1, 16, 4096, DEVICE) <= 8


def test_wq_linear_keeps_leading_dims_and_strided_x() -> None:
    _, packed, scales, zeros = quantized(64, 24, 4, 32, True, F32, seed=3)
    x = torch.randn(2, 64, 3, generator=torch.Generator().manual_seed(4)).to(DEVICE).transpose(1, 2)  # [2, 3, 64], not contiguous
    got = wq_linear_triton(x, packed, scales, zeros, None, 4, 32, 64)
    assert got.shape == (2, 3, 24)
    torch.testing.assert_close(got, wq_linear_reference(x, packed, scales, zeros, None, 4, 32, 64), atol=1e-4, rtol=1e-4)


def test_packed_weight_not_word_aligned_is_copied() -> None:
    """A packed tensor viewed at an odd byte offset: the kernel reads words, the launcher copies."""
    _, packed, scales, _ = quantized(64, 24, 4, 32, True, F32, seed=7)
    storage = torch.zeros(packed.numel() + 1, dtype=torch.uint8, device=DEVICE)
    storage[1:] = packed.reshape(-1)
    shifted = storage[1:].view(packed.shape)
    assert shifted.storage_offset() % 4
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    torch.testing.assert_close(wq_linear_triton(x, shifted, scales, None, None, 4, 32, 64),
                               wq_linear_reference(x, packed, scales, None, None, 4, 32, 64), atol=1e-4, rtol=1e-4)
