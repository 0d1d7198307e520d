"""`--precision fp16|bf16`: conversion after the rules, the block list, casts at the
boundaries, the target's kernels for the low type, verification tolerances, the
report, the CLI; on hand-built models and on the tiny exported models."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from conftest import run_cli
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from rule_testing import FUSED_CONV_WINS, TensorProto, helper, init, make_model, rand
from test_report import validate

import graphopt
from graphopt.api import OptimizeOptions
from graphopt.errors import GraphoptError
from graphopt.ops.opspec import UNKNOWN_SHAPE
from graphopt.ops.targets import get_target
from graphopt.passes.precision import remove_cast_pairs
from graphopt.passes.precision_plan import DEFAULT_KEEP_FP32, PrecisionPlan
from graphopt.verify import PRECISION_TOLERANCES, compare_outputs, verify_and_repair

F = TensorProto.FLOAT
I64 = TensorProto.INT64
BOOL = TensorProto.BOOL
_LOW = {"f16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}


# ------------------------------------------------------------------ helpers


def convert(model: onnx.ModelProto, precision: str | None = "fp16", target: str = "onnx", **kwargs):
    """(optimized ir.Model, report)."""
    return graphopt.optimize(ir.serde.deserialize_model(model), target=target, precision=precision, **kwargs)


def as_proto(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def session(model: ir.Model | onnx.ModelProto) -> ort.InferenceSession:
    proto = as_proto(model) if isinstance(model, ir.Model) else model
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run(model: ir.Model | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return session(model).run(None, feeds)


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        t = value.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 2 for d in t.shape.dim]
        if t.elem_type == F:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        elif t.elem_type == BOOL:
            feeds[value.name] = rng.random(shape) < 0.5
        else:
            feeds[value.name] = rng.integers(0, 2, shape).astype(np.int64)
    return feeds


def within_budget(want: Sequence[np.ndarray], got: Sequence[np.ndarray], precision: str) -> None:
    names = [str(i) for i in range(len(want))]
    _, problems = compare_outputs(dict(zip(names, want)), dict(zip(names, got)), PRECISION_TOLERANCES[precision])
    assert not problems, problems


def cast_pairs(model: ir.Model) -> list[str]:
    """Casts reading a Cast's output: conversion must leave none."""
    found = []
    for node in model.graph:
        source = node.inputs[0] if node.op_type == "Cast" and node.inputs else None
        producer = source.producer() if source is not None else None
        if producer is not None and producer.op_type == "Cast":
            found.append(f"{producer.name} -> {node.name}")
    return found


def io_types(model: ir.Model | onnx.ModelProto) -> list[tuple[str, int]]:
    proto = as_proto(model) if isinstance(model, ir.Model) else model
    return [(v.name, v.type.tensor_type.elem_type) for v in [*proto.graph.input, *proto.graph.output]]


def float_inputs(node: ir.Node) -> set[ir.DataType]:
    return {v.dtype for v in node.inputs if v is not None and v.dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)}


def nodes(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == op_type]


def blocked_stay_fp32(model: ir.Model) -> None:
    for node in model.graph:
        if node.op_type in DEFAULT_KEEP_FP32:
            assert float_inputs(node) <= {ir.DataType.FLOAT}, f"{node.op_type} {node.name} reads {float_inputs(node)}"


def low_nodes_have_kernels(model: ir.Model, target: str, low: str = "f16") -> None:
    """Every node reading the low type has a kernel for it on the target (ort-cpu's table is complete)."""
    t = get_target(target)
    opset = model.opset_imports.get("", 17)
    for node in model.graph:
        first = next((v for v in node.inputs if v is not None), None)
        if first is not None and first.dtype == _LOW[low]:
            assert t.why_not(node.domain if node.domain != "ai.onnx" else "", node.op_type, low, opset) is None, node.op_type


# ------------------------------------------------------------------ hand-built models


