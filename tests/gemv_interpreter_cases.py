"""graphopt::gemv_linear's Triton kernel in Triton's interpreter (or compiled, on a GPU).

Not collected by the normal run: tests/test_gemv_kernel.py runs this file in a child pytest
with TRITON_INTERPRET=1 (Triton reads it at import). On a GPU machine:

    GRAPHOPT_KERNELS_DEVICE=cuda python -m pytest -q tests/gemv_interpreter_cases.py

Each case names the path it covers: the sum path with its 3-D accumulator (reduced after the
loop) or with a sum per K tile, the tensor-core dot path, K not a multiple of the K tile, N not
a multiple of the N tile, M not a power of two, split-K with its reduce kernel, bias or not,
fp16 and bf16 (bf16 only on the sum path here: the interpreter's bf16 dot multiplies raw bits,
tests/kernels_interpreter_cases.py), and the op's own choice (the autotuner: one config under
the interpreter, all of them on a GPU).
"""

import os

import pytest
import torch

DEVICE = torch.device(os.environ.get("GRAPHOPT_KERNELS_DEVICE", "cpu"))
if os.environ.get("TRITON_INTERPRET") != "1" and DEVICE.type != "cuda":
    raise RuntimeError("run this file with TRITON_INTERPRET=1 (tests/test_gemv_kernel.py does) or GRAPHOPT_KERNELS_DEVICE=cuda")

from graphopt.kernels import _triton  # noqa: E402
from graphopt.kernels.gemv import CONFIGS, gemv_linear_reference, gemv_linear_triton, split_for  # noqa: E402

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
# fp32 accumulation against torch's (fp32 for these dtypes on CPU); one output rounding: a few ulps of fp16 / bf16
TOL = {F32: dict(atol=1e-4, rtol=1e-4), F16: dict(atol=2e-3, rtol=2e-3), BF16: dict(atol=2e-2, rtol=2e-2)}


def cfg(dot: int, bn: int, bk: int) -> dict[str, int]:
    return {"USE_DOT": dot, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": 1, "num_warps": 4, "num_stages": 1}


# name: (M, N, K, bias, dtype, split_k, config)
CASES = {
    # M = 1, the sum path: 3-D accumulator (small tiles) or one sum per K tile (BLOCK_N * BLOCK_K > 8192)
    "m1_late_sum_fp16": (1, 40, 256, False, F16, 1, cfg(0, 4, 64)),
    "m1_late_sum_bias_bf16": (1, 40, 256, True, BF16, 1, cfg(0, 4, 64)),
    "m1_k_ragged_n_ragged_fp16": (1, 37, 200, True, F16, 1, cfg(0, 8, 64)),
    "m1_one_row_per_program_bf16": (1, 9, 300, False, BF16, 1, cfg(0, 1, 128)),
    "m1_sum_per_tile_fp16": (1, 24, 1100, True, F16, 1, cfg(0, 16, 1024)),
    "m1_k_smaller_than_tile_fp16": (1, 20, 48, True, F16, 1, cfg(0, 4, 256)),
    "m1_split3_bias_fp16": (1, 40, 512, True, F16, 3, cfg(0, 4, 64)),
    "m1_split4_ragged_bf16": (1, 21, 450, True, BF16, 4, cfg(0, 2, 64)),
    "m1_auto_fp16": (1, 48, 320, True, F16, None, None),
    "m1_auto_bf16": (1, 48, 320, False, BF16, None, None),
    # M = 2..16: the sum path with BLOCK_M the next power of two of M, and the dot path (16 rows)
    "m3_sum_fp16": (3, 40, 160, True, F16, 1, cfg(0, 2, 64)),
    "m3_sum_bf16_split2": (3, 40, 160, False, BF16, 2, cfg(0, 2, 32)),
    "m4_sum_per_tile_bf16": (4, 20, 600, True, BF16, 1, cfg(0, 8, 512)),
    "m5_dot_ragged_fp16": (5, 37, 200, True, F16, 1, cfg(1, 16, 64)),
    "m8_dot_split3_fp16": (8, 24, 384, False, F16, 3, cfg(1, 16, 32)),
    "m16_dot_fp16": (16, 48, 256, True, F16, 1, cfg(1, 32, 64)),
    "m16_sum_bf16": (16, 20, 96, True, BF16, 1, cfg(0, 1, 32)),
    "m7_auto_fp16": (7, 33, 200, True, F16, None, None),
    "m12_auto_bf16": (12, 40, 128, False, BF16, None, None),
    # M > 16: several row tiles
    "m40_dot_fp16": (40, 24, 96, True, F16, 1, cfg(1, 16, 32)),
    "m37_auto_fp16": (37, 24, 160, False, F16, None, None),
    # fp32 (not offered by the graph path, exact here)
    "m2_sum_fp32": (2, 24, 200, True, F32, 1, cfg(0, 4, 64)),
}
if DEVICE.type == "cuda":  # compiled only: bf16 on the dot path, TinyLlama's shapes, every GPU config
    CASES.update({
        "m8_dot_bf16_gpu": (8, 2048, 2048, True, BF16, 1, cfg(1, 32, 256)),
        "m1_qkv_fp16_gpu": (1, 2560, 2048, False, F16, None, None),
        "m1_down_bf16_gpu": (1, 2048, 5632, False, BF16, None, None),
        "m16_gate_up_fp16_gpu": (16, 11264, 2048, False, F16, None, None),
        "m4_narrow_split_gpu": (4, 256, 2048, True, F16, None, None),
    })
    for regime, configs in CONFIGS.items():
        for i, config in enumerate(configs):
            m = {"m1": 1, "small": 8, "many": 64}[regime]
            CASES[f"gpu_{regime}_config{i}"] = (m, 320, 2048 - 96, True, F16, 1, config)


def test_triton_runs_the_kernel() -> None:
    assert _triton.HAS_TRITON and (_triton.INTERPRET or DEVICE.type == "cuda")


@pytest.mark.parametrize("name", sorted(CASES))
def test_gemv_linear(name: str) -> None:
    m, n, k, with_bias, dtype, split_k, config = CASES[name]
    gen = torch.Generator().manual_seed(m * 1000 + n)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, dtype)
    bias = torch.randn(n, generator=gen).to(DEVICE, dtype) if with_bias else None
    got = gemv_linear_triton(x, weight, bias, split_k=split_k, config=config)
    assert got.shape == (m, n) and got.dtype == dtype
    exact = x.double() @ weight.double().t() + (bias.double() if bias is not None else 0)
    torch.testing.assert_close(got.double(), exact, **TOL[dtype])
    torch.testing.assert_close(got.float(), gemv_linear_reference(x, weight, bias).float(), **TOL[dtype])


