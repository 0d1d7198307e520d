"""graphopt.verify: comparing models in onnxruntime, and bisecting to the rewrite that broke one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from conftest import conv_bn_model, int_bool_model, relu_chain_model, symbolic_model
from onnx import helper

import graphopt
import graphopt.report.model
from graphopt.api import OptimizeOptions
from graphopt.verify import VerificationError, compare_outputs, make_inputs, parse_shape, verify, verify_and_repair


def _ir(model: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(model)


def _optimize(proto: onnx.ModelProto, options: OptimizeOptions):
    return graphopt.optimize(_ir(proto), options)


# ------------------------------------------------------------------ verify


def test_identical_models_verify() -> None:
    model = relu_chain_model()
    result = verify(_ir(model), _ir(model))
    assert result.passed, result.message
    assert result.runs == 2
    assert set(result.max_abs_diff) == {"y"} and result.max_abs_diff["y"] == 0.0
    assert result.input_shapes == {"x": [1, 64]}  # "batch" is batch-like: 1


def test_changed_model_fails_and_says_which_output() -> None:
    model = relu_chain_model()
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[4].op_type = "Abs"  # relu2 -> Abs: differs wherever s < 0
    result = verify(_ir(model), _ir(broken))
    assert not result.passed
    assert "'y'" in result.message and result.max_abs_diff["y"] > 0


def test_tiny_float_noise_is_within_tolerance() -> None:
    model = relu_chain_model()
    nudged = onnx.ModelProto()
    nudged.CopyFrom(model)
    c0 = onnx.numpy_helper.to_array(nudged.graph.initializer[0])  # (1, 64)
    nudged.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array((c0 * (1 + 1e-7)).astype(np.float32), "c0"))
    assert verify(_ir(model), _ir(nudged)).passed


def test_optimized_model_that_does_not_load_fails() -> None:
    model = relu_chain_model()
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[1].op_type = "NoSuchOp"
    result = verify(_ir(model), _ir(broken))
    assert not result.passed
    assert "does not load in onnxruntime" in result.message


def test_original_that_does_not_run_is_an_error() -> None:
    model = relu_chain_model()
    model.graph.node[1].op_type = "NoSuchOp"
    with pytest.raises(VerificationError, match="cannot load the original model"):
        verify(_ir(model), _ir(model))


def test_original_that_fails_on_the_inputs_is_an_error() -> None:
    from conftest import make_model

    # A Reshape to a fixed size only works for one input shape; the default does not fit.
    model = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])],
        [onnx.numpy_helper.from_array(np.array([3, 4], np.int64), "s")],
    )
    with pytest.raises(VerificationError, match="--input-shape") as caught:
        verify(_ir(model), _ir(model))
    assert "x=1,6" in str(caught.value)
    assert verify(_ir(model), _ir(model), input_shapes={"x": [2, 6]}).passed


def test_newer_ir_version_than_onnxruntime_supports() -> None:
    model = relu_chain_model()
    model.ir_version = 99  # onnxruntime refuses it; the verifier runs it as the newest it knows
    assert verify(_ir(model), _ir(model)).passed


def test_verify_accepts_paths_and_protos(tmp_path: Path) -> None:
    model = relu_chain_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert verify(path, model).passed


def test_int_and_bool_inputs_stay_in_range() -> None:
    model = int_bool_model(vocab=5)
    result = verify(_ir(model), _ir(model), input_shapes={"ids": [2, 7]})
    assert result.passed, result.message
    assert result.input_shapes == {"ids": [2, 7], "mask": [2, 7]}  # mask shares batch and seq
    feeds = make_inputs(_ir(model), result.input_shapes, seed=3)
    assert feeds["ids"].dtype == np.int64 and feeds["ids"].min() >= 0 and feeds["ids"].max() < 5
    assert feeds["mask"].dtype == np.bool_


def test_int_outputs_compare_exactly() -> None:
    want = {"t": np.array([1, 2, 3], np.int64)}
    assert compare_outputs(want, {"t": np.array([1, 2, 3], np.int64)})[1] == []
    diffs, problems = compare_outputs(want, {"t": np.array([1, 2, 4], np.int64)})
    assert problems and diffs["t"] == 1.0


def test_float_tolerances_depend_on_precision() -> None:
    want = np.linspace(-2, 2, 101)
    for dtype, ok_noise, bad_noise in ((np.float32, 1e-6, 1e-2), (np.float16, 5e-4, 1e-1)):
        w = want.astype(dtype)
        assert compare_outputs({"o": w}, {"o": (w + ok_noise).astype(dtype)})[1] == [], dtype
        assert compare_outputs({"o": w}, {"o": (w + bad_noise).astype(dtype)})[1] != [], dtype


def test_large_magnitudes_scale_the_absolute_tolerance() -> None:
    # Values near zero in an output of magnitude 1e4 carry rounding error of the big terms.
    want = np.array([1e4, -1e4, 1e-3], np.float32)
    got = np.array([1e4, -1e4, 1e-3 + 5e-3], np.float32)
    assert compare_outputs({"o": want}, {"o": got})[1] == []


def test_nan_in_the_same_places_is_equal() -> None:
    want = np.array([np.nan, 1.0, np.inf], np.float32)
    assert compare_outputs({"o": want}, {"o": want.copy()})[1] == []
    assert compare_outputs({"o": want}, {"o": np.array([0.0, 1.0, np.inf], np.float32)})[1] != []
    assert compare_outputs({"o": want}, {"o": np.array([np.nan, 1.0, -np.inf], np.float32)})[1] != []


def test_shape_and_type_mismatches_fail() -> None:
    want = {"o": np.zeros((2, 3), np.float32)}
    assert "shape" in compare_outputs(want, {"o": np.zeros((3, 2), np.float32)})[1][0]
    assert "type" in compare_outputs(want, {"o": np.zeros((2, 3), np.float64)})[1][0]
    assert "missing" in compare_outputs(want, {})[1][0]


def test_input_shape_pinning_resolves_shared_symbols() -> None:
    model = symbolic_model()
    result = verify(_ir(model), _ir(model), input_shapes={"a": [3, 5, 4]})
    assert result.passed
    assert result.input_shapes == {"a": [3, 5, 4], "b": [3, 5, 4]}


def test_default_shapes_are_shared_by_name() -> None:
    result = verify(_ir(symbolic_model()), _ir(symbolic_model()))
    assert result.input_shapes["a"] == result.input_shapes["b"] == [1, 16, 4]


@pytest.mark.parametrize(
    ("shapes", "message"),
    [({"nope": [1]}, "not a model input"), ({"a": [1, 2]}, "rank 3"), ({"a": [1, 2, 5]}, "fixed at 4")],
)
def test_bad_input_shapes_are_errors(shapes: dict[str, list[int]], message: str) -> None:
    with pytest.raises(VerificationError, match=message):
        verify(_ir(symbolic_model()), _ir(symbolic_model()), input_shapes=shapes)


@pytest.mark.parametrize(("text", "expected"), [("x=1,128", ("x", [1, 128])), ("a=b=3", ("a=b", [3])), ("s=", ("s", []))])
def test_parse_shape(text: str, expected: tuple[str, list[int]]) -> None:
    assert parse_shape(text) == expected


@pytest.mark.parametrize("text", ["x", "=1,2", "x=1,a", "x=-1"])
def test_parse_shape_rejects(text: str) -> None:
    with pytest.raises(VerificationError):
        parse_shape(text)


def test_external_data_models_are_run_from_a_folder(tmp_path: Path) -> None:
    model = conv_bn_model(with_miss=False)
    path = tmp_path / "ext.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving with external data moves the copy's weights out
    onnx.save(copy, str(path), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    from graphopt.ir.onnx_io import load_model

    loaded = load_model(path)
    assert any(isinstance(v.const_value, ir.ExternalTensor) for v in loaded.graph.initializers.values())
    assert verify(loaded, model).passed


# ------------------------------------------------------------------ repair


def test_correct_optimization_verifies() -> None:
    proto = conv_bn_model()
    options = OptimizeOptions()
    optimized, report = _optimize(proto, options)
    assert report.rules["FoldConvBatchNorm"].applications == 2
    model, result = verify_and_repair(lambda: _ir(proto), optimized, report, options)
    assert result.passed, result.message
    assert result.dropped == []
    assert report.verification is result
    assert model is optimized


def test_bisection_names_and_drops_the_wrong_rewrite(wrong_patterns: Path) -> None:
    proto = conv_bn_model(with_miss=False)
    options = OptimizeOptions(patterns=[str(wrong_patterns)])
    optimized, report = _optimize(proto, options)
    applied = [(r.rule, r.node) for r in report.applied]
    assert ("DropRelu", "relu1_out") in applied and len(applied) >= 3  # two correct folds besides

    model, result = verify_and_repair(lambda: _ir(proto), optimized, report, options)

    assert result.passed, result.message
    assert result.dropped == ["DropRelu at relu1_out"]
    assert "DropRelu at relu1_out" in result.message
    assert options.blocked == {("DropRelu", "relu1_out")}
    # The report now describes the repaired model: the good rewrites stay, the bad one is gone.
    assert report.rules["FoldConvBatchNorm"].applications == 2
    assert report.rules["DropRelu"].applications == 0
    assert any("DropRelu at relu1_out" in w for w in report.warnings)
    assert "Relu" in [n.op_type for n in model.graph]
    assert verify(_ir(proto), model).passed


def test_bisection_repeats_for_several_wrong_rewrites(wrong_patterns: Path) -> None:
    proto = relu_chain_model()  # two Relus: both rewrites are wrong
    options = OptimizeOptions(builtin=False, patterns=[str(wrong_patterns)])
    optimized, report = _optimize(proto, options)
    assert report.rules["DropRelu"].applications == 2
    model, result = verify_and_repair(lambda: _ir(proto), optimized, report, options)
    assert result.passed, result.message
    assert sorted(result.dropped) == ["DropRelu at r1", "DropRelu at r2"]
    assert [n.op_type for n in model.graph].count("Relu") == 2


def test_bisection_with_a_wrong_native_helper(wrong_native_patterns: Path) -> None:
    proto = conv_bn_model(with_miss=False)
    options = OptimizeOptions(patterns=[str(wrong_native_patterns)])
    optimized, report = _optimize(proto, options)
    assert report.rules["HalveInsteadOfRelu"].applications == 1
    model, result = verify_and_repair(lambda: _ir(proto), optimized, report, options)
    assert result.passed, result.message
    assert result.dropped == ["HalveInsteadOfRelu at relu1_out"]
    assert report.rules["FoldConvBatchNorm"].applications == 2


def test_repair_gives_up_after_the_limit(wrong_patterns: Path) -> None:
    proto = relu_chain_model()
    options = OptimizeOptions(builtin=False, patterns=[str(wrong_patterns)])
    optimized, report = _optimize(proto, options)
    model, result = verify_and_repair(lambda: _ir(proto), optimized, report, options, max_repairs=1)
    assert not result.passed
    assert len(result.dropped) == 1
    assert "still fails" in result.message


BAD_ATTR_PDLL = """\
/// Relu(x) -> LeakyRelu(x) with an attribute LeakyRelu does not have (onnxruntime refuses to load it)
Pattern BadAttrRelu {
  let r = op<Relu>(x);
  rewrite r with {
    replace r with op<LeakyRelu>(x) {alpha = 0.0, bogus = 1};
  };
}
"""


def test_a_model_that_does_not_load_is_repaired_too(tmp_path: Path) -> None:
    """An optimized model onnxruntime cannot load is a failure, bisected like a numeric one."""
    (tmp_path / "bad_attr.pdll").write_text(BAD_ATTR_PDLL)
    proto = conv_bn_model(with_miss=False)
    options = OptimizeOptions(patterns=[str(tmp_path / "bad_attr.pdll")])
    optimized, report = _optimize(proto, options)
    assert report.rules["BadAttrRelu"].applications == 1
    model, result = verify_and_repair(lambda: _ir(proto), optimized, report, options)
    assert result.passed, result.message
    assert "does not load in onnxruntime" in result.message
    assert result.dropped == ["BadAttrRelu at relu1_out"]


def test_a_failure_no_rewrite_explains_is_not_repaired() -> None:
    proto = conv_bn_model(with_miss=False)
    options = OptimizeOptions()
    optimized, report = _optimize(proto, options)
    for node in optimized.graph:  # damage done outside any rewrite
        if node.op_type == "Relu":
            node.op_type = "Abs"
    _, result = verify_and_repair(lambda: _ir(proto), optimized, report, options)
    assert not result.passed
    assert "cannot repair" in result.message and result.dropped == []


def test_input_shapes_reach_the_report(wrong_patterns: Path) -> None:
    proto = int_bool_model()
    options = OptimizeOptions()
    optimized, report = _optimize(proto, options)
    _, result = verify_and_repair(lambda: _ir(proto), optimized, report, options, {"ids": [2, 3]})
    assert result.passed
    assert report.verification is not None and report.verification.input_shapes["mask"] == [2, 3]


def test_gather_through_cast_limits_int_range() -> None:
    nodes = [helper.make_node("Cast", ["ids"], ["i32"], to=onnx.TensorProto.INT32), helper.make_node("Gather", ["emb", "i32"], ["y"])]
    from conftest import make_model

    model = make_model(
        nodes,
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64, 2])],
        [onnx.numpy_helper.from_array(np.zeros((3, 2), np.float32), "emb")],
    )
    feeds = make_inputs(_ir(model), {"ids": [64]}, seed=0)
    assert feeds["ids"].max() <= 2
    assert verify(_ir(model), _ir(model)).passed


def _cuda_only_pair() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    from conftest import make_model

    bias = onnx.numpy_helper.from_array(np.zeros(8, np.float32), "b")
    io = (
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    original = make_model([helper.make_node("Add", ["x", "b"], ["y"])], *io, [bias])
    fused = make_model([helper.make_node("BiasSplitGelu", ["x", "b"], ["y"], domain="com.microsoft")], *io, [bias])
    fused.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return original, fused


def test_cuda_only_kernel_on_a_cpu_cannot_be_verified_here() -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: the model is verified there")
    original, fused = _cuda_only_pair()
    with pytest.raises(VerificationError, match="cannot verify here"):
        verify_and_repair(
            lambda: _ir(original), _ir(fused), graphopt.report.model.Report(target="ort-cuda"), OptimizeOptions(target="ort-cuda")
        )


def test_missing_kernel_for_a_cpu_target_is_a_failure() -> None:
    original, fused = _cuda_only_pair()
    _, result = verify_and_repair(
        lambda: _ir(original), _ir(fused), graphopt.report.model.Report(target="ort-cpu"), OptimizeOptions(target="ort-cpu")
    )
    assert not result.passed and "does not load" in result.message
