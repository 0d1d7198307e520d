"""Golden tests for cast.pdll: no-op casts and lossless cast chains go, lossy ones stay."""

from __future__ import annotations

import pytest
from rule_testing import TensorProto as T
from rule_testing import assert_same_outputs, helper, make_model, op_types, optimize_with, rewrites

RULES = ["DropNoOpCast", "CollapseCastChain"]


def chain(src: int, *targets: int, extra_output: bool = False):
    nodes, name = [], "x"
    for i, to in enumerate(targets):
        nodes.append(helper.make_node("Cast", [name], [f"c{i}"], to=to))
        name = f"c{i}"
    nodes.append(helper.make_node("Neg" if src != T.BOOL else "Not", [name], ["y"]) if False else helper.make_node("Identity", [name], ["y"]))
    outputs = [helper.make_tensor_value_info("y", targets[-1], None)]
    return make_model(nodes, [helper.make_tensor_value_info("x", src, [2, 3])], outputs)


def test_same_type_cast_is_dropped() -> None:
    model = chain(T.FLOAT, T.FLOAT)
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "DropNoOpCast") == 1
    assert op_types(optimized) == ["Identity"]
    assert_same_outputs(model, optimized)


def test_f32_f64_f32_chain_is_dropped() -> None:
    model = chain(T.FLOAT, T.DOUBLE, T.FLOAT)
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "CollapseCastChain") == 1
    assert rewrites(report, "DropNoOpCast") == 1
    assert op_types(optimized) == ["Identity"]
    assert_same_outputs(model, optimized)


def test_i8_i32_f32_chain_becomes_one_cast() -> None:
    model = chain(T.INT8, T.INT32, T.FLOAT)
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "CollapseCastChain") == 1
    assert op_types(optimized) == ["Cast", "Identity"]
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize(
    "src, mid",
    [
        (T.FLOAT, T.FLOAT16),  # rounds
        (T.FLOAT, T.BFLOAT16),  # rounds
        (T.INT32, T.UINT32),  # changes signedness
        (T.UINT32, T.INT32),  # changes signedness
        (T.INT64, T.INT32),  # narrows
        (T.FLOAT, T.INT64),  # truncates
        (T.INT32, T.FLOAT),  # not every int32 is a float32
    ],
)
def test_lossy_chain_stays(src: int, mid: int) -> None:
    model = chain(src, mid, src)
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "CollapseCastChain") == 0
    assert op_types(optimized) == ["Cast", "Cast", "Identity"]
    miss = report.rules["CollapseCastChain"].near_misses[0]
    assert "does not keep every value" in miss.reason


def test_cast_chain_with_shared_middle_stays() -> None:
    model = make_model(
        [
            helper.make_node("Cast", ["x"], ["m"], to=T.DOUBLE),
            helper.make_node("Cast", ["m"], ["y"], to=T.FLOAT),
        ],
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, None), helper.make_tensor_value_info("m", T.DOUBLE, None)],
    )
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "CollapseCastChain") == 0
    assert op_types(optimized) == ["Cast", "Cast"]


def test_noop_cast_producing_graph_output_keeps_output_name() -> None:
    model = make_model(
        [helper.make_node("Cast", ["x"], ["y"], to=T.FLOAT)],
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
    )
    optimized, report = optimize_with(model, RULES)
    assert rewrites(report, "DropNoOpCast") == 1
    assert [o.name for o in optimized.graph.output] == ["y"]
    assert op_types(optimized) == ["Identity"]  # an output cannot be renamed to an input
    assert_same_outputs(model, optimized)


def test_castlike_with_known_type_becomes_cast_and_folds() -> None:
    import numpy as np
    from rule_testing import init

    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("CastLike", ["c", "r"], ["cl"]), helper.make_node("Add", ["r", "cl"], ["y"])],
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
        [init("c", np.array(2, np.int64))],
        opset=15,
    )
    optimized, report = optimize_with(model, ["CastLikeToCast"])
    assert rewrites(report, "CastLikeToCast") == 1
    assert op_types(optimized) == ["Relu", "Add"]  # the Cast of a constant folds away
    assert_same_outputs(model, optimized)


def test_castlike_of_an_input_becomes_cast() -> None:
    model = make_model(
        [helper.make_node("CastLike", ["x", "like"], ["y"])],
        [helper.make_tensor_value_info("x", T.FLOAT, [2]), helper.make_tensor_value_info("like", T.FLOAT16, [2])],
        [helper.make_tensor_value_info("y", T.FLOAT16, None)],
        opset=15,
    )
    optimized, report = optimize_with(model, ["CastLikeToCast"])
    assert rewrites(report, "CastLikeToCast") == 1
    assert op_types(optimized) == ["Cast"]
    assert_same_outputs(model, optimized)


def test_castlike_whose_type_is_unknown_stays() -> None:
    import onnx

    graph = helper.make_graph(
        [helper.make_node("Mystery", ["x"], ["like"], domain="custom"), helper.make_node("CastLike", ["x", "like"], ["y"])],
        "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])], [helper.make_tensor_value_info("y", T.FLOAT16, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("custom", 1)], ir_version=8)
    optimized, report = optimize_with(model, ["CastLikeToCast"])
    assert rewrites(report, "CastLikeToCast") == 0
    assert [n.op_type for n in optimized.graph.node] == ["Mystery", "CastLike"]
    assert "type is unknown" in report.rules["CastLikeToCast"].near_misses[0].reason
    del onnx