@functools.cache
def mlp(opset: int = 17) -> onnx.ModelProto:
    """x -> MatMul -> Add -> Relu -> MatMul -> Add -> Softmax -> y, and ReduceMean(hidden) -> z."""
    nodes_ = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="add1"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu1"),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"], name="mm2"),
        helper.make_node("Add", ["h4", "b2"], ["h5"], name="add2"),
        helper.make_node("Softmax", ["h5"], ["y"], name="softmax", axis=-1),
        helper.make_node("ReduceMean", ["h3"], ["z"], name="mean", axes=[-1], keepdims=0),
    ]
    inits = [init("w1", rand(8, 16)), init("b1", rand(16)), init("w2", rand(16, 4)), init("b2", rand(4))]
    return make_model(
        nodes_,
        [helper.make_tensor_value_info("x", F, [2, 3, 8])],
        [helper.make_tensor_value_info("y", F, [2, 3, 4]), helper.make_tensor_value_info("z", F, [2, 3])],
        inits,
        opset=opset,
    )


def test_converts_between_fp32_inputs_and_outputs() -> None:
    original = mlp()
    model, report = convert(original)
    assert io_types(model) == io_types(original)
    mm1, relu, add2 = nodes(model, "MatMul")[0], nodes(model, "Relu")[0], nodes(model, "Add")[-1]
    assert float_inputs(mm1) == float_inputs(relu) == float_inputs(add2) == {ir.DataType.FLOAT16}
    assert model.graph.initializers["w1"].dtype == ir.DataType.FLOAT16
    # Softmax and ReduceMean are on the block list: fp32, with one Cast up in front of each.
    blocked_stay_fp32(model)
    assert {n.op_type for n in model.graph if n.op_type in ("Softmax", "ReduceMean")} == {"Softmax", "ReduceMean"}
    assert not cast_pairs(model)
    # One Cast down after the input; one Cast up for Softmax and ReduceMean each.
    casts = nodes(model, "Cast")
    assert sorted(c.attributes.get_int("to") for c in casts) == sorted([int(ir.DataType.FLOAT16), int(ir.DataType.FLOAT), int(ir.DataType.FLOAT)])
    summary = report.precision_conversion
    assert report.precision == "fp16" and summary is not None
    assert summary.kept == {"block_list": 2} and summary.kept_ops == {"ReduceMean": 1, "Softmax": 1}
    assert summary.casts_inserted == 3 and summary.constants_converted == 4 and summary.constants_copied == 0
    assert report.pass_stats("precision").runs == 1
    feeds = feeds_for(original)
    within_budget(run(original, feeds), run(model, feeds), "fp16")
    onnx.checker.check_model(as_proto(model), full_check=True)


def test_fp32_or_none_changes_nothing() -> None:
    for precision in (None, "fp32", "FP32"):
        model, report = convert(mlp(), precision)
        assert report.precision is None and report.precision_conversion is None
        assert not nodes(model, "Cast")


def test_unknown_precision_is_an_error() -> None:
    with pytest.raises(GraphoptError, match="unknown precision 'fp4'"):
        convert(mlp(), "fp4")


def test_keep_fp32_by_op_type_and_by_node_name() -> None:
    model, report = convert(mlp(), keep_fp32=["Relu", "mm2", "NoSuchThing"])
    assert float_inputs(nodes(model, "Relu")[0]) == {ir.DataType.FLOAT}
    mm2 = next(n for n in model.graph if n.name == "mm2" or (n.op_type in ("MatMul", "Gemm") and n.inputs[1].name.startswith("w2")))
    assert float_inputs(mm2) == {ir.DataType.FLOAT}
    assert float_inputs(nodes(model, "MatMul")[0]) == {ir.DataType.FLOAT16}
    assert report.precision_conversion.kept["keep_fp32"] == 2
    assert any("--keep-fp32 NoSuchThing" in w for w in report.warnings)
    assert not cast_pairs(model)
    feeds = feeds_for(mlp())
    within_budget(run(mlp(), feeds), run(model, feeds), "fp16")


