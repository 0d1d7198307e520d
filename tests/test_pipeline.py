"""graphopt/pipeline.py: the one sweep loop both front doors run, here on an ONNX view and on
an FX view alike (fold, rules, again until a fixpoint; limits reported, never fatal)."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from graphopt.api import builtin_rules
from graphopt.ir.fx_view import FxView
from graphopt.ir.onnx_view import OnnxView
from graphopt.match.driver import DriverOptions, RuleSet
from graphopt.ops import torch_lowering
from graphopt.ops.targets import get_target
from graphopt.passes import fx_passes
from graphopt.pipeline import GraphKind, Pipeline
from graphopt.report.model import Report
from graphopt.torch_backend import trace_to_aten

CAST_RULES = RuleSet([r for r in builtin_rules() if r.name in ("CollapseCastChain", "DropNoOpCast")])


def _onnx_kind() -> GraphKind:
    """x -> Cast(f64) -> Cast(f32) -> Add(x, 1 + 1): one cast chain, one foldable Add."""
    nodes = [
        helper.make_node("Cast", ["x"], ["d"], to=TensorProto.DOUBLE),
        helper.make_node("Cast", ["d"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["one", "one"], ["two"]),
        helper.make_node("Add", ["f", "two"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [numpy_helper.from_array(torch.ones(1).numpy(), "one")])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    from graphopt import passes

    view = OnnxView(model)
    return GraphKind(view, fold=[("constant_folding", lambda: passes.fold_constants(view))])


def _fx_kind() -> GraphKind:
    from torch._subclasses.fake_tensor import FakeTensorMode

    one = torch.ones(1)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    gm = trace_to_aten(lambda x: x.double().float() + (one + one), [mode.from_tensor(torch.randn(2))], mode)
    view = FxView(gm, mode)
    return GraphKind(view, fold=[("constant_folding", lambda: fx_passes.fold_constants(gm, view.add_constant, 1 << 20))], refresh=view.refresh)


KINDS = {"onnx": (_onnx_kind, lambda: get_target("onnx")), "fx": (_fx_kind, lambda: torch_lowering.torch_target())}


def _pipeline(kind: str, **options: Any) -> Pipeline:
    make_kind, make_target = KINDS[kind]
    target = make_target()
    return Pipeline(make_kind(), CAST_RULES, target, Report(target=target.name), **options)


@pytest.mark.parametrize("kind", KINDS)
def test_sweeps_fold_and_rewrite_until_a_fixpoint(kind: str) -> None:
    pipeline = _pipeline(kind)
    pipeline.sweep()
    report = pipeline.report
    assert report.rules["CollapseCastChain"].applications == 1 and report.rules["DropNoOpCast"].applications == 1
    assert report.passes["constant_folding"].changes >= 1  # 1 + 1 folded in the first sweep
    assert report.sweeps == 2  # the second sweep changed nothing: fixpoint
    assert report.passes["constant_folding"].runs == 2
    assert not report.limit_reached and report.warnings == []


@pytest.mark.parametrize("kind", KINDS)
def test_rewrite_budget_is_one_for_all_sweeps_and_is_reported(kind: str) -> None:
    pipeline = _pipeline(kind, driver=DriverOptions(max_rewrites=1))
    pipeline.sweep()
    report = pipeline.report
    assert sum(s.applications for s in report.rules.values()) == 1
    assert report.limit_reached
    assert report.warnings == ["rewrite limit reached; the result is valid but may not be fully optimized"]


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_limit_is_reported_not_fatal(kind: str) -> None:
    pipeline = _pipeline(kind, max_sweeps=1)
    pipeline.sweep()
    report = pipeline.report
    assert report.sweeps == 1 and report.limit_reached
    assert report.warnings == ["stopped after 1 sweeps without reaching a fixpoint"]
