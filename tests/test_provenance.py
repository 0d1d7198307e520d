"""Provenance metadata: every node a rewrite inserts names its rule, its rewrite index and
the nodes it replaced; nodes a pass makes name the pass; untouched nodes are unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir
from conftest import conv_bn_model
from onnx import TensorProto, helper, numpy_helper
from rule_testing import FUSED_CONV_WINS, rand

import graphopt
from graphopt.ir import provenance
from graphopt.ir.onnx_io import save_model
from graphopt.ir.onnx_view import OnnxView
from graphopt.match.driver import DriverOptions, RuleSet, apply_rules
from graphopt.ops.targets import get_target
from graphopt.report.model import Report


def _props(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def test_rewritten_nodes_name_rule_rewrite_and_replaced_nodes() -> None:
    original = conv_bn_model()
    optimized, report = graphopt.optimize(original)
    by_index = {r.index: r for r in report.applied}
    assert len(by_index) == 3
    originals = {n.name: n for n in original.graph.node}
    made = [n for n in optimized.graph.node if provenance.RULE_KEY in _props(n)]
    assert made
    # A node that survives keeps its name (the Conv folded with its BatchNormalization); new ones get short names.
    assert {n.name for n in made} & set(originals) and not any("__" in n.name for n in made)
    for node in made:
        props = _props(node)
        record = by_index[int(props[provenance.REWRITE_KEY])]
        assert props[provenance.RULE_KEY] == record.rule
        # The root of the rewrite and the nodes matched with it are named as replaced.
        assert set(record.matched) <= set(props[provenance.REPLACED_KEY].split(","))
    replaced = {name for n in made for name in _props(n)[provenance.REPLACED_KEY].split(",")}
    assert replaced == {"conv1", "bn1", "conv2", "bn2", "conv3", "bn3"}
    # Untouched nodes are byte-identical: no metadata added to them.
    for node in optimized.graph.node:
        if node.name in originals and not _props(node):
            assert node.SerializeToString() == originals[node.name].SerializeToString()


def test_metadata_survives_lowering_and_saving(tmp_path: Path) -> None:
    # On ort-cpu, Conv + Relu becomes graphopt.FusedConv, lowered in place to com.microsoft.FusedConv
    # (kept where the cost table predicts it faster: this one does).
    model, report = graphopt.optimize(conv_bn_model(with_miss=False), target="ort-cpu", cost_table=FUSED_CONV_WINS)
    path = tmp_path / "out.onnx"
    save_model(onnx_ir.serde.deserialize_model(model), path)
    saved = onnx.load(str(path))
    onnx.checker.check_model(saved)
    fused = [n for n in saved.graph.node if n.op_type == "FusedConv"]
    assert len(fused) == 1 and fused[0].domain == "com.microsoft"
    props = _props(fused[0])
    assert props[provenance.RULE_KEY] == "FuseConvActivation"
    record = next(r for r in report.applied if r.index == int(props[provenance.REWRITE_KEY]))
    assert record.rule == "FuseConvActivation"
    # The Conv it absorbed was made by FoldConvBatchNorm: its replaced nodes are inherited.
    assert set(props[provenance.REPLACED_KEY].split(",")) == {"relu1", "conv1", "bn1"}


def test_nodes_made_by_a_pass_name_the_pass() -> None:
    model, _ = graphopt.optimize(conv_bn_model(), precision="fp16")
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert casts
    assert all(_props(n) == {provenance.PASS_KEY: "precision"} for n in casts)


def test_rewrites_in_functions_record_unnamed_nodes_by_their_output() -> None:
    c = 3
    consts = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name))
        for name, arr in (("fw", rand(c, c, 1, 1)), ("fg", rand(c)), ("fb", rand(c)), ("fm", rand(c)), ("fv", rand(c, positive=True)))
    ]
    body = consts + [helper.make_node("Conv", ["X", "fw"], ["fc"]), helper.make_node("BatchNormalization", ["fc", "fg", "fb", "fm", "fv"], ["Y"])]
    function = helper.make_function("local", "ConvBN", ["X"], ["Y"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("ConvBN", ["x"], ["y"], domain="local")],
        "main",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)], ir_version=8)
    optimized, _ = graphopt.optimize(model, enable=["FoldConvBatchNorm"])
    conv = next(n for n in optimized.functions[0].node if n.op_type == "Conv")
    replaced = _props(conv)[provenance.REPLACED_KEY].split(",")
    # Unnamed nodes are named as the report names them (op and first output). The weights'
    # Constant nodes erased with them were constant folding's (no node of the input): left out.
    assert sorted(replaced) == ["BatchNormalization(Y)", "Conv(fc)"]


def test_replaced_list_is_bounded() -> None:
    names = [f"/encoder/layer.{i}/attention/self/MatMul_{i}" for i in range(1000)]
    text = provenance.join_names(names)
    assert len(text) <= provenance.MAX_REPLACED_CHARS + len(provenance.TRUNCATED) + 1
    assert text.endswith("," + provenance.TRUNCATED)
    kept = provenance.split_names(text)
    assert kept == names[: len(kept)] and 0 < len(kept) < len(names)
    # Short lists are kept whole, in order, without repeats.
    assert provenance.join_names(["b", "a", "b"]) == "b,a"


def test_no_provenance_when_turned_off() -> None:
    model = onnx_ir.serde.deserialize_model(conv_bn_model(with_miss=False))
    rules = RuleSet([r for r in graphopt.api.builtin_rules() if r.name == "FoldConvBatchNorm"])
    assert apply_rules(OnnxView(model), rules, get_target("onnx"), Report(target="onnx"), DriverOptions(provenance=False)) == 2
    assert all(not node.metadata_props for node in model.graph)
    np.testing.assert_equal(len(list(model.graph)), 4)


def test_tag_new_nodes_reaches_subgraphs_and_functions() -> None:
    # Nodes a pass adds inside an If branch and a function body are tagged; the ones there before are not.
    import onnx_ir as ir

    from graphopt.ir.provenance import PASS_KEY, tag_new_nodes

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    cond = ir.Value(name="cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    then_old = ir.Node("", "Relu", [x], name="then_relu")
    then_graph = ir.Graph([], [then_old.outputs[0]], nodes=[then_old], name="then")
    else_old = ir.Node("", "Neg", [x], name="else_neg")
    else_graph = ir.Graph([], [else_old.outputs[0]], nodes=[else_old], name="else")
    branch = ir.Node("", "If", [cond], attributes=[ir.AttrGraph("then_branch", then_graph), ir.AttrGraph("else_branch", else_graph)], name="if")
    graph = ir.Graph([x, cond], [branch.outputs[0]], nodes=[branch], name="main", opset_imports={"": 17})
    fx = ir.Value(name="fx")
    body_old = ir.Node("", "Abs", [fx], name="abs")
    function = ir.Function("local", "F", "", graph=ir.Graph([fx], [body_old.outputs[0]], nodes=[body_old], opset_imports={"": 17}), attributes=[])
    model = ir.Model(graph, ir_version=8, functions=[function])
    with tag_new_nodes(model, "demo"):
        new_else = ir.Node("", "Identity", [else_old.outputs[0]], name="else_new")
        else_graph.append(new_else)
        new_body = ir.Node("", "Identity", [body_old.outputs[0]], name="body_new")
        function.append(new_body)
    assert new_else.metadata_props.get(PASS_KEY) == "demo"
    assert new_body.metadata_props.get(PASS_KEY) == "demo"
    assert all(PASS_KEY not in n.metadata_props for n in (then_old, else_old, body_old, branch))