def test_shape_arithmetic_stays_fp32_and_casts_to_float_are_retargeted() -> None:
    # scale = 1 / sqrt(float(shape(x)[-1])); y = x * scale * float(mask)
    original = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "last"], ["d"], axis=0),
            helper.make_node("Cast", ["d"], ["df"], to=F),
            helper.make_node("Sqrt", ["df"], ["sq"], name="sqrt"),
            helper.make_node("Div", ["one", "sq"], ["scale"], name="div"),
            helper.make_node("Mul", ["x", "scale"], ["t"], name="scaled"),
            helper.make_node("Cast", ["mask"], ["mf"], name="mask_cast", to=F),
            helper.make_node("Unsqueeze", ["mf", "axis1"], ["mu"]),
            helper.make_node("Mul", ["t", "mu"], ["y"], name="masked"),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 4, "D"]), helper.make_tensor_value_info("mask", I64, ["N", "D"])],
        [helper.make_tensor_value_info("y", F, ["N", 4, "D"])],
        [init("last", np.array(2, np.int64)), init("one", np.array(1.0, np.float32)), init("axis1", np.array([1], np.int64))],
    )
    model, report = convert(original)
    by_name = {n.name: n for n in model.graph}
    assert float_inputs(by_name["sqrt"]) == float_inputs(by_name["div"]) == {ir.DataType.FLOAT}
    assert report.precision_conversion.kept["shape"] == 3  # Cast(to=float), Sqrt, Div
    assert by_name["mask_cast"].attributes.get_int("to") == int(ir.DataType.FLOAT16)  # retargeted, not cast again
    assert by_name["mask_cast"].inputs[0].dtype == ir.DataType.INT64  # integer tensors are untouched
    assert report.precision_conversion.casts_retargeted == 1
    assert float_inputs(by_name["masked"]) == {ir.DataType.FLOAT16}
    assert io_types(model) == io_types(original) and not cast_pairs(model)
    feeds = feeds_for(original)
    within_budget(run(original, feeds), run(model, feeds), "fp16")


