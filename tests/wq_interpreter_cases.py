"""graphopt::wq_linear's Triton kernel in Triton's interpreter (or compiled, on a GPU).

Not collected by the normal run: tests/test_wq_kernels.py runs this file in a child pytest
with TRITON_INTERPRET=1 (Triton reads it at import). On a GPU machine:

    GRAPHOPT_KERNELS_DEVICE=cuda python -m pytest -q tests/wq_interpreter_cases.py

Each case quantizes a random weight with graphopt.quant.blockwise (the numpy module both
front doors share), then checks the kernel against the reference (dequantize with torch,
then matmul) and the reference against numpy's dequantized weight. bf16 is left to the GPU
run: the interpreter's bf16 dot multiplies raw bits (tests/kernels_interpreter_cases.py).
"""

import os

import numpy as np
import pytest
import torch

DEVICE = torch.device(os.environ.get("GRAPHOPT_KERNELS_DEVICE", "cpu"))
if os.environ.get("TRITON_INTERPRET") != "1" and DEVICE.type != "cuda":
    raise RuntimeError("run this file with TRITON_INTERPRET=1 (tests/test_wq_kernels.py does) or GRAPHOPT_KERNELS_DEVICE=cuda")

from graphopt.kernels import _triton  # noqa: E402
from graphopt.kernels.wq_matmul import launch_config, wq_linear_reference, wq_linear_triton  # noqa: E402
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


# name: (M, K, N, bits, block, symmetric, bias, dtype, split_k)
CASES = {
    "int4_m1_split_k": (1, 256, 48, 4, 32, True, False, F32, 4),
    "int4_m1_auto_split_fp16": (1, 256, 40, 4, 64, True, True, F16, None),
    "int4_m5_k_not_multiple_of_block": (5, 200, 33, 4, 32, False, True, F32, 3),
    "int4_tiled_m40": (40, 128, 50, 4, 32, True, True, F32, 1),
    "int4_tiled_fp16_zero_points": (37, 160, 24, 4, 64, False, False, F16, 1),
    "int8_m1_split_k": (1, 192, 40, 8, 32, True, False, F32, 6),
    "int8_m3_k_not_multiple_of_block_zero_points": (3, 150, 20, 8, 64, False, True, F32, 2),
    "int8_tiled_m33_fp16": (33, 128, 36, 8, 128, True, True, F16, 1),
}
if DEVICE.type == "cuda":  # compiled only: the interpreter's bf16 dot is wrong; the GPU's launch shapes too
    BF16 = torch.bfloat16
    TOL[BF16] = dict(atol=5e-2, rtol=5e-2)
    CASES.update({
        "int4_m1_bf16_gpu_config": (1, 2048, 2560, 4, 32, True, False, BF16, None),
        "int4_m8_bf16_zero_points": (8, 2048, 512, 4, 64, False, True, BF16, None),
        "int8_m1_fp16_gpu_config": (1, 5632, 2048, 8, 128, True, False, F16, None),
        "int4_tiled_m256_fp16": (256, 2048, 1024, 4, 128, True, True, F16, None),
    })


def test_triton_runs_the_kernel() -> None:
    assert _triton.HAS_TRITON and (_triton.INTERPRET or DEVICE.type == "cuda")


@pytest.mark.parametrize("name", sorted(CASES))
def test_wq_linear(name: str) -> None:
    m, k, n, bits, block, symmetric, with_bias, dtype, split_k = CASES[name]
    q, packed, scales, zeros = quantized(k, n, bits, block, symmetric, dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    bias = torch.randn(n, generator=gen).to(DEVICE, dtype) if with_bias else None
    if split_k is not None:
        assert launch_config(m, n, k, block, bits, DEVICE, split_k)["SPLIT_K"] == split_k, "the case covers the split it names"
    got = wq_linear_triton(x, packed, scales, zeros, bias, bits, block, k, split_k=split_k)
    want = wq_linear_reference(x, packed, scales, zeros, bias, bits, block, k)
    assert got.shape == (m, n) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    # the reference means what numpy's dequantization means
    w = torch.from_numpy(blockwise.dequantize(q)).to(DEVICE, F32)
    exact = x.float() @ w + (bias.float() if bias is not None else 0)
    torch.testing.assert_close(want.float(), exact, **TOL[dtype])


def test_wq_linear_keeps_leading_dims_and_strided_x() -> None:
    _, packed, scales, zeros = quantized(64, 24, 4, 32, True, F32, seed=3)
    x = torch.randn(2, 64, 3, generator=torch.Generator().manual_seed(4)).to(DEVICE).transpose(1, 2)  # [2, 3, 64], not contiguous
    got = wq_linear_triton(x, packed, scales, zeros, None, 4, 32, 64)
    assert got.shape == (2, 3, 24)
    torch.testing.assert_close(got, wq_linear_reference(x, packed, scales, zeros, None, 4, 32, 64), atol=1e-4, rtol=1e-4)
