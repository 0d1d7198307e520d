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

from graphopt.kernels import _triton, wq_gemv  # noqa: E402
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


def gcfg(bn: int, k_words: int, split: int = 1) -> dict[str, int]:
    """A launch config of the decode GEMV (graphopt.kernels.wq_gemv)."""
    return {"BLOCK_N": bn, "K_WORDS": k_words, "SPLIT_K": split, "STAGES": 1, "num_warps": 4, "num_stages": 1}


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
    # M <= 16, the decode GEMV (wq_gemv): a K tile of 1 or several blocks (int8 block 128 is 32 words: a tile of
    # 8 words still covers one block), K not a multiple of the block or the tile, zero points, split-K even and
    # uneven, rows 1 to 16 (a power of two and not), columns not a multiple of the tile
    "decode_m1_tile_spans_blocks": (1, 256, 40, 32, True, False, F32, None, gcfg(16, 16)),
    "decode_m1_zero_points_bias_k_not_multiple": (1, 200, 33, 32, False, True, F32, None, gcfg(8, 8)),
    "decode_m1_block64_fp16": (1, 320, 24, 64, True, True, F16, None, gcfg(16, 32)),
    "decode_m1_block128_zero_points_tile_in_block": (1, 500, 20, 128, False, False, F32, None, gcfg(8, 8)),
    "decode_m1_block16": (1, 96, 24, 16, True, True, F32, None, gcfg(8, 4)),
    "decode_m1_split3_uneven": (1, 700, 24, 32, True, True, F32, None, gcfg(8, 8, 3)),
    "decode_m1_split2_zero_points_fp16": (1, 512, 40, 64, False, False, F16, None, gcfg(16, 16, 2)),
    "decode_m3_zero_points_bias": (3, 200, 33, 32, False, True, F32, None, gcfg(16, 8)),
    "decode_m5_split4_block128": (5, 450, 20, 128, True, True, F32, None, gcfg(8, 16, 4)),
    "decode_m8_fp16_block64": (8, 256, 48, 64, True, False, F16, None, gcfg(16, 16)),
    "decode_m16_zero_points_fp16": (16, 160, 24, 32, False, True, F16, None, gcfg(8, 8)),
    "decode_m16_split2": (16, 384, 24, 32, True, False, F32, None, gcfg(8, 16, 2)),
    "decode_m7_auto": (7, 192, 40, 32, False, True, F32, None, None),
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
        "int4_decode_m1_bf16_block128_zero_points": (1, 2048, 11264, 4, 128, False, True, BF16, None, None),
        "int8_decode_m4_bf16_block32": (4, 5632, 2048, 8, 32, True, False, BF16, None, None),
        "int4_decode_m16_fp16_down": (16, 5632, 2048, 4, 32, True, False, F16, None, None),
    })
    for i, config in enumerate(wq_gemv.configs_for(1, True)):
        for bits in (4, 8):
            CASES[f"int{bits}_gpu_decode_config{i}_m1"] = (1, 2048 - 96, 320, bits, 32, bits == 4, True, F16, None, config)
    for i, config in enumerate(wq_gemv.configs_for(2, False)):
        CASES[f"int4_gpu_decode_config{i}_m12"] = (12, 2048 - 96, 320, 4, 64, False, True, F16, None, config)
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