def test_constants_are_clamped_and_counted() -> None:
    big = np.array([-3.4e38, 1e-12, 1.5, 70000.0], np.float32)
    original = make_model(
        [helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
        [helper.make_tensor_value_info("x", F, [3, 4])],
        [helper.make_tensor_value_info("y", F, [3, 4])],
        [init("c", big)],
    )
    # The range check would keep both nodes in float32 (they write 3.4e38); this test is about the clamping.
    model, report = convert(original, range_check=False)
    summary = report.precision_conversion
    assert summary.values_clamped == 2 and summary.values_flushed == 1
    assert any("clamped" in w for w in report.warnings)
    converted = model.graph.initializers["c"].const_value.numpy()
    assert converted.dtype == np.float16 and np.isfinite(converted).all()
    assert converted[0] == -65504 and converted[1] == 0 and converted[3] == 65504
    (y,) = run(model, feeds_for(original))
    assert np.isfinite(y).all()


def test_constant_read_in_both_precisions_is_copied() -> None:
    # c feeds an Add (converted) and a Pow (block list): the fp32 original stays for Pow.
    original = make_model(
        [
            helper.make_node("Add", ["x", "c"], ["a"]),
            helper.make_node("Pow", ["a", "c"], ["p"]),
            helper.make_node("Mul", ["a", "p"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, [3, 4])],
        [helper.make_tensor_value_info("y", F, [3, 4])],
        [init("c", np.array([1.0, 2.0, 2.0, 1.0], np.float32))],
    )
    model, report = convert(original)
    assert report.precision_conversion.constants_copied == 1
    assert model.graph.initializers["c"].dtype == ir.DataType.FLOAT
    assert any(v.dtype == ir.DataType.FLOAT16 for name, v in model.graph.initializers.items() if name != "c")
    assert float_inputs(nodes(model, "Pow")[0]) == {ir.DataType.FLOAT}
    feeds = {"x": np.abs(feeds_for(original)["x"]) + 0.5}
    within_budget(run(original, feeds), run(model, feeds), "fp16")


def test_decomposed_layernorm_keeps_its_statistics_in_fp32() -> None:
    # Opset 13 has no LayerNormalization, so the rule cannot fuse it: the pattern stays decomposed.
    original = make_model(
        [
            helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
            helper.make_node("Sub", ["x", "mean"], ["d"], name="sub"),
            helper.make_node("Pow", ["d", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
            helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
            helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
            helper.make_node("Div", ["d", "std"], ["n"], name="div"),
            helper.make_node("Mul", ["n", "gamma"], ["g"], name="mul_gamma"),
            helper.make_node("Add", ["g", "beta"], ["y"], name="add_beta"),
        ],
        [helper.make_tensor_value_info("x", F, [2, 5, 16])],
        [helper.make_tensor_value_info("y", F, [2, 5, 16])],
        [init("two", np.array(2.0, np.float32)), init("eps", np.array(1e-6, np.float32)), init("gamma", rand(16)), init("beta", rand(16))],
        opset=13,
    )
    model, report = convert(original)
    by_name = {n.name: n for n in model.graph if n.name}
    assert float_inputs(by_name["add_eps"]) == float_inputs(by_name["sqrt"]) == {ir.DataType.FLOAT}
    for name in ("sub", "div", "mul_gamma", "add_beta"):
        assert float_inputs(by_name[name]) == {ir.DataType.FLOAT16}, name
    blocked_stay_fp32(model)
    assert report.precision_conversion.kept == {"block_list": 3, "follows_fp32": 2}
    assert not cast_pairs(model)
    feeds = feeds_for(original)
    within_budget(run(original, feeds), run(model, feeds), "fp16")


def test_if_subgraphs_stay_fp32_with_casts_for_captured_values() -> None:
    then_branch = helper.make_graph([helper.make_node("Identity", ["a"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, [3, 4])])
    else_branch = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [3, 4])])
    original = make_model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("If", ["cond"], ["b"], name="if", then_branch=then_branch, else_branch=else_branch),
            helper.make_node("Add", ["b", "a"], ["y"], name="add"),
        ],
        [helper.make_tensor_value_info("x", F, [3, 4]), helper.make_tensor_value_info("cond", BOOL, [])],
        [helper.make_tensor_value_info("y", F, [3, 4])],
    )
    model, report = convert(original)
    by_name = {n.name: n for n in model.graph}
    assert float_inputs(by_name["relu"]) == float_inputs(by_name["add"]) == {ir.DataType.FLOAT16}
    assert report.precision_conversion.kept == {"subgraph": 1}
    for body in (by_name["if"].attributes["then_branch"].value, by_name["if"].attributes["else_branch"].value):
        assert all(float_inputs(n) == {ir.DataType.FLOAT} for n in body)
        assert body.outputs[0].dtype == ir.DataType.FLOAT
    onnx.checker.check_model(as_proto(model), full_check=True)
    for cond in (True, False):
        feeds = {"x": rand(3, 4), "cond": np.array(cond)}
        within_budget(run(original, feeds), run(model, feeds), "fp16")


def test_ort_cpu_converts_only_ops_with_cpu_f16_kernels() -> None:
    # On onnxruntime's CPU provider MatMul has no f16 kernel, LayerNormalization has one.
    original = make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], axis=-1),
            helper.make_node("MatMul", ["n", "w2"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, [2, 3, 8])],
        [helper.make_tensor_value_info("y", F, [2, 3, 8])],
        [init("w", rand(8, 8)), init("gamma", rand(8)), init("beta", rand(8)), init("w2", rand(8, 8))],
    )
    model, report = convert(original, target="ort-cpu")
    assert float_inputs(nodes(model, "LayerNormalization")[0]) == {ir.DataType.FLOAT16}
    assert all(float_inputs(n) == {ir.DataType.FLOAT} for n in nodes(model, "MatMul"))
    assert report.precision_conversion.kept == {"no_kernel": 2}
    low_nodes_have_kernels(model, "ort-cpu")
    feeds = feeds_for(original)
    within_budget(run(original, feeds), run(model, feeds), "fp16")


def test_bf16_for_standard_onnx() -> None:
    original = mlp()
    model, report = convert(original, "bf16")
    assert float_inputs(nodes(model, "Relu")[0]) == {ir.DataType.BFLOAT16}
    assert model.graph.initializers["w1"].dtype == ir.DataType.BFLOAT16
    assert io_types(model) == io_types(original) and not cast_pairs(model)
    blocked_stay_fp32(model)
    proto = as_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    # onnxruntime's CPU provider has no bf16 MatMul: onnx's reference evaluator runs it.
    feeds = feeds_for(original)
    within_budget(run(original, feeds), ReferenceEvaluator(proto).run(None, feeds), "bf16")


