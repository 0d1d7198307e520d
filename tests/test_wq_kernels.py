"""graphopt::wq_linear: the Triton kernel in Triton's interpreter (a child pytest, since
TRITON_INTERPRET must be set before triton is imported; cases in tests/wq_interpreter_cases.py),
and the registered op's CPU reference and fake kernel in this process."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import triton  # noqa: F401  (the test extra installs it: a missing triton fails here, never skips)

import graphopt.kernels  # noqa: F401  (registers torch.ops.graphopt.*)
from graphopt.quant import blockwise

REPO = Path(__file__).resolve().parent.parent


def test_wq_kernel_cases_pass_in_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(REPO / "tests" / "wq_interpreter_cases.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_registered_op_runs_the_reference_on_cpu_and_traces_with_its_fake() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((96, 20)).astype(np.float32)
    q = blockwise.quantize(weight, 4, 32)
    packed, scales = torch.from_numpy(blockwise.pack(q.q, 4)), torch.from_numpy(q.scales)
    x = torch.randn(3, 96)
    got = torch.ops.graphopt.wq_linear(x, packed, scales, None, None, 4, 32, 96)
    torch.testing.assert_close(got, x @ torch.from_numpy(blockwise.dequantize(q)), atol=1e-4, rtol=1e-4)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.ops.graphopt.wq_linear(torch.empty(5, 7, 96), packed, scales, None, None, 4, 32, 96)
    assert fake.shape == (5, 7, 20)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 128])
def test_the_kernels_word_reading_round_trips_the_packing(bits: int, block: int) -> None:
    """pack (MatMulNBits' byte layout) -> read as int32 words the way the kernel does -> the
    quantized values, in order, for every block size (each row is a whole number of words)."""
    from graphopt.kernels.wq_matmul import values_from_words

    rng = np.random.default_rng(bits * block)
    q = rng.integers(0, 1 << bits, size=(12, 3, block), dtype=np.uint8)
    packed = torch.from_numpy(blockwise.pack(q, bits))
    assert packed.shape[-1] * 3 % 4 == 0
    assert np.array_equal(values_from_words(packed, bits).numpy(), q)
    assert np.array_equal(blockwise.unpack(packed.numpy(), bits), q)


def test_word_reading_sees_a_swapped_nibble_order() -> None:
    """Negative case: high-nibble-first bytes (tinygemm's CUDA input) do not read back as q."""
    from graphopt.kernels.wq_matmul import values_from_words

    q = np.arange(32, dtype=np.uint8).reshape(1, 1, 32) % 16
    swapped = torch.from_numpy(((q[..., 0::2] << 4) | q[..., 1::2]).astype(np.uint8))
    assert not np.array_equal(values_from_words(swapped, 4).numpy(), q)


@pytest.mark.parametrize("bits", [4, 8])
def test_the_gemv_compiles_for_sm90_with_16_byte_weight_loads_and_no_spills(bits: int) -> None:
    """Offline (Triton's compiler and ptxas, no GPU): the K loop is pipelined with 16-byte
    copies of the packed words (a mask or an offset Triton cannot prove 16-byte aligned would
    narrow them), and nothing spills to local memory."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from wq_offline_compile import compile_config

    from graphopt.kernels.wq_matmul import GEMV_CONFIGS

    config = next(c for c in GEMV_CONFIGS if (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]) == (1, 16, 512) and c["num_warps"] == 4)
    result = compile_config(config, bits, 32, 1, 90)
    assert result["local_bytes"] == 0 and result["weight_copy_bytes"] == 16, result


@pytest.mark.parametrize("bits", [4, 8])
def test_the_decode_gemv_compiles_for_sm90_without_spills_flush_to_zero_or_narrow_copies(bits: int) -> None:
    """Offline: wq_gemv's kernel at one row and at 16 (a config of each list): 16-byte weight copies,
    nothing spilled, and no .ftz arithmetic in the PTX (its products are subnormals: flushed, they
    would be zeros). The K loop's instructions per weight value are bounded (~3 at one row: one mask
    and one FFMA a value, the rest per word or per x value; a regression to an int->float conversion
    or a layout shuffle per value shows here)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from wq_offline_compile import compile_decode_config

    from graphopt.kernels.wq_gemv import DECODE_CONFIGS, ONE_ROW_CONFIGS

    one_row = next(c for c in ONE_ROW_CONFIGS if (c["BLOCK_N"], c["K_WORDS"], c["num_warps"]) == (64, 64, 4))
    result = compile_decode_config(one_row, bits, 32, 1, 90)
    assert result["local_bytes"] == 0 and result["weight_copy_bytes"] == 16 and not result["flushes_subnormals"], result
    assert result["loop_per_value"] < (3.4 if bits == 4 else 4.5), result
    rows16 = compile_decode_config(DECODE_CONFIGS[0], bits, 64, 16, 90, zeros=True)
    assert rows16["local_bytes"] == 0 and not rows16["flushes_subnormals"], rows16