def test_split_k_is_deterministic_and_matches_unsplit() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 512, generator=gen).to(DEVICE, F16)
    weight = (torch.randn(24, 512, generator=gen) / 16).to(DEVICE, F16)
    first = gemv_linear_triton(x, weight, None, split_k=4, config=cfg(0, 4, 64))
    again = gemv_linear_triton(x, weight, None, split_k=4, config=cfg(0, 4, 64))
    unsplit = gemv_linear_triton(x, weight, None, split_k=1, config=cfg(0, 4, 64))
    assert torch.equal(first, again)
    torch.testing.assert_close(first.float(), unsplit.float(), atol=2e-3, rtol=2e-3)


def test_split_for_splits_narrow_shapes_only() -> None:
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count if DEVICE.type == "cuda" else 4
    assert split_for(1, 8 * sms, 4096, DEVICE) == 1  # enough programs
    assert split_for(64, 16, 4096, DEVICE) == 1  # many rows never split
    assert split_for(1, 16, 256, DEVICE) == 1  # too little K to share
    assert 1 < split_for(1, 16, 4096, DEVICE) <= 8


def test_leading_dims_strided_x_and_transposed_weight() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 64, 3, generator=gen).to(DEVICE, F16).transpose(1, 2)  # [2, 3, 64], K not contiguous
    weight_t = torch.randn(64, 24, generator=gen).to(DEVICE, F16) / 8  # read as its transpose: [24, 64] strided
    got = gemv_linear_triton(x, weight_t.t(), None, config=cfg(0, 4, 32))
    assert got.shape == (2, 3, 24)
    torch.testing.assert_close(got.float(), gemv_linear_reference(x, weight_t.t(), None).float(), **TOL[F16])


def test_empty_k_gives_the_bias() -> None:
    x = torch.empty(1, 0, device=DEVICE, dtype=F16)
    bias = torch.arange(5, device=DEVICE, dtype=F16)
    got = gemv_linear_triton(x, torch.empty(5, 0, device=DEVICE, dtype=F16), bias)
    assert torch.equal(got, bias[None, :])
