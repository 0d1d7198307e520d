"""`--precision fp8` on the ONNX path: one `error:` line naming what the target lacks, exit 2
(graphopt/quant/fp8_onnx.py): onnxruntime has no FP8 MatMul/Gemm on any provider; the CUDA
provider's com.microsoft.GemmFloat8 scales whole tensors, not rows, and graphopt does not emit it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_model, run_cli
from onnx import TensorProto, helper

from graphopt.errors import GraphoptError
from graphopt.quant.fp8_onnx import fp8_refusal


def _matmul_model(path: Path) -> Path:
    import numpy as np
    from onnx import numpy_helper

    weight = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], initializers=[weight])
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize(("target", "needle"), [
    ("ort-cuda", "GemmFloat8"),
    ("ort-cpu", "no FP8 GEMM kernel"),
    ("onnx", "standard ONNX has no FP8 MatMul"),
])
def test_cli_refuses_fp8_with_one_line_and_exit_2(tmp_path: Path, target: str, needle: str) -> None:
    model, out = _matmul_model(tmp_path / "m.onnx"), tmp_path / "o.onnx"
    result = run_cli("optimize", model, "-o", out, "--precision", "fp8", "--target", target, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: fp8 is not supported on target {target}: "), result.stderr
    assert needle in lines[0] and 'options={"precision": "fp8"}' in lines[0]
    assert not out.exists()


def test_api_refuses_fp8_before_any_work() -> None:
    from graphopt.api import optimize

    with pytest.raises(GraphoptError, match="fp8 is not supported on target ort-cuda: .*scales whole tensors, not rows"):
        optimize("does-not-exist.onnx", target="ort-cuda", precision="FP8")


def test_the_reason_comes_from_the_kernel_table() -> None:
    # The shipped CUDA table has GemmFloat8 with float8e4m3fn and MatMul/Gemm without: the message says so.
    from graphopt.ops.targets import get_target

    table = get_target("ort-cuda").standard_kernels
    assert "tensor(float8e4m3fn)" in table[("com.microsoft", "GemmFloat8")]
    assert "tensor(float8e4m3fn)" not in table[("", "MatMul")]
    assert "no FP8 MatMul or Gemm kernel" in fp8_refusal("ort-cuda")