def test_conv_is_kept_fp32_in_bf16_below_opset_22() -> None:
    plan = PrecisionPlan.make("bf16")
    onnx_target = get_target("onnx")
    assert "does not take bf16" in (plan.cannot_run_low(onnx_target, "", "Conv", 17) or "")
    assert plan.cannot_run_low(onnx_target, "", "Relu", 17) is None
    assert PrecisionPlan.make("fp16").cannot_run_low(onnx_target, "", "Conv", 17) is None


def test_remove_cast_pairs_collapses_round_trips_that_conversion_made() -> None:
    original = make_model(
        [
            helper.make_node("Cast", ["x"], ["h"], name="down", to=TensorProto.FLOAT16),
            helper.make_node("Cast", ["h"], ["f"], name="up", to=F),
            helper.make_node("Relu", ["f"], ["y"]),
            helper.make_node("Cast", ["x"], ["h2"], name="user_down", to=TensorProto.FLOAT16),
            helper.make_node("Cast", ["h2"], ["z"], name="user_up", to=F),
        ],
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info("y", F, [3]), helper.make_tensor_value_info("z", F, [3])],
    )
    model = ir.serde.deserialize_model(original)
    made = {id(n) for n in model.graph if n.name == "down"}
    assert remove_cast_pairs(model, made) == 2
    assert [n.name for n in model.graph if n.op_type == "Cast"] == ["user_down", "user_up"]  # a pair someone wrote stays
    assert nodes(model, "Relu")[0].inputs[0] is model.graph.inputs[0]


# ------------------------------------------------------------------ fused ops and the planned dtype


@functools.cache
def conv_relu() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])],
        [init("w", rand(4, 3, 3, 3)), init("b", rand(4))],
    )


def test_no_fused_conv_on_cuda_when_it_would_run_in_fp16() -> None:
    # ort-cuda's FusedConv is f32 only: with fp16 the fusion would pull Conv back to f32.
    _, report = convert(conv_relu(), None, target="ort-cuda")
    assert report.rules["FuseConvActivation"].applications == 1
    # the convolutions in fp16 whatever the cost table predicts (the precision decision is tested elsewhere)
    model, report = convert(conv_relu(), "fp16", target="ort-cuda", precision_convs="low")
    stats = report.rules["FuseConvActivation"]
    assert stats.applications == 0 and any("FusedConv kernel for f16" in m.reason for m in stats.near_misses)
    assert "FusedConv" not in [n.op_type for n in model.graph]
    convs = [n for n in model.graph if n.op_type in ("Conv", "NhwcConv")]  # the layout pass may make it NHWC
    assert len(convs) == 1 and float_inputs(convs[0]) == {ir.DataType.FLOAT16}
    assert float_inputs(nodes(model, "Relu")[0]) == {ir.DataType.FLOAT16}


def test_fused_conv_stays_on_cpu_where_conv_has_no_f16_kernel_anyway() -> None:
    model, report = convert(conv_relu(), "fp16", target="ort-cpu", cost_table=FUSED_CONV_WINS)
    assert [n.op_type for n in model.graph] == ["FusedConv"]
    assert report.precision_conversion.nodes_converted == 0 and report.precision_conversion.casts_inserted == 0


def test_fusion_check_uses_the_planned_dtype() -> None:
    plan = PrecisionPlan.make("fp16")
    cuda = get_target("ort-cuda")
    conv = [("", "Conv", "f32"), ("", "Relu", "f32")]
    assert plan.fusion_problem(cuda, "graphopt", "FusedConv", "f32", 17, conv) is not None
    assert plan.fusion_problem(cuda, "graphopt", "SkipLayerNorm", "f32", 17, [("", "Add", "f32")]) is None  # has f16
    keep = PrecisionPlan.make("fp16", ["Conv", "Relu"])  # the user keeps them fp32: fusing loses nothing
    assert keep.fusion_problem(cuda, "graphopt", "FusedConv", "f32", 17, conv) is None
    # Conv has no bf16 below opset 22: folding BatchNormalization (which has) into it loses nothing either.
    conv_bn = [("", "Conv", "f32"), ("", "BatchNormalization", "f32")]
    assert PrecisionPlan.make("bf16").fusion_problem(get_target("onnx"), "", "Conv", "f32", 20, conv_bn) is None


