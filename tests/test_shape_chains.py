"""Golden tests for shape chains: arithmetic on Shape that onnx's inference cannot follow
(tf2onnx's ReduceProd of gathered dims, Max of broadcast dims) folds when its result is
static, in one sweep however many layers depend on each other; Reshape targets computed
from one symbolic dim become constants with 0 or -1 where that is exact; Squeeze /
Unsqueeze / Reshape pairs become one Reshape. Outputs are compared on onnxruntime's CPU
provider, for two values of a symbolic dim."""

from __future__ import annotations

import numpy as np
import onnx
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rewrites

F = TensorProto.FLOAT
SHAPE_OPS = {"Shape", "Gather", "ReduceProd", "Concat", "Max", "Squeeze", "Unsqueeze"}


def _target(model: onnx.ModelProto, node_index: int = -1) -> list[int]:
    reshapes = [n for n in model.graph.node if n.op_type == "Reshape"]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    return [int(v) for v in inits[reshapes[node_index].input[1]]]


def _flatten_leading(prefix: str, x: str, out: str, rest: list[str]) -> list[onnx.NodeProto]:
    """tf2onnx's einsum: Reshape(x, Concat(ReduceProd(Gather(Shape(x), [0, 1])), rest))."""
    return [
        helper.make_node("Shape", [x], [f"{prefix}_s"]),
        helper.make_node("Gather", [f"{prefix}_s", "lead"], [f"{prefix}_g"], axis=0),
        helper.make_node("ReduceProd", [f"{prefix}_g"], [f"{prefix}_p"], keepdims=1),
        helper.make_node("Concat", [f"{prefix}_p", *rest], [f"{prefix}_t"], axis=0),
        helper.make_node("Reshape", [x, f"{prefix}_t"], [out]),
    ]


