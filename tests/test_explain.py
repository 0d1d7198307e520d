"""`graphopt explain`: per rule and candidate node, why the rule applied or which check
stopped it, where, and what to do about it; --rule / --node filters; nothing written."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import models
import onnx
import onnx_ir as ir
import pytest
from conftest import run_cli
from onnx import TensorProto, helper
from rule_testing import init, make_model, rand

from graphopt.api import OptimizeOptions
from graphopt.errors import GraphoptError
from graphopt.explain import APPLIED, NOT_APPLIED, NOT_TRIED, explain, pin_input_shapes

F = TensorProto.FLOAT


def near_miss_model() -> onnx.ModelProto:
    """Three Conv + BatchNormalization pairs from one input: one folds; one BN is in training
    mode; one Conv also feeds a Relu (a second user, so folding would compute it twice)."""
    nodes, inits, outputs = [], [], []
    for prefix, bn_attrs in (("ok", {}), ("train", {"training_mode": 1}), ("shared", {})):
        nodes.append(helper.make_node("Conv", ["x", f"w_{prefix}"], [f"c_{prefix}_out"], name=f"c_{prefix}"))
        params = [f"{p}_{prefix}" for p in ("g", "b", "m", "v")]
        # Training mode has the running mean and variance as outputs too (a valid model, as onnxruntime wants).
        bn_outputs = [f"y_{prefix}"] + ([f"mean_{prefix}", f"var_{prefix}"] if bn_attrs else [])
        nodes.append(helper.make_node("BatchNormalization", [f"c_{prefix}_out", *params], bn_outputs, name=f"bn_{prefix}", **bn_attrs))
        inits += [init(f"w_{prefix}", rand(4, 3, 1, 1)), *(init(p, rand(4, positive=p.startswith("v"))) for p in params)]
        outputs.append(helper.make_tensor_value_info(f"y_{prefix}", F, None))
    nodes.append(helper.make_node("Relu", ["c_shared_out"], ["side"], name="r_side"))
    outputs.append(helper.make_tensor_value_info("side", F, None))
    return make_model(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, 4, 4])], outputs, inits)


@pytest.fixture
def near_miss_path(tmp_path: Path) -> Path:
    path = tmp_path / "near_miss.onnx"
    onnx.save(near_miss_model(), str(path))
    return path


def test_sites_say_applied_or_the_failing_check(near_miss_path: Path) -> None:
    explanation = explain(near_miss_path, rules=["FoldConvBatchNorm"])
    assert [r.name for r in explanation.rules] == ["FoldConvBatchNorm"]
    sites = {s.node: s for s in explanation.rules[0].sites}
    assert set(sites) == {"bn_ok", "bn_train", "bn_shared"}
    ok, train, shared = sites["bn_ok"], sites["bn_train"], sites["bn_shared"]
    assert ok.status == APPLIED and ok.rewrite == explanation.report.applied[0].index
    assert set(ok.removed) == {"bn_ok", "c_ok"} and ok.added == ("Conv",)
    assert train.status == NOT_APPLIED and train.reason == "attribute training_mode = 1, pattern wants 0"
    assert shared.status == NOT_APPLIED and shared.failed_at == "c_shared"
    assert "has another user, r_side" in shared.reason and shared.hint and "outside the pattern" in shared.hint


def test_cli_prints_rule_node_check_and_hint_and_writes_nothing(near_miss_path: Path) -> None:
    folder = near_miss_path.parent
    before = sorted(p.name for p in folder.iterdir())
    model_bytes = near_miss_path.read_bytes()
    result = run_cli("explain", near_miss_path, "--rule", "FoldConvBatchNorm", cwd=folder)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "FoldConvBatchNorm" in out and "root op BatchNormalization" in out
    assert "applied      bn_ok: rewrite #" in out
    assert "not applied  bn_train: attribute training_mode = 1, pattern wants 0" in out
    assert "not applied  bn_shared: interior node c_shared has another user, r_side, at c_shared" in out
    assert "hint: an intermediate value is also used outside the pattern" in out
    assert "1 rules, 3 sites: 1 applied, 2 not applied, 0 not tried" in out
    assert sorted(p.name for p in folder.iterdir()) == before  # no model, no report
    assert near_miss_path.read_bytes() == model_bytes


def test_node_filter_matches_any_node_of_the_tried_subgraph(near_miss_path: Path) -> None:
    # c_shared is no rule's root here, but the BatchNormalization rules tried it as their Conv.
    explanation = explain(near_miss_path, nodes=["c_shared"])
    assert explanation.rules
    for rule in explanation.rules:
        assert rule.sites and all("c_shared" in site.names() for site in rule.sites)
    assert "FoldConvBatchNorm" in {r.name for r in explanation.rules}
    assert {s.node for r in explanation.rules for s in r.sites} <= {"bn_shared", "c_shared", "r_side"}
    result = run_cli("explain", near_miss_path, "--node", "bn_train", "--rule", "FoldConvBatchNorm")
    assert result.returncode == 0, result.stderr
    assert "bn_train" in result.stdout and "bn_ok" not in result.stdout and "bn_shared" not in result.stdout


def test_unknown_names_and_bad_models_exit_2(near_miss_path: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x12\x34 definitely not protobuf")
    cases = [
        (("explain", near_miss_path, "--rule", "FoldConvBatchNorn"), "unknown rule 'FoldConvBatchNorn' (did you mean 'FoldConvBatchNorm'"),
        (("explain", near_miss_path, "--node", "bn_trian"), "unknown node 'bn_trian' (did you mean 'bn_train'"),
        (("explain", tmp_path / "missing.onnx"), "no such file"),
        (("explain", garbage), "not a valid ONNX model"),
        (("explain", near_miss_path, "--input-shape", "nope=1,3,4,4"), "not a model input"),
    ]
    for args, message in cases:
        result = run_cli(*args)
        assert result.returncode == 2, (args, result.stdout)
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert result.stdout == ""


def test_pinned_input_shapes_replace_symbolic_dims_everywhere() -> None:
    model = ir.serde.deserialize_model(
        make_model(
            [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "z"], ["y"], name="add")],
            [helper.make_tensor_value_info("x", F, ["N", 3]), helper.make_tensor_value_info("z", F, ["N", 3])],
            [helper.make_tensor_value_info("y", F, ["N", 3])],
            value_info=[helper.make_tensor_value_info("r", F, ["N", 3])],
        )
    )
    pin_input_shapes(model, {"x": [2, 3]})
    shapes = {v.name: list(v.shape) for v in [*model.graph.inputs, *model.graph.outputs, *(o for n in model.graph for o in n.outputs)]}
    assert shapes == {"x": [2, 3], "z": [2, 3], "r": [2, 3], "y": [2, 3]}
    with pytest.raises(GraphoptError, match="rank 2, not 3"):
        pin_input_shapes(model, {"x": [2, 3, 4]})
    with pytest.raises(GraphoptError, match="fixed at 3, not 5"):
        pin_input_shapes(model, {"z": [2, 5]})


# ------------------------------------------------------------------ tiny BERT


@functools.cache
def bert_explanation():
    return explain(models.ZOO["bert-tiny-dynamo"](), OptimizeOptions(target="ort-cpu"))


def test_bert_applied_sites_are_the_reports_rewrites() -> None:
    explanation = bert_explanation()
    report = explanation.report
    applied = sorted((s.rewrite, s.rule) for r in explanation.rules for s in r.sites if s.status == APPLIED)
    assert applied == [(r.index, r.rule) for r in report.applied]
    assert "FuseAttention" in {rule for _, rule in applied}
    # Each site once, even where the sweeps tried it again.
    keys = Counter((s.rule, s.scope, s.node) for r in explanation.rules for s in r.sites)
    assert max(keys.values()) == 1
    assert report.sweeps > 1 and any(s.attempts > 1 for r in explanation.rules for s in r.sites)
    statuses = Counter(s.status for r in explanation.rules for s in r.sites)
    assert statuses[NOT_APPLIED] and statuses[NOT_TRIED]
    for rule in explanation.rules:
        for site in rule.sites:
            assert site.status == APPLIED or site.reason, site


def test_bert_cli_with_rule_filter() -> None:
    result = run_cli("explain", models.ZOO["bert-tiny-dynamo"](), "--target", "ort-cpu", "--rule", "FuseAttention", "--input-shape", "input_ids=1,16")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    headings = [line for line in lines if line and not line.startswith(" ") and " — " in line]
    assert [h.split(" — ")[0] for h in headings] == ["FuseAttention"]
    assert sum(line.lstrip().startswith("applied ") for line in lines) == 2  # one attention per layer
    assert any(line.lstrip().startswith("not applied ") for line in lines)
