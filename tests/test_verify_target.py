"""--verify on the target (graphopt/verify.py): where the check ran, what it does not prove
when it ran elsewhere, float16 as a GPU stores it, and non-finite outputs failing in any
precision."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from rule_testing import TensorProto, helper, init, make_model, rand

import graphopt
from graphopt import verify as verify_module
from graphopt.verify import compare_outputs, providers_for, verify, verify_and_repair

sys.path.insert(0, str(Path(__file__).parent))
from test_precision_range import scaled_square_normalized  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def conv_model() -> onnx.ModelProto:
    inits = [init("w", rand(8, 3, 3, 3) * 0.3), init("b", rand(8)), init("w2", rand(8, 8, 3, 3) * 0.3), init("b2", rand(8))]
    return make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Conv", ["r", "w2", "b2"], ["y"], pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )


def test_ort_cuda_checked_on_the_cpu_says_what_that_does_not_prove() -> None:
    assert "CUDAExecutionProvider" not in ort.get_available_providers()
    original = conv_model()
    options = graphopt.OptimizeOptions(target="ort-cuda", layout="nhwc")
    optimized, report = graphopt.optimize(ir.serde.deserialize_model(original), options)
    assert any(n.op_type == "NhwcConv" for n in optimized.graph)
    # NhwcConv has no CPU kernel: it is checked through its standard-op emulation.
    _, result = verify_and_repair(lambda: ir.serde.deserialize_model(original), optimized, report, options)
    assert result.passed and result.provider == "CPUExecutionProvider"
    assert "(on CPUExecutionProvider)" in result.message
    assert "not on the target's CUDAExecutionProvider (absent here)" in result.caveat
    assert "does not prove" in result.caveat and "emulation" in result.caveat
    plain = verify(original, ir.serde.serialize_model(optimized), target="ort-cuda")
    assert plain.passed and plain.caveat == result.caveat


def test_a_target_checked_on_its_own_provider_has_no_caveat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    providers = providers_for("ort-cuda")
    assert providers[0][0] == "CUDAExecutionProvider"
    prepare, caveat = verify_module._stand_ins("ort-cuda", None, providers)
    assert prepare is None and caveat == ""
    assert verify_module._provider_name(providers) == "CUDAExecutionProvider"
    _, caveat = verify_module._stand_ins("ort-cpu", None, providers_for("ort-cpu"))
    assert caveat == ""


def test_cli_prints_where_verification_ran(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(conv_model(), model)
    out = subprocess.run(
        [sys.executable, "-m", "graphopt", "optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", "ort-cuda", "--verify"],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    assert "on CPUExecutionProvider" in out.stdout and "verification caveat" in out.stdout


def test_a_non_finite_output_fails_verification_in_any_precision() -> None:
    want = {"y": np.array([1.0, 2.0, np.nan], np.float32)}
    _, problems = compare_outputs(want, {"y": np.array([1.0, np.inf, np.nan], np.float32)})
    assert problems == ["output 'y' is not finite where the original's is: 1 of 3 elements NaN or infinity"]
    _, problems = compare_outputs(want, {"y": np.array([1.0, 2.0, np.nan], np.float32)})
    assert problems == []
    # The loosest precision tolerance does not excuse it either.
    _, problems = compare_outputs(want, {"y": np.array([np.nan, 2.0, np.nan], np.float32)}, floor=verify_module.PRECISION_TOLERANCES["bf16"])
    assert problems and "not finite" in problems[0]


def test_fp16_overflow_is_caught_on_the_cpu() -> None:
    # Issue 14: fp16 made every output NaN on the GPU and --verify, run on the CPU provider,
    # passed. The CPU provider computes float16 regions in float32; verification rounds every
    # op's result to float16 as the GPU stores it, and the overflow shows.
    original = scaled_square_normalized()
    broken, _ = graphopt.optimize(original, target="onnx", precision="fp16", enable=[], range_check=False)
    raw = ort.InferenceSession(broken.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    assert np.isfinite(raw.run(None, {"x": x})[0]).all()  # the CPU provider alone hides it
    result = verify(original, broken, target="onnx", precision="fp16")
    assert not result.passed and "is not finite where the original's is" in result.message
    fixed, _ = graphopt.optimize(original, target="onnx", precision="fp16", enable=[])
    assert verify(original, fixed, target="onnx", precision="fp16").passed
