"""Range-aware --precision fp16 (graphopt/passes/precision.py, range_checked_plan): values
measured in float32 on calibration inputs keep the nodes that would overflow in float16,
and a float16 output that is not finite where float32's is makes the nodes responsible
stay float32 too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from rule_testing import TensorProto, helper, init, make_model

import graphopt
import graphopt.passes.precision_range as precision_range
from graphopt.errors import GraphoptError

F = TensorProto.FLOAT


def run(model: onnx.ModelProto | ir.Model, x: np.ndarray) -> np.ndarray:
    """Run on the CPU provider; float16 values rounded (and overflowing) after every node as
    on a GPU (`emulate_low_precision`): the CPU provider alone computes float16 regions in
    float32 and would hide the overflows these tests are about."""
    m = ir.serde.deserialize_model(model) if isinstance(model, onnx.ModelProto) else model
    proto = ir.serde.serialize_model(precision_range.emulate_low_precision(m))
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def fp16(model: onnx.ModelProto, **kwargs):
    return graphopt.optimize(model, target="onnx", precision="fp16", enable=[], **kwargs)


def scaled_square_normalized(scale: float = 1000.0) -> onnx.ModelProto:
    """(x*scale)^2 / sum((x*scale)^2): every intermediate overflows float16, the output is in [0, 1]."""
    return make_model(
        [
            helper.make_node("Mul", ["x", "scale"], ["big"], name="scale_up"),
            helper.make_node("Mul", ["big", "big"], ["sq"], name="square"),
            helper.make_node("ReduceSum", ["sq", "axes"], ["total"], keepdims=1, name="total"),
            helper.make_node("Div", ["sq", "total"], ["y"], name="normalize"),
        ],
        [helper.make_tensor_value_info("x", F, [2, 16])],
        [helper.make_tensor_value_info("y", F, [2, 16])],
        [init("scale", np.array(scale, np.float32)), init("axes", np.array([1], np.int64))],
        opset=17,
    )


def layer_norm_of_large_activations() -> onnx.ModelProto:
    """A decomposed LayerNorm over activations of a few hundred: the variance's squares overflow float16."""
    return make_model(
        [
            helper.make_node("Mul", ["x", "gain"], ["h"], name="amplify"),
            helper.make_node("ReduceMean", ["h"], ["mu"], axes=[-1], keepdims=1, name="mean"),
            helper.make_node("Sub", ["h", "mu"], ["d"], name="center"),
            helper.make_node("Mul", ["d", "d"], ["d2"], name="square"),
            helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], keepdims=1, name="variance"),
            helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
            helper.make_node("Sqrt", ["ve"], ["sd"], name="stddev"),
            helper.make_node("Div", ["d", "sd"], ["y"], name="normalize"),
        ],
        [helper.make_tensor_value_info("x", F, [4, 32])],
        [helper.make_tensor_value_info("y", F, [4, 32])],
        [init("gain", np.array(400.0, np.float32)), init("eps", np.array(1e-5, np.float32))],
        opset=17,
    )


def test_unchecked_fp16_really_breaks_these_models() -> None:
    # Without the range check the float16 models are wrong: not finite (the square), or all
    # zeros (the LayerNorm: x / inf). The tests below can fail.
    for model, shape in ((scaled_square_normalized(), (2, 16)), (layer_norm_of_large_activations(), (4, 32))):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        broken, _ = fp16(model, range_check=False)
        want, got = run(model, x), run(broken, x)
        assert np.isfinite(want).all()
        assert not np.isfinite(got).all() or not np.allclose(got, want, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("builder,shape,expected", [
    (scaled_square_normalized, (2, 16), {"square", "total", "normalize"}),
    (layer_norm_of_large_activations, (4, 32), {"square", "variance", "stddev"}),
])
def test_overflowing_nodes_stay_float32_and_the_model_is_finite(builder, shape, expected: set[str]) -> None:
    model = builder()
    converted, report = fp16(model)
    summary = report.precision_conversion
    kept = {k.node: k for k in summary.kept_for_range}
    assert expected <= set(kept), kept
    assert all(k.reason == "overflow" and k.max_abs > precision_range.FP16_SAFE_MAX for k in kept.values())
    assert summary.kept.get("range") == len([n for n in kept if n in {node.name for node in model.graph.node}])
    assert summary.nodes_converted > 0  # not everything was given up
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        want, got = run(model, x), run(converted, x)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))


