"""`graphopt diff`: nodes removed, added and changed between two models, grouped by the
rewrite that made them where the second model carries graphopt's provenance."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import onnx_ir as ir
from conftest import conv_bn_model, run_cli
from onnx import TensorProto, helper, numpy_helper
from rule_testing import init, make_model, rand

import graphopt
from graphopt.diff import OTHER, REWRITE, diff_files, diff_models

F = TensorProto.FLOAT


def _optimized(tmp_path: Path, model: onnx.ModelProto, **options) -> tuple[Path, Path, graphopt.report.model.Report]:
    before, after = tmp_path / "before.onnx", tmp_path / "after.onnx"
    onnx.save(model, str(before))
    optimized, report = graphopt.optimize(model, **options)
    onnx.save(optimized, str(after))
    return before, after, report


def test_groups_match_the_reports_rewrites(tmp_path: Path) -> None:
    before, after, report = _optimized(tmp_path, conv_bn_model())
    result = diff_files(before, after)
    rewrites = {g.rewrite: g for g in result.groups if g.kind == REWRITE}
    assert set(rewrites) == {r.index for r in report.applied} and len(rewrites) == 3
    for record in report.applied:
        group = rewrites[record.index]
        assert group.rule == record.rule
        assert Counter(e.op for e in group.added) == Counter(record.added)
        assert len(group.removed) == record.removed
        assert {e.name for e in group.removed} == set(record.matched)
    assert result.count("added") == sum(len(r.added) for r in report.applied)
    assert result.count("removed") == sum(r.removed for r in report.applied)
    assert not [g for g in result.groups if g.kind == OTHER]  # every difference is explained
    assert result.summary().startswith("6 removed, 4 added, 0 changed")


def test_cli_text_and_json(tmp_path: Path) -> None:
    before, after, report = _optimized(tmp_path, conv_bn_model())
    text = run_cli("diff", before, after)
    assert text.returncode == 0, text.stderr
    assert "rewrite #1 FoldConvBatchNormComputedWeights: 2 removed, 2 added" in text.stdout
    assert "- bn3" in text.stdout and "BatchNormalization" in text.stdout
    assert "6 removed, 4 added, 0 changed" in text.stdout
    as_json = run_cli("diff", before, after, "--json")
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["schema"] == "graphopt.diff" and document["summary"] == {"removed": 6, "added": 4, "changed": 0}
    rules = {g["rewrite"]: g["rule"] for g in document["groups"] if g["kind"] == "rewrite"}
    assert rules == {r.index: r.rule for r in report.applied}


def test_model_without_provenance_still_diffs(tmp_path: Path) -> None:
    before, after, _ = _optimized(tmp_path, conv_bn_model())
    stripped = onnx.load(str(after))
    for node in stripped.graph.node:
        del node.metadata_props[:]
    plain = tmp_path / "plain.onnx"
    onnx.save(stripped, str(plain))
    result = diff_files(before, plain)
    assert [g.kind for g in result.groups] == [OTHER]
    # Without provenance, the folded Convs (which keep their names) are changed nodes.
    assert (result.count("removed"), result.count("added"), result.count("changed")) == (3, 1, 3)
    assert not result.provenance and "no graphopt provenance" in result.summary()


def test_identical_models_give_an_empty_diff(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_model(), str(path))
    result = run_cli("diff", path, path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no differences in nodes"
    document = json.loads(run_cli("diff", path, path, "--json").stdout)
    assert document["summary"] == {"removed": 0, "added": 0, "changed": 0} and document["groups"] == []


def test_changed_nodes_name_what_changed() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["s"], name="softmax", axis=1),
        helper.make_node("Identity", ["s"], ["y"], name="out"),
    ]
    io = ([helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])
    a = make_model(nodes, *io)
    b = make_model(
        [
            helper.make_node("Sigmoid", ["x"], ["r"], name="relu"),  # same name, another op
            helper.make_node("Softmax", ["r"], ["s"], name="softmax", axis=0),  # another attribute
            helper.make_node("Identity", ["r"], ["y"], name="out"),  # another input
            helper.make_node("Identity", ["s"], ["unused"], name="extra"),
        ],
        *io,
    )
    result = diff_models(ir.serde.deserialize_model(a), ir.serde.deserialize_model(b))
    changes = {c.name: c.fields for g in result.groups for c in g.changed}
    assert changes == {"relu": ["op"], "softmax": ["attributes"], "out": ["inputs"]}
    assert [e.name for g in result.groups for e in g.added] == ["extra"] and result.count("removed") == 0


def _if_model() -> onnx.ModelProto:
    then_nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="t_conv"),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["t_out"], name="t_bn"),
    ]
    then_graph = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("t_out", F, None)])
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e_out"], name="e_id")], "else", [], [helper.make_tensor_value_info("e_out", F, None)]
    )
    inits = [init("w", rand(4, 4, 1, 1)), init("g", rand(4)), init("b", rand(4)), init("m", rand(4)), init("v", rand(4, positive=True))]
    return make_model(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph, name="if")],
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [1, 4, 3, 3])],
        [helper.make_tensor_value_info("y", F, None)],
        inits,
    )


def test_subgraph_nodes_are_diffed_in_their_scope(tmp_path: Path) -> None:
    before, after, report = _optimized(tmp_path, _if_model(), enable=["FoldConvBatchNorm"])
    assert [r.rule for r in report.applied] == ["FoldConvBatchNorm"]
    result = diff_files(before, after)
    group = next(g for g in result.groups if g.kind == REWRITE)
    assert {(e.scope, e.name) for e in group.removed} == {("main/if.then_branch", "t_conv"), ("main/if.then_branch", "t_bn")}
    assert all(e.scope == "main/if.then_branch" for e in group.added)
    assert "Conv" in [e.op for e in group.added]
    # The If itself is unchanged: its branches are compared node by node.
    assert not [c for g in result.groups for c in g.changed if c.name == "if"]


def test_function_bodies_are_diffed(tmp_path: Path) -> None:
    c = 3
    weights = (("fw", rand(c, c, 1, 1)), ("fg", rand(c)), ("fb", rand(c)), ("fm", rand(c)), ("fv", rand(c, positive=True)))
    body = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)) for name, array in weights]
    body += [helper.make_node("Conv", ["X", "fw"], ["fc"]), helper.make_node("BatchNormalization", ["fc", "fg", "fb", "fm", "fv"], ["Y"])]
    function = helper.make_function("local", "ConvBN", ["X"], ["Y"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("ConvBN", ["x"], ["y"], domain="local", name="call")],
        "main",
        [helper.make_tensor_value_info("x", F, [1, c, 2, 2])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)], ir_version=8)
    before, after, report = _optimized(tmp_path, model, enable=["FoldConvBatchNorm"])
    assert [r.rule for r in report.applied] == ["FoldConvBatchNorm"]
    result = diff_files(before, after)
    scope = "function:local.ConvBN"
    group = next(g for g in result.groups if g.kind == REWRITE)
    assert {(e.scope, e.name) for e in group.removed} == {(scope, "Conv(fc)"), (scope, "BatchNormalization(Y)")}
    assert Counter(e.op for e in group.added) == Counter({"Conv": 1, "Constant": 2}) and {e.scope for e in group.added} == {scope}
    # The weights' Constant nodes went with constant folding, which no rewrite stands for.
    other = next(g for g in result.groups if g.kind == OTHER)
    assert {(e.scope, e.name) for e in other.removed} == {(scope, f"Constant({name})") for name, _ in weights}


def test_bad_input_exits_2(tmp_path: Path) -> None:
    good = tmp_path / "good.onnx"
    onnx.save(conv_bn_model(), str(good))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07not a model at all")
    for args in ((good, tmp_path / "missing.onnx"), (garbage, good)):
        result = run_cli("diff", *args)
        assert result.returncode == 2
        assert result.stderr.startswith("error: ") and result.stdout == ""


def test_removals_go_to_the_rewrite_that_made_them(tmp_path: Path) -> None:
    # The README's example: a Cast pair collapsed (#k CollapseCastChain, into a new Cast) and then
    # dropped as a no-op (DropNoOpCast, which inserts nothing), the flatten's target computed from
    # Shape/Gather/Concat made a constant (ConstantReshapeTarget: the whole chain goes with it).
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_example", Path(__file__).resolve().parent.parent / "examples" / "make_example.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    before, after, report = _optimized(tmp_path, example.build())
    result = diff_files(before, after)
    removed = {entry.name: group.rule for group in result.groups for entry in group.removed}
    changed = {change.name: group.rule for group in result.groups for change in group.changed}
    by_rule = {rule.name: [rw.matched for rw in rule.rewrites] for rule in report.rules.values() if rule.rewrites}
    assert by_rule["CollapseCastChain"] == [["to_f32", "to_f64"]]
    assert removed["to_f32"] == removed["to_f64"] == "CollapseCastChain"  # not MatMulAddToGemm, not DropNoOpCast
    assert removed["flatten.chan"] == removed["flatten.concat"] == "ConstantReshapeTarget"  # not "not from a rewrite"
    assert "flatten.concat" not in changed
    assert removed["fc.matmul"] == removed["fc.add"] == "MatMulAddToGemm"
    # The folded Convs keep their names, and are still the rewrite's new nodes in the diff.
    added = {entry.name: group.rule for group in result.groups for entry in group.added}
    assert added["layer1.a.conv"] == removed["layer1.a.conv"] == "FoldConvBatchNorm"
    # Every removal the report made is attributed to the rule that made it.
    for rule, sites in by_rule.items():
        for matched in sites:
            for name in matched:
                if name in removed:  # an input node (not one an earlier rewrite made)
                    assert removed[name] == rule, (name, removed[name], rule)
    assert "not from a rewrite" not in [group.title for group in result.groups]