# ------------------------------------------------------------------ verification and the report


def test_verification_uses_the_precision_tolerance() -> None:
    want = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    got = {"y": np.array([1.004, 2.0, 3.0], np.float32)}
    assert compare_outputs(want, got)[1]
    assert not compare_outputs(want, got, PRECISION_TOLERANCES["fp16"])[1]
    assert PRECISION_TOLERANCES["bf16"].rtol > PRECISION_TOLERANCES["fp16"].rtol
    original = mlp()
    options = OptimizeOptions(precision="fp16")
    model, report = graphopt.optimize(ir.serde.deserialize_model(original), options)
    model, verification = verify_and_repair(lambda: ir.serde.deserialize_model(original), model, report, options)
    assert verification.passed, verification.message
    assert (verification.rtol, verification.atol) == (1e-2, 1e-2)


def test_report_records_the_conversion() -> None:
    _, report = convert(mlp())
    document = report.to_dict()
    validate(document)
    assert document["precision"] == "fp16"
    conversion = document["precision_conversion"]
    assert conversion["nodes_converted"] > 0 and conversion["kept"] == {"block_list": 2}
    assert not any(key.startswith("_") for key in conversion)
    _, plain = convert(mlp(), None)
    validate(plain.to_dict())
    assert plain.to_dict()["precision"] is None and plain.to_dict()["precision_conversion"] is None