def test_a_non_finite_fp16_output_keeps_the_nodes_that_made_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # With the float32 measurement blinded, only the float16 run can find the overflow.
    monkeypatch.setattr(precision_range, "FP16_SAFE_MAX", float("inf"))
    model = scaled_square_normalized()
    converted, report = fp16(model)
    reasons = {k.node: k.reason for k in report.precision_conversion.kept_for_range}
    assert reasons and set(reasons.values()) == {"non_finite"}
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    assert np.isfinite(run(converted, x)).all()
    np.testing.assert_allclose(run(converted, x), run(model, x), rtol=1e-2, atol=1e-3)


def test_user_calibration_data_finds_what_random_inputs_do_not(tmp_path: Path) -> None:
    model = scaled_square_normalized(scale=10.0)  # (10x)^2 fits float16 for standard-normal x, not for x = 100
    _, report = fp16(model)
    assert report.precision_conversion.kept_for_range == []
    data = tmp_path / "calibration.npz"
    np.savez(data, x=np.full((2, 16), 100.0, np.float32))
    converted, report = fp16(model, calibration_data=str(data))
    assert {"square", "normalize"} <= {k.node for k in report.precision_conversion.kept_for_range}
    assert str(data) in report.precision_conversion.calibration
    x = np.full((2, 16), 90.0, np.float32)
    assert np.isfinite(run(converted, x)).all()
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, nope=np.zeros((2, 16), np.float32))
    with pytest.raises(GraphoptError, match="model's inputs are x"):
        fp16(model, calibration_data=str(wrong))


def test_values_held_in_subnormals_stay_float32() -> None:
    model = make_model(
        [helper.make_node("Mul", ["x", "tiny"], ["t"], name="shrink"), helper.make_node("Mul", ["t", "big"], ["y"], name="grow")],
        [helper.make_tensor_value_info("x", F, [2, 8])],
        [helper.make_tensor_value_info("y", F, [2, 8])],
        [init("tiny", np.array(1e-7, np.float32)), init("big", np.array(1e6, np.float32))],
    )
    converted, report = fp16(model)
    kept = {k.node: k.reason for k in report.precision_conversion.kept_for_range}
    assert kept.get("shrink") == "underflow"
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(run(converted, x), run(model, x), rtol=1e-2, atol=1e-3)


def test_the_report_lists_the_kept_nodes_in_valid_json() -> None:
    import json

    jsonschema = pytest.importorskip("jsonschema")
    from graphopt.verify import verify_and_repair

    model = scaled_square_normalized()
    options = graphopt.OptimizeOptions(target="onnx", precision="fp16", enable=[])
    converted, report = graphopt.optimize(ir.serde.deserialize_model(model), options)
    verify_and_repair(lambda: ir.serde.deserialize_model(model), converted, report, options)
    document = report.to_dict()
    schema = json.loads((Path(graphopt.__file__).parent / "report" / "schema.json").read_text())
    jsonschema.validate(document, schema)
    kept = document["precision_conversion"]["kept_for_range"]
    assert {k["node"] for k in kept} >= {"square", "normalize"} and all(k["max_abs"] > 65504 / 2 for k in kept)
    assert document["verification"]["passed"] and document["verification"]["provider"] == "CPUExecutionProvider"


def test_a_skipped_range_check_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision_range, "RANGE_CHECK_MAX_BYTES", 0)
    _, report = fp16(scaled_square_normalized())
    assert "range check skipped" in report.precision_conversion.calibration
    assert any("range check skipped" in w for w in report.warnings)


@pytest.mark.parametrize(("name", "target"), [("bert-tiny-dynamo", "ort-cuda"), ("gpt2-tiny-dynamo", "onnx"), ("gpt2-tiny-torchscript", "ort-cuda")])
def test_exported_transformers_pass_the_range_check_untouched(name: str, target: str) -> None:
    # Both runs work on real exports (multi-output Splits, unnamed optional outputs of fused
    # ops), and a causal mask filled with float32's lowest value is a mask, not an overflow:
    # nothing is kept in float32 for its range.
    pytest.importorskip("torch")
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import models

    _, report = graphopt.optimize(onnx.load(models.ZOO[name]()), target=target, precision="fp16")
    summary = report.precision_conversion
    assert summary.calibration == "random inputs from the input specs"  # no "skipped", no "did not run"
    assert summary.kept_for_range == [] and "range" not in summary.kept