def test_small_m_runs_the_decode_gemv_and_tiled_forces_the_old_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to GEMV_MAX_M rows wq_linear launches wq_gemv's kernel; kernel="tiled" (and more rows) the tiled one."""
    _, packed, scales, _ = quantized(64, 24, 4, 32, True, F32, seed=9)
    calls: list[int] = []
    real = wq_gemv.wq_gemv_triton

    def counting(x, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(x.reshape(-1, x.shape[-1]).shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(wq_gemv, "wq_gemv_triton", counting)
    from graphopt.kernels import wq_matmul

    monkeypatch.setattr(wq_matmul, "_decode_kernel", lambda *args: "gemv")  # the routing, not the measured choice (below)
    for m in (1, wq_gemv.GEMV_MAX_M, wq_gemv.GEMV_MAX_M + 1):
        x = torch.randn(m, 64, generator=torch.Generator().manual_seed(m)).to(DEVICE)
        want = wq_linear_reference(x, packed, scales, None, None, 4, 32, 64)
        torch.testing.assert_close(wq_linear_triton(x, packed, scales, None, None, 4, 32, 64), want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(wq_linear_triton(x, packed, scales, None, None, 4, 32, 64, kernel="tiled"), want, atol=1e-4, rtol=1e-4)
    assert calls == [1, wq_gemv.GEMV_MAX_M]
    with pytest.raises(ValueError, match="1 to 16 rows"):
        wq_gemv.wq_gemv_triton(torch.zeros(17, 64, device=DEVICE), packed, scales, None, None, 4, 32, 64)


def test_a_decode_shape_runs_the_kernel_measured_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to GEMV_MAX_M rows the kernel is a measured verdict per shape (DECODE_KERNEL): the GEMV
    where it was faster, the tiled kernel where that was; off CUDA (nothing to time) the GEMV, not remembered."""
    from graphopt.kernels import wq_matmul

    _, packed, scales, _ = quantized(64, 24, 4, 32, True, F32, seed=12)
    calls: list[str] = []
    real = wq_gemv.wq_gemv_triton

    def counting(x, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("gemv")
        return real(x, *args, **kwargs)

    monkeypatch.setattr(wq_gemv, "wq_gemv_triton", counting)
    monkeypatch.setattr(wq_matmul, "DECODE_KERNEL", {})
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    want = wq_linear_reference(x, packed, scales, None, None, 4, 32, 64)
    key = (2, 24, 64, 4, 32, False, False, x.dtype, str(x.device))
    wq_matmul.DECODE_KERNEL[key] = "tiled"
    torch.testing.assert_close(wq_linear_triton(x, packed, scales, None, None, 4, 32, 64), want, atol=1e-4, rtol=1e-4)
    assert calls == []
    wq_matmul.DECODE_KERNEL[key] = "gemv"
    torch.testing.assert_close(wq_linear_triton(x, packed, scales, None, None, 4, 32, 64), want, atol=1e-4, rtol=1e-4)
    assert calls == ["gemv"]
    if DEVICE.type != "cuda":
        wq_matmul.DECODE_KERNEL.clear()
        wq_linear_triton(x, packed, scales, None, None, 4, 32, 64)
        assert calls == ["gemv", "gemv"] and wq_matmul.DECODE_KERNEL == {}
    else:  # timed once, both kernels run, the verdict remembered
        wq_matmul.DECODE_KERNEL.clear()
        wq_linear_triton(x, packed, scales, None, None, 4, 32, 64)
        assert wq_matmul.DECODE_KERNEL[key] in ("gemv", "tiled")


def test_decode_gemv_split_is_deterministic_and_resets_its_counters() -> None:
    _, packed, scales, zeros = quantized(768, 40, 4, 32, False, F32, seed=10)
    x = torch.randn(2, 768, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    split = [wq_linear_triton(x, packed, scales, zeros, None, 4, 32, 768, config=gcfg(16, 8, 4)) for _ in range(2)]
    unsplit = wq_linear_triton(x, packed, scales, zeros, None, 4, 32, 768, config=gcfg(16, 8, 1))
    assert torch.equal(split[0], split[1])
    torch.testing.assert_close(split[0], unsplit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("magnitude", [1e-4, 1.0, 3e4])
@pytest.mark.parametrize("bits", [4, 8])
def test_decode_gemv_is_exact_over_the_activation_range(magnitude: float, bits: int) -> None:
    """The subnormal products carry 2**-64 (wq_gemv's docstring): fp16 activations from 1e-4 to 3e4
    (and fp32 ones) match the fp32 reference to fp32 rounding, not just to a loose tolerance."""
    _, packed, scales, zeros = quantized(256, 24, bits, 32, False, F32, seed=12)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(13)).to(DEVICE) * magnitude
    got = wq_linear_triton(x, packed, scales, zeros, None, bits, 32, 256, config=gcfg(8, 8))
    want = wq_linear_reference(x.double(), packed, scales.double(), zeros, None, bits, 32, 256)
    torch.testing.assert_close(got.double(), want, atol=1e-5 * magnitude, rtol=1e-5)


def test_decode_gemv_remembers_the_autotuners_pick_and_launches_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the autotuner ran on real tensors, the shape's pick is in CHOSEN and later calls launch it
    directly (what inductor's trace of the op then sees: one config, no counter buffer unless it splits)."""
    _, packed, scales, _ = quantized(160, 36, 4, 32, True, F32, seed=14)
    x = torch.randn(3, 160, generator=torch.Generator().manual_seed(15)).to(DEVICE)
    key = (3, 36, 160, 4, 32, False, False, F32, str(DEVICE))
    wq_gemv.CHOSEN.pop(key, None)
    first = wq_linear_triton(x, packed, scales, None, None, 4, 32, 160)
    picked = wq_gemv.CHOSEN[key]
    assert {"BLOCK_N", "K_WORDS", "SPLIT_K", "num_warps", "num_stages"} <= set(picked)
    assert picked in [dict(c) for c in wq_gemv.configs_for(3, True)] or _triton.INTERPRET
    monkeypatch.setattr(wq_gemv, "_TUNED", {})  # the next call must not reach an autotuner
    monkeypatch.setitem(wq_gemv.CHOSEN, key, {**picked, "BLOCK_N": 4, "SPLIT_K": 2})  # a config no autotuner offers
    again = wq_linear_triton(x, packed, scales, None, None, 4, 32, 160)
    torch.testing.assert_close(again, first, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first, wq_linear_reference(x, packed, scales, None, None, 4, 32, 160), atol=1e-4, rtol=1e-4)
