"""eliminate_dead_code and eliminate_common_subexpressions over the main graph,
subgraphs and functions; graph outputs keep their names and producers."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.passes import eliminate_common_subexpressions, eliminate_dead_code

try:
    from test_passes_helpers import all_op_types, assert_same_outputs, feeds_for, make_model, op_types, to_ir
except ImportError:  # tests/ imported as a package
    from tests.test_passes_helpers import all_op_types, assert_same_outputs, feeds_for, make_model, op_types, to_ir

F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64


def vi(name: str, elem: int = F, shape=(3,)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def init(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def branch(name: str, nodes: list[onnx.NodeProto], out: str, initializers=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [vi(out)], list(initializers))


def both_branches(proto: onnx.ModelProto, model: ir.Model, cond_input: str = "c") -> None:
    for cond in (True, False):
        feeds = feeds_for(proto)
        feeds[cond_input] = np.array(cond)
        assert_same_outputs(proto, model, feeds)


# --------------------------------------------------------------------- DCE


def test_dead_chain_and_initializers_go_outputs_stay() -> None:
    proto = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Mul", ["r", "w_dead"], ["dead1"]),
            helper.make_node("Neg", ["dead1"], ["dead2"]),
            helper.make_node("Add", ["r", "w"], ["y"]),
            helper.make_node("Sigmoid", ["x"], ["z"]),  # graph output, nothing uses it: stays
        ],
        [vi("x"), vi("w_in")],  # an unused graph input stays too
        [vi("y"), vi("z")],
        [init("w", [1, 2, 3]), init("w_dead", [4, 5, 6]), init("w_in", [0, 0, 0])],
    )
    model = to_ir(proto)
    assert eliminate_dead_code(model) == 3  # Mul, Neg, w_dead
    assert op_types(model) == ["Relu", "Add", "Sigmoid"]
    assert sorted(model.graph.initializers) == ["w", "w_in"]
    assert [v.name for v in model.graph.inputs] == ["x", "w_in"]
    assert eliminate_dead_code(model) == 0
    assert_same_outputs(proto, model)


def test_dead_if_releases_the_outer_values_its_branches_read() -> None:
    # onnx-ir's RemoveUnusedNodesPass keeps Sigmoid here: the removed If's branch
    # nodes still count as its users.
    proto = make_model(
        [
            helper.make_node("Sigmoid", ["x"], ["a"]),
            helper.make_node(
                "If",
                ["c"],
                ["dead"],
                then_branch=branch("t", [helper.make_node("Relu", ["a"], ["t"])], "t"),
                else_branch=branch("e", [helper.make_node("Neg", ["a"], ["e"])], "e"),
            ),
            helper.make_node("Identity", ["x"], ["y"]),
        ],
        [vi("x"), vi("c", B, ())],
        [vi("y")],
    )
    model = to_ir(proto)
    assert eliminate_dead_code(model) == 4  # If, its two branch nodes, Sigmoid
    assert op_types(model) == ["Identity"]
    assert not model.graph.inputs[0].uses() or [u.node.op_type for u in model.graph.inputs[0].uses()] == ["Identity"]
    assert_same_outputs(proto, model, {"x": np.ones(3, np.float32), "c": np.array(True)})


def test_dead_code_inside_branches_and_branch_initializers() -> None:
    then_branch = branch(
        "t",
        [
            helper.make_node("Mul", ["x", "k"], ["unused"]),  # dead, reads a branch initializer
            helper.make_node("Cos", ["x"], ["dead_outer_user"]),
            helper.make_node("Relu", ["x"], ["t"]),
        ],
        "t",
        [init("k", [1, 2, 3])],
    )
    proto = make_model(
        [
            helper.make_node(
                "If", ["c"], ["y"], then_branch=then_branch, else_branch=branch("e", [helper.make_node("Neg", ["x"], ["e"])], "e")
            )
        ],
        [vi("x"), vi("c", B, ())],
        [vi("y")],
    )
    model = to_ir(proto)
    assert eliminate_dead_code(model) == 3  # Mul, Cos, k
    then_g = model.graph.node(0).attributes["then_branch"].value
    assert op_types(then_g) == ["Relu"] and not then_g.initializers
    both_branches(proto, model)


def test_dead_nodes_in_functions_and_unused_functions() -> None:
    used = helper.make_function(
        "custom",
        "Used",
        ["fx"],
        ["fy"],
        [helper.make_node("Exp", ["fx"], ["waste"]), helper.make_node("Relu", ["fx"], ["fy"])],
        [helper.make_opsetid("", 18)],
    )
    unused = helper.make_function(
        "custom", "Unused", ["fx"], ["fy"], [helper.make_node("Neg", ["fx"], ["fy"])], [helper.make_opsetid("", 18)]
    )
    proto = make_model(
        [helper.make_node("Used", ["x"], ["y"], domain="custom")],
        [vi("x")],
        [vi("y")],
        functions=[used, unused],
        extra_opsets={"custom": 1},
    )
    model = to_ir(proto)
    assert eliminate_dead_code(model) == 2  # Exp, the Unused function
    assert list(model.functions) == [("custom", "Used", "")]
    assert op_types(model.functions[("custom", "Used", "")]) == ["Relu"]
    assert_same_outputs(proto, model)
    model = to_ir(proto)
    assert eliminate_dead_code(model, remove_functions=False) == 1
    assert len(model.functions) == 2


# --------------------------------------------------------------------- CSE


def test_duplicate_nodes_merge_including_commutative_operands() -> None:
    proto = make_model(
        [
            helper.make_node("Relu", ["x"], ["r1"]),
            helper.make_node("Relu", ["x"], ["r2"]),
            helper.make_node("Add", ["r1", "w"], ["a1"]),
            helper.make_node("Add", ["w", "r2"], ["a2"]),  # same as a1 once r2 is r1
            helper.make_node("Sub", ["r1", "w"], ["s1"]),
            helper.make_node("Sub", ["w", "r2"], ["s2"]),  # not commutative: stays
            helper.make_node("LeakyRelu", ["x"], ["l1"], alpha=0.1),
            helper.make_node("LeakyRelu", ["x"], ["l2"], alpha=0.2),  # other attribute: stays
            helper.make_node("Sum", ["a1", "a2", "s1", "s2", "l1", "l2"], ["y"]),
        ],
        [vi("x")],
        [vi("y")],
        [init("w", [1, -2, 3])],
    )
    model = to_ir(proto)
    assert eliminate_common_subexpressions(model) == 2
    assert op_types(model) == ["Relu", "Add", "Sub", "Sub", "LeakyRelu", "LeakyRelu", "Sum"]
    sum_inputs = model.graph.node(6).inputs
    assert sum_inputs[0] is sum_inputs[1]
    assert_same_outputs(proto, model)
    assert eliminate_common_subexpressions(model) == 0


def test_duplicate_small_constants_merge_large_and_random_do_not() -> None:
    big = np.arange(2000, dtype=np.float32)
    proto = make_model(
        [
            helper.make_node("Constant", [], ["c1"], value=numpy_helper.from_array(np.array([1, 2, 3], np.float32))),
            helper.make_node("Constant", [], ["c2"], value=numpy_helper.from_array(np.array([1, 2, 3], np.float32))),
            helper.make_node("Constant", [], ["c3"], value=numpy_helper.from_array(np.array([1, 2, 3], np.int64))),  # other dtype
            helper.make_node("Constant", [], ["big1"], value=numpy_helper.from_array(big)),
            helper.make_node("Constant", [], ["big2"], value=numpy_helper.from_array(big)),
            helper.make_node("RandomNormal", [], ["rn1"], shape=[3], seed=1.0),
            helper.make_node("RandomNormal", [], ["rn2"], shape=[3], seed=1.0),
            helper.make_node("Cast", ["c3"], ["c3f"], to=F),
            helper.make_node("Sum", ["x", "c1", "c2", "i1", "i2", "c3f"], ["y"]),
            helper.make_node("Sum", ["big1", "big2"], ["z"]),
            helper.make_node("Sum", ["rn1", "rn2"], ["r"]),
        ],
        [vi("x")],
        [vi("y"), vi("z", shape=(2000,)), vi("r")],
        [init("i1", [1, 2, 3]), init("i2", [1, 2, 3])],
    )
    model = to_ir(proto)
    # i2 -> i1 (initializers), c1 and c2 -> i1 (a Constant equal to an initializer)
    assert eliminate_common_subexpressions(model) == 3
    assert list(model.graph.initializers) == ["i1"]
    assert op_types(model).count("Constant") == 3  # c3, big1, big2
    assert op_types(model).count("RandomNormal") == 2
    assert_same_outputs(proto, model)  # seeded RandomNormal: the same numbers in a fresh session
    y_inputs = [v.name for v in model.graph.node(len(model.graph) - 3).inputs]
    assert y_inputs == ["x", "i1", "i1", "i1", "i1", "c3f"]


def test_graph_output_names_survive_a_merge() -> None:
    proto = make_model(
        [
            helper.make_node("Relu", ["x"], ["hidden"]),
            helper.make_node("Relu", ["x"], ["out_a"]),  # merges into hidden, which takes the name
            helper.make_node("Neg", ["x"], ["out_b"]),
            helper.make_node("Neg", ["x"], ["out_c"]),  # both outputs: an Identity keeps out_c
            helper.make_node("Add", ["hidden", "out_b"], ["out_d"]),
        ],
        [vi("x")],
        [vi("out_a"), vi("out_b"), vi("out_c"), vi("out_d")],
    )
    model = to_ir(proto)
    assert eliminate_common_subexpressions(model) == 2
    assert [o.name for o in model.graph.outputs] == ["out_a", "out_b", "out_c", "out_d"]
    assert op_types(model) == ["Relu", "Neg", "Identity", "Add"]
    assert_same_outputs(proto, model)


def test_subgraph_reuses_outer_values_and_its_own_duplicates() -> None:
    then_branch = branch(
        "t",
        [
            helper.make_node("Relu", ["x"], ["t_relu"]),  # same as the outer Relu
            helper.make_node("Sin", ["x"], ["t_s1"]),
            helper.make_node("Sin", ["x"], ["t_s2"]),
            helper.make_node("Constant", [], ["t_c"], value=numpy_helper.from_array(np.array([1, 2, 3], np.float32))),  # = outer w
            helper.make_node("Sum", ["t_relu", "t_s1", "t_s2", "t_c"], ["t"]),
        ],
        "t",
    )
    else_branch = branch("e", [helper.make_node("Relu", ["x"], ["e"])], "e")  # a branch output: kept via Identity
    proto = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("If", ["c"], ["i"], then_branch=then_branch, else_branch=else_branch),
            helper.make_node("Add", ["r", "i"], ["y0"]),
            helper.make_node("Add", ["y0", "w"], ["y"]),
        ],
        [vi("x"), vi("c", B, ())],
        [vi("y")],
        [init("w", [1, 2, 3])],
    )
    model = to_ir(proto)
    assert eliminate_common_subexpressions(model) == 4  # t_relu, t_s2, t_c, e
    if_node = model.graph.node(1)
    then_g, else_g = if_node.attributes["then_branch"].value, if_node.attributes["else_branch"].value
    assert op_types(then_g) == ["Sin", "Sum"]
    assert op_types(else_g) == ["Identity"]
    assert [o.name for o in else_g.outputs] == ["e"]
    outer_relu = model.graph.node(0).outputs[0]
    assert then_g.node(1).inputs[0] is outer_relu and then_g.node(1).inputs[3] is model.graph.initializers["w"]
    both_branches(proto, model)


def test_function_bodies_are_deduplicated() -> None:
    function = helper.make_function(
        "custom",
        "Twice",
        ["fx"],
        ["fy"],
        [
            helper.make_node("Exp", ["fx"], ["e1"]),
            helper.make_node("Exp", ["fx"], ["e2"]),
            helper.make_node("Mul", ["e2", "e1"], ["fy"]),
        ],
        [helper.make_opsetid("", 18)],
    )
    proto = make_model(
        [helper.make_node("Twice", ["x"], ["y"], domain="custom")], [vi("x")], [vi("y")], functions=[function], extra_opsets={"custom": 1}
    )
    model = to_ir(proto)
    assert eliminate_common_subexpressions(model) == 1
    assert op_types(next(iter(model.functions.values()))) == ["Exp", "Mul"]
    assert_same_outputs(proto, model)


def test_nodes_with_subgraphs_are_not_merged() -> None:
    def make_if(out: str) -> onnx.NodeProto:
        return helper.make_node(
            "If",
            ["c"],
            [out],
            then_branch=branch(f"t{out}", [helper.make_node("Relu", ["x"], [f"t{out}"])], f"t{out}"),
            else_branch=branch(f"e{out}", [helper.make_node("Neg", ["x"], [f"e{out}"])], f"e{out}"),
        )

    proto = make_model([make_if("a"), make_if("b"), helper.make_node("Add", ["a", "b"], ["y"])], [vi("x"), vi("c", B, ())], [vi("y")])
    model = to_ir(proto)
    eliminate_common_subexpressions(model)
    assert op_types(model) == ["If", "If", "Add"]
    both_branches(proto, model)


@pytest.mark.parametrize("passes", [("cse", "dce"), ("dce", "cse")])
def test_cse_then_dce_on_a_duplicated_chain(passes) -> None:
    proto = make_model(
        [
            helper.make_node("Shape", ["x"], ["s1"]),
            helper.make_node("Shape", ["x"], ["s2"]),
            helper.make_node("Reshape", ["x", "s1"], ["r1"]),
            helper.make_node("Reshape", ["x", "s2"], ["r2"]),
            helper.make_node("Add", ["r1", "r2"], ["y"]),
        ],
        [vi("x", shape=("N", 3))],
        [vi("y", shape=None)],
    )
    model = to_ir(proto)
    for p in passes:
        (eliminate_common_subexpressions if p == "cse" else eliminate_dead_code)(model)
    assert op_types(model) == ["Shape", "Reshape", "Add"]
    assert all_op_types(model) == op_types(model)
    assert_same_outputs(proto, model, feeds_for(proto, {"N": 4}))