def _layers_model(batch: int | str) -> onnx.ModelProto:
    """Two layers: the second's Shape reads a value whose dims inference leaves unknown
    until the first layer's target is folded."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        *_flatten_leading("a", "r", "y1", ["c8"]),  # [batch*4, 8]
        helper.make_node("Relu", ["y1"], ["r1"]),
        helper.make_node("Unsqueeze", ["r1", "ax0"], ["u"]),  # [1, batch*4, 8]
        *_flatten_leading("b", "u", "y", ["c8"]),
    ]
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", F, [batch, 4, 8])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("lead", np.array([0, 1], np.int64)), init("c8", np.array([8], np.int64)), init("ax0", np.array([0], np.int64))],
    )


def test_static_chains_of_two_layers_fold_in_the_same_sweeps() -> None:
    model = _layers_model(2)
    before = op_types(model)
    assert before.count("Shape") == 2 and before.count("ReduceProd") == 2
    optimized, report = optimize_with(model, None)
    assert not SHAPE_OPS & set(op_types(optimized)), op_types(optimized)
    # The Unsqueeze and the last Reshape ([1, 8, 8] -> [8, 8]) give back r1's dims: both go.
    assert op_types(optimized) == ["Relu", "Reshape", "Relu"]
    assert report.sweeps <= 3
    assert_same_outputs(model, optimized)


def test_one_symbolic_dim_becomes_minus_one_and_the_chain_goes() -> None:
    model = _layers_model("N")
    optimized, report = optimize_with(model, None)
    assert rewrites(report, "ConstantReshapeTarget") >= 1
    assert not SHAPE_OPS & set(op_types(optimized)), op_types(optimized)
    assert _target(optimized, 0) == [-1, 8]  # N*4 is what the 8 leaves
    for n in (1, 3):
        assert_same_outputs(model, optimized, shapes={"x": (n, 4, 8)})


def test_a_symbolic_dim_the_input_has_at_that_axis_becomes_zero() -> None:
    # Reshape r[N, 8, 16] to [Shape(r)[0], 8, 4, 4]: N is copied (0), the rest is static.
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Shape", ["r"], ["s"]),
            helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
            helper.make_node("Concat", ["n", "rest"], ["t"], axis=0),
            helper.make_node("Reshape", ["r", "t"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 8, 16])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("i0", np.array([0], np.int64)), init("rest", np.array([8, 4, 4], np.int64))],
    )
    optimized, report = optimize_with(model, ["ConstantReshapeTarget", "FoldStaticShape", "FoldGatherOfStaticDims"])
    assert rewrites(report, "ConstantReshapeTarget") == 1
    assert op_types(optimized) == ["Relu", "Reshape"]
    assert _target(optimized) == [0, 8, 4, 4]
    for n in (2, 5):
        assert_same_outputs(model, optimized, shapes={"x": (n, 8, 16)})


def _two_symbolic_values_model(allowzero: int = 0) -> onnx.ModelProto:
    # Reshape x[N, S, 8] to [N, S*8]: N is copied, S*8 would be -1 beside a copied N that may be 0.
    return make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
            helper.make_node("Gather", ["s", "i12"], ["d"], axis=0),
            helper.make_node("ReduceProd", ["d"], ["p"], keepdims=1),
            helper.make_node("Concat", ["n", "p"], ["t"], axis=0),
            helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=allowzero),
        ],
        [helper.make_tensor_value_info("x", F, ["N", "S", 8])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("i0", np.array([0], np.int64)), init("i12", np.array([1, 2], np.int64))],
        opset=17,
    )


def test_no_minus_one_beside_a_copied_symbolic_dim() -> None:
    model = _two_symbolic_values_model()
    optimized, report = optimize_with(model, None)
    assert rewrites(report, "ConstantReshapeTarget") == 0
    reasons = [m.reason for m in report.rules["ConstantReshapeTarget"].near_misses]
    assert any("may be 0" in r for r in reasons), reasons
    assert "Shape" in op_types(optimized)
    for n, s in ((2, 3), (0, 3)):  # N = 0: [0, -1] would be refused where [0, 24] is fine
        assert_same_outputs(model, optimized, shapes={"x": (n, s, 8)})


def test_a_dim_of_another_input_stays_computed() -> None:
    # Reshape x[N, 6] to [Shape(z)[0], -1]: M is a different dim, known only at run time.
    model = make_model(
        [
            helper.make_node("Shape", ["z"], ["s"]),
            helper.make_node("Gather", ["s", "i0"], ["m"], axis=0),
            helper.make_node("Concat", ["m", "minus1"], ["t"], axis=0),
            helper.make_node("Reshape", ["x", "t"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 6]), helper.make_tensor_value_info("z", F, ["M"])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("i0", np.array([0], np.int64)), init("minus1", np.array([-1], np.int64))],
    )
    optimized, report = optimize_with(model, None)
    assert rewrites(report, "ConstantReshapeTarget") == 0
    assert op_types(optimized) == ["Shape", "Gather", "Concat", "Reshape"]
    for n, m in ((2, 3), (4, 2)):
        assert_same_outputs(model, optimized, shapes={"x": (n, 6), "z": (m,)})


def test_allowzero_takes_minus_one_never_zero() -> None:
    # Under allowzero a 0 is an empty dim, not a copy: N becomes -1 (the rest is static).
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
            helper.make_node("Concat", ["n", "rest"], ["t"], axis=0),
            helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=1),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 16])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("i0", np.array([0], np.int64)), init("rest", np.array([8, 2], np.int64))],
    )
    optimized, report = optimize_with(model, None)
    assert rewrites(report, "ConstantReshapeTarget") == 1
    assert _target(optimized) == [-1, 8, 2]
    for n in (1, 3):
        assert_same_outputs(model, optimized, shapes={"x": (n, 16)})


def _max_model(batch: int | str) -> onnx.ModelProto:
    # tf2onnx's batched einsum: Max(Shape(a)[0:1], Shape(b)[0:1]) as the batch of a Reshape target.
    return make_model(
        [
            helper.make_node("Relu", ["a"], ["ra"]),
            helper.make_node("Shape", ["ra"], ["sa"]),
            helper.make_node("Shape", ["b"], ["sb"]),
            helper.make_node("Gather", ["sa", "i0"], ["ga"], axis=0),
            helper.make_node("Gather", ["sb", "i0"], ["gb"], axis=0),
            helper.make_node("Max", ["ga", "gb"], ["batch"]),
            helper.make_node("Concat", ["batch", "rest"], ["t"], axis=0),
            helper.make_node("Reshape", ["ra", "t"], ["y"]),
        ],
        [helper.make_tensor_value_info("a", F, [batch, 8]), helper.make_tensor_value_info("b", F, [1, 2])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("i0", np.array([0], np.int64)), init("rest", np.array([2, 4], np.int64))],
    )


def test_max_of_broadcast_dims_folds() -> None:
    model = _max_model(3)
    optimized, _ = optimize_with(model, None)
    assert op_types(optimized) == ["Relu", "Reshape"]
    assert _target(optimized) == [3, 2, 4]
    assert_same_outputs(model, optimized)


def test_max_of_a_symbolic_dim_and_one_is_that_dim() -> None:
    model = _max_model("N")
    optimized, report = optimize_with(model, None)
    assert rewrites(report, "ConstantReshapeTarget") == 1
    assert op_types(optimized) == ["Relu", "Reshape"]
    assert _target(optimized) == [0, 2, 4]
    for n in (1, 3):
        assert_same_outputs(model, optimized, shapes={"a": (n, 8)})


def test_unsqueeze_of_a_reshape_is_one_reshape() -> None:
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Reshape", ["r", "t"], ["h"]),  # [N, 128, 4, 32]
            helper.make_node("Unsqueeze", ["h", "ax"], ["u"]),  # [N, 128, 1, 4, 32]
            helper.make_node("Squeeze", ["u", "ax"], ["back"]),  # [N, 128, 4, 32] again
            helper.make_node("Relu", ["back"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 128, 128])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("t", np.array([0, 128, 4, 32], np.int64)), init("ax", np.array([2], np.int64))],
    )
    optimized, report = optimize_with(model, ["CollapseShapeOps", "DropNoOpReshape", "CollapseReshapes"])
    assert rewrites(report, "CollapseShapeOps") >= 1
    assert op_types(optimized) == ["Relu", "Reshape", "Relu"]
    assert _target(optimized) == [0, 128, 4, 32]
    for n in (1, 2):
        assert_same_outputs(model, optimized, shapes={"x": (n, 128, 128)})


def test_two_symbolic_dims_at_new_axes_stay_two_ops() -> None:
    # x[N, S, 1] -> Reshape [N, S] -> Unsqueeze axis 0 -> [1, N, S]: N and S move to other axes,
    # so neither is a 0 (copy), and only one could be -1.
    model = make_model(
        [
            helper.make_node("Reshape", ["x", "t"], ["q"]),
            helper.make_node("Unsqueeze", ["q", "ax0"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, ["N", "S", 1])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("t", np.array([0, 0], np.int64)), init("ax0", np.array([0], np.int64))],
    )
    optimized, report = optimize_with(model, ["CollapseShapeOps"])
    assert rewrites(report, "CollapseShapeOps") == 0
    assert "not static" in report.rules["CollapseShapeOps"].near_misses[0].reason
    assert op_types(optimized) == ["Reshape", "Unsqueeze"]
    for n, s in ((2, 3), (3, 1)):
        assert_same_outputs(model, optimized, shapes={"x": (n, s, 1)})


def test_unsqueeze_of_unsqueeze_is_left_to_the_mask_rules() -> None:
    # Exporters build attention masks as Unsqueeze chains, which the attention rules read.
    model = make_model(
        [
            helper.make_node("Unsqueeze", ["x", "ax0"], ["u"]),
            helper.make_node("Unsqueeze", ["u", "ax0"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, [4])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("ax0", np.array([0], np.int64))],
    )
    optimized, report = optimize_with(model, ["CollapseShapeOps"])
    assert rewrites(report, "CollapseShapeOps") == 0
    assert "no Reshape" in report.rules["CollapseShapeOps"].near_misses[0].reason
    assert op_types(optimized) == ["Unsqueeze", "Unsqueeze"]