def test_cli_precision(tmp_path: Path) -> None:
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    result = run_cli("optimize", source, "-o", out, "--precision", "fp16", "--keep-fp32", "Relu", "--verify", "--report", report, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "precision fp16:" in result.stdout and "verification: passed" in result.stdout
    written = onnx.load(str(out))
    assert io_types(written) == io_types(mlp())
    assert any(i.data_type == TensorProto.FLOAT16 for i in written.graph.initializer)
    document = json.loads(report.read_text())
    validate(document)
    assert document["precision"] == "fp16" and document["precision_conversion"]["kept"]["keep_fp32"] == 1
    assert document["verification"]["rtol"] == 1e-2

    bad = run_cli("optimize", source, "-o", tmp_path / "bad.onnx", "--precision", "fp4", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown precision 'fp4'")
    assert not (tmp_path / "bad.onnx").exists()
    lonely = run_cli("optimize", source, "-o", tmp_path / "bad.onnx", "--keep-fp32", "Relu", cwd=tmp_path)
    assert lonely.returncode == 2 and "--keep-fp32 only applies with --precision" in lonely.stderr


# ------------------------------------------------------------------ tiny exported models


def _models():
    name = "graphopt_test_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("models.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


EXPORTED = ["bert-tiny-dynamo", "bert-tiny-torchscript", "gpt2-tiny-dynamo", "gpt2-tiny-torchscript", "small-cnn-dynamo-noopt"]


@pytest.fixture(scope="module")
def exported():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    models = _models()
    cache: dict[str, tuple[Path, onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]] = {}

    def get(name: str):
        if name not in cache:
            path = models.TINY_MODELS[name]()
            proto = onnx.load(str(path))
            feeds = models.example_inputs(path)
            cache[name] = (path, proto, feeds, run(proto, feeds))
        return cache[name]

    return get


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("name", EXPORTED)
def test_exported_model_in_fp16(exported, name: str, target: str) -> None:
    path, original, feeds, want = exported(name)
    model, report = graphopt.optimize(ir.serde.deserialize_model(original), target=target, precision="fp16")
    assert io_types(model) == io_types(original)
    assert not cast_pairs(model)
    blocked_stay_fp32(model)
    if target == "ort-cpu":
        low_nodes_have_kernels(model, target)
    else:
        assert report.precision_conversion.nodes_converted > 0
        onnx.checker.check_model(as_proto(model), full_check=True)
    within_budget(want, run(model, feeds), "fp16")


@pytest.mark.parametrize("name", ["bert-tiny-dynamo", "gpt2-tiny-torchscript"])
def test_exported_model_in_bf16_on_ort_cpu(exported, name: str) -> None:
    path, original, feeds, want = exported(name)
    model, report = graphopt.optimize(ir.serde.deserialize_model(original), target="ort-cpu", precision="bf16")
    assert report.precision_conversion.nodes_converted > 0  # LayerNormalization, Gather, ... have CPU bf16 kernels
    assert io_types(model) == io_types(original) and not cast_pairs(model)
    low_nodes_have_kernels(model, "ort-cpu", "bf16")
    within_budget(want, run(model, feeds), "bf16")


def test_exported_gpt2_in_bf16_for_standard_onnx(exported) -> None:
    path, original, feeds, want = exported("gpt2-tiny-dynamo")
    model, _ = graphopt.optimize(ir.serde.deserialize_model(original), target="onnx", precision="bf16")
    proto = as_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    within_budget(want, ReferenceEvaluator(proto).run(None, feeds), "bf16")


#: Inputs onnxruntime's CUDA kernels read as float32 whatever X is (contrib_ops/cuda/diffusion/
#: group_norm.cc: gamma and beta with Data<float>(); "GroupNorm only supports gamma and beta in
#: float type" is what unet-block-dynamo --precision fp16 failed with on the H100).
CUDA_FLOAT32_INPUTS = {("com.microsoft", "GroupNorm"): (1, 2)}


def cuda_contract_problems(model: onnx.ModelProto) -> list[str]:
    """What onnxruntime's CUDA provider would refuse in the model's com.microsoft nodes: an X
    dtype its kernel table lacks, an input it reads as float32 in another type, a broken contract."""
    target = get_target("ort-cuda")
    graph = model.graph
    values = [*graph.value_info, *graph.input, *graph.output]
    types = {v.name: v.type.tensor_type.elem_type for v in values}
    shapes: dict[str, tuple] = {v.name: tuple(d.dim_value or None for d in v.type.tensor_type.shape.dim)
                                for v in values if v.type.tensor_type.HasField("shape")}
    types.update({i.name: i.data_type for i in graph.initializer})
    shapes.update({i.name: tuple(i.dims) for i in graph.initializer})
    short = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16", TensorProto.BFLOAT16: "bf16"}
    problems = []
    for node in graph.node:
        key = (node.domain, node.op_type)
        if node.domain != "com.microsoft":
            continue
        dtype = short.get(types.get(node.input[0], 0))
        if key in target.kernels and dtype not in target.kernels[key]:
            problems.append(f"{node.name}: {node.op_type} has no CUDA kernel for X of type {dtype}")
        for i in CUDA_FLOAT32_INPUTS.get(key, ()):
            if types.get(node.input[i]) != TensorProto.FLOAT:
                problems.append(f"{node.name}: {node.op_type} input {i} must be float32, is {short.get(types.get(node.input[i], 0))}")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        problem = target.contract_problem(node.domain, node.op_type, attrs, [shapes.get(name, UNKNOWN_SHAPE) if name else None for name in node.input])
        if problem:
            problems.append(f"{node.name}: {problem}")
    return problems


def test_fp16_output_for_cuda_obeys_the_cuda_kernels() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_rules_group_norm import decomposed_group_norm

    model = decomposed_group_norm(channels=16, groups=4, silu=True)
    optimized, _ = graphopt.optimize(model, target="ort-cuda", precision="fp16", range_check=False)
    assert [n.op_type for n in optimized.graph.node if n.domain == "com.microsoft"] == ["GroupNorm"]
    assert cuda_contract_problems(optimized) == []
    # The check can fail: float16 gamma and beta are what the CUDA kernel refuses.
    for tensor in optimized.graph.initializer:
        if tensor.data_type == TensorProto.FLOAT and len(tensor.dims) == 1:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    assert any("must be float32, is f16" in p for p in cuda_contract_problems(optimized))
