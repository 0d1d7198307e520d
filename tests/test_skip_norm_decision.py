"""The skip_norm decision (graphopt/passes/skip_norm.py): on ort-cpu a residual Add + norm the
rules fused into com.microsoft.Skip(Simplified)LayerNormalization stays fused only where the
cost table (or --tune) says the fused kernel is faster; ort-cuda keeps the rules' output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import (
    SKIP_NORM_WINS,
    TensorProto,
    assert_same_outputs,
    helper,
    init,
    make_model,
    optimize_with,
    rand,
    skip_norm_table,
)

from graphopt.decisions import CostTable, Entry, default_table
from graphopt.decisions.shapes import norm_worlds

MS = "com.microsoft"
H = 64


def _value(name: str, shape=(2, 8, H)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def add_layer_norm(sum_used: bool = False, bias: bool = False, shape=(2, 8, H)) -> onnx.ModelProto:
    """[Add(y, bias)] + Add(., skip) -> LayerNormalization; with `sum_used` the sum also feeds a Relu (pre-LN)."""
    nodes, first = [], "a"
    if bias:
        nodes.append(helper.make_node("MatMul", ["a", "w"], ["mm"]))
        nodes.append(helper.make_node("Add", ["mm", "bias"], ["ab"]))
        first = "ab"
    nodes += [helper.make_node("Add", [first, "b"], ["s"]),
              helper.make_node("LayerNormalization", ["s", "g", "be"], ["y"], axis=-1, epsilon=1e-5)]
    outputs = [_value("y", shape)]
    if sum_used:
        nodes.append(helper.make_node("Relu", ["s"], ["r"]))
        outputs.append(_value("r", shape))
    hidden = shape[-1]
    inits = [init("g", rand(hidden)), init("be", rand(hidden))] + ([init("w", rand(hidden, hidden)), init("bias", rand(hidden))] if bias else [])
    return make_model(nodes, [_value("a", shape), _value("b", shape)], outputs, inits)


def add_rms_norm(sum_used: bool = True) -> onnx.ModelProto:
    """Add -> decomposed RMSNorm (LLaMA style), the sum also read by the next residual Add."""
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Pow", ["s", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rt"]),
        helper.make_node("Reciprocal", ["rt"], ["inv"]),
        helper.make_node("Mul", ["s", "inv"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    outputs = [_value("y")]
    if sum_used:
        nodes.append(helper.make_node("Add", ["s", "y"], ["z"]))
        outputs = [_value("z")]
    inits = [init("two", np.array(2.0, np.float32)), init("eps", np.array(1e-6, np.float32)), init("w", rand(H))]
    return make_model(nodes, [_value("a"), _value("b")], outputs, inits, opset=17)


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


def unfused_wins(op: str = "SkipLayerNormalization") -> CostTable:
    return skip_norm_table(fused_ms=2.0, unfused_ms=1.0, ops=(op,))


def test_unfused_predicted_faster_gives_back_add_and_layer_norm() -> None:
    model = add_layer_norm()
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=unfused_wins())
    assert report.rules["FuseSkipLayerNorm"].applications == 1  # the rule fused; the decision split it back
    assert _ops(optimized) == [("", "Add"), ("", "LayerNormalization")]
    assert [o.name for o in optimized.graph.output] == ["y"] and optimized.graph.node[-1].output[0] == "y"
    [decision] = report.decisions
    assert (decision.kind, decision.chosen, decision.baseline, decision.basis) == ("skip_norm", "unfused", "unfused", "table")
    # no figure for the 2-D form in this table: it is never predicted to win
    assert {a.candidate: a.predicted_ms for a in decision.alternatives} == {"fused": 2.0, "unfused": 1.0, "unfused-2d": None}
    assert "predicted no faster" in decision.reason
    assert_same_outputs(model, optimized)


def test_fused_predicted_faster_keeps_skip_layer_norm() -> None:
    model = add_layer_norm()
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=SKIP_NORM_WINS)
    assert _ops(optimized) == [(MS, "SkipLayerNormalization")]
    [decision] = report.decisions
    assert (decision.chosen, decision.basis) == ("fused", "table") and "predicted 0.5 ms against 1 ms" in decision.reason
    assert_same_outputs(model, optimized)
    # Faster, but within the noise margin: no evidence, the unfused form stays.
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=skip_norm_table(0.99, 1.0))
    assert _ops(optimized) == [("", "Add"), ("", "LayerNormalization")]


def test_no_entry_keeps_the_unfused_form() -> None:
    model = add_layer_norm()
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=CostTable([]))
    assert _ops(optimized) == [("", "Add"), ("", "LayerNormalization")]
    [decision] = report.decisions
    assert (decision.chosen, decision.basis) == ("unfused", "no_entry")
    assert "no measured entry for SkipLayerNormalization f32 sum-unused no-bias r5-48 h1-128" in decision.reason
    # An entry for another class (hidden 4096 only) predicts nothing for hidden 64.
    other = CostTable([Entry("CPUExecutionProvider", "skip_norm", "SkipLayerNormalization", "f32", {"hidden": ("h3073+",)},
                             {"fused": 0.1, "unfused": 1.0}, source="test")])
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=other)
    assert _ops(optimized) == [("", "Add"), ("", "LayerNormalization")] and report.decisions[0].basis == "no_entry"


def test_the_sum_used_elsewhere_goes_to_its_readers() -> None:
    # Pre-LN stream: the sum feeds a Relu too; split, the Add's output is what the Relu reads.
    model = add_layer_norm(sum_used=True)
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=unfused_wins())
    assert _ops(optimized) == [("", "Add"), ("", "LayerNormalization"), ("", "Relu")]
    add, norm, relu = optimized.graph.node
    assert norm.input[0] == add.output[0] == relu.input[0]
    assert report.decisions[0].basis == "table"
    _, unmeasured = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=CostTable([]))
    assert "SkipLayerNormalization f32 sum-used no-bias r5-48 h1-128" in unmeasured.decisions[0].reason
    assert_same_outputs(model, optimized)
    kept, _ = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=SKIP_NORM_WINS)
    assert _ops(kept) == [(MS, "SkipLayerNormalization"), ("", "Relu")]
    assert_same_outputs(model, kept)


def test_a_folded_bias_comes_back_as_its_own_add() -> None:
    model = add_layer_norm(bias=True)
    rules = ["FuseSkipLayerNorm", "FoldBiasIntoSkipLayerNorm"]
    optimized, report = optimize_with(model, rules, target="ort-cpu", cost_table=unfused_wins())
    assert report.rules["FoldBiasIntoSkipLayerNorm"].applications == 1
    assert _ops(optimized) == [("", "MatMul"), ("", "Add"), ("", "Add"), ("", "LayerNormalization")]
    _, unmeasured = optimize_with(model, rules, target="ort-cpu", cost_table=CostTable([]))
    assert "SkipLayerNormalization f32 sum-unused bias r5-48 h1-128" in unmeasured.decisions[0].reason  # the bias is in the class
    assert_same_outputs(model, optimized)
    kept, _ = optimize_with(model, rules, target="ort-cpu", cost_table=SKIP_NORM_WINS)
    assert _ops(kept) == [("", "MatMul"), (MS, "SkipLayerNormalization")] and len(kept.graph.node[1].input) == 5


def test_skip_rms_norm_is_decided_the_same_way() -> None:
    model = add_rms_norm()
    rules = ["FuseRMSNorm", "FuseSkipRMSNorm"]
    optimized, report = optimize_with(model, rules, target="ort-cpu", cost_table=unfused_wins("SkipSimplifiedLayerNormalization"))
    assert report.rules["FuseSkipRMSNorm"].applications == 1
    assert _ops(optimized) == [("", "Add"), ("", "SimplifiedLayerNormalization"), ("", "Add")]
    assert report.decisions[0].chosen == "unfused"
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)
    kept, report = optimize_with(model, rules, target="ort-cpu", cost_table=SKIP_NORM_WINS)
    assert _ops(kept) == [(MS, "SkipSimplifiedLayerNormalization"), ("", "Add")] and report.decisions[0].chosen == "fused"
    assert_same_outputs(model, kept, rtol=1e-4, atol=1e-4)


def _ort_runs(model: onnx.ModelProto, tmp_path: Path) -> list[str]:
    """The ops onnxruntime's CPU provider runs after its own graph optimizations (ORT_ENABLE_ALL)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    options.log_severity_level = 4
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "ort.onnx")).graph.node]


TWO_D_WINS = CostTable([Entry("CPUExecutionProvider", "skip_norm", "SkipLayerNormalization", "f32", {},
                              {"fused": 2.0, "unfused": 2.0, "unfused-2d": 1.0}, source="test")])


@pytest.mark.parametrize("shape", [(2, 8, H), ("batch", "seq", H)])
def test_the_2d_form_keeps_onnxruntime_from_fusing_the_slow_kernel_back(tmp_path: Path, shape) -> None:
    # Where the sum has no other reader, onnxruntime fuses Add + LayerNormalization into
    # SkipLayerNormalization itself (the slow CPU kernel); normalizing a [rows, hidden] Reshape
    # of the sum it leaves alone.
    model = add_layer_norm(shape=shape)
    unfused, _ = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=unfused_wins())
    assert "SkipLayerNormalization" in _ort_runs(unfused, tmp_path)
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=TWO_D_WINS)
    [decision] = report.decisions
    assert (decision.chosen, decision.baseline, decision.basis) == ("unfused-2d", "unfused", "table")
    expected = ["Add", "Reshape", "LayerNormalization", "Reshape"] if isinstance(shape[0], int) else \
        ["Add", "Reshape", "LayerNormalization", "Shape", "Reshape"]
    assert [n.op_type for n in optimized.graph.node] == expected
    assert [n.op_type for n in optimized.graph.node if n.name == "LayerNormalization(y)"] == ["LayerNormalization"]
    assert "SkipLayerNormalization" not in _ort_runs(optimized, tmp_path)
    assert_same_outputs(model, optimized, shapes={"a": (2, 8, H), "b": (2, 8, H)})
    # Predicted no faster than the plain unfused form: that stays.
    same = CostTable([Entry("CPUExecutionProvider", "skip_norm", "SkipLayerNormalization", "f32", {},
                            {"fused": 2.0, "unfused": 1.0, "unfused-2d": 0.99}, source="test")])
    kept, _ = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=same)
    assert [n.op_type for n in kept.graph.node] == ["Add", "LayerNormalization"]


def test_skip_rms_norm_has_no_2d_candidate() -> None:
    # onnxruntime fuses no Add + SimplifiedLayerNormalization back on the CPU provider.
    _, report = optimize_with(add_rms_norm(), ["FuseRMSNorm", "FuseSkipRMSNorm"], target="ort-cpu", cost_table=CostTable([]))
    assert [a.candidate for a in report.decisions[0].alternatives] == ["fused", "unfused"]


def test_ort_cuda_keeps_the_fused_op_and_makes_no_decision() -> None:
    model = add_layer_norm(sum_used=True)
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cuda", cost_table=unfused_wins())
    assert _ops(optimized) == [(MS, "SkipLayerNormalization"), ("", "Relu")]
    assert [d.kind for d in report.decisions if d.kind == "skip_norm"] == []


def test_a_fused_op_the_input_had_is_left_alone() -> None:
    # The baseline is the model as it came: a SkipLayerNormalization no rule made stays.
    nodes = [helper.make_node("SkipLayerNormalization", ["a", "b", "g", "be"], ["y"], domain=MS, epsilon=1e-5)]
    model = make_model(nodes, [_value("a"), _value("b")], [_value("y")], [init("g", rand(H)), init("be", rand(H))])
    model.opset_import.append(helper.make_opsetid(MS, 1))
    optimized, report = optimize_with(model, None, target="ort-cpu", cost_table=unfused_wins())
    assert _ops(optimized) == [(MS, "SkipLayerNormalization")] and report.decisions == []


def test_shipped_table_splits_where_measured_slower_on_the_cpu() -> None:
    # benchmarks/results/ort_cpu_norms-2026-11-27-cpu2core.json: with the sum read elsewhere the
    # fused CPU kernel lost in every measured class (1x128x768: 532 against 84 us).
    model = add_layer_norm(sum_used=True, shape=(1, 128, 768))
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu")
    assert _ops(optimized) == [("", "Add"), ("", "LayerNormalization"), ("", "Relu")]
    [decision] = report.decisions
    assert (decision.chosen, decision.basis) == ("unfused", "table")
    predicted = {a.candidate: a.predicted_ms for a in decision.alternatives}
    assert predicted["fused"] > 2 * predicted["unfused"]
    assert all("ort_cpu_norms" in a.source for a in decision.alternatives if a.candidate in ("fused", "unfused"))
    assert predicted["unfused-2d"] is None  # onnxruntime fuses nothing back here: not measured, never chosen
    assert_same_outputs(model, optimized, feeds={"a": rand(1, 128, 768), "b": rand(1, 128, 768)})


def test_shipped_table_takes_the_2d_form_where_onnxruntime_would_fuse_back() -> None:
    # Post-LN (BERT): the sum has no other reader, onnxruntime would fuse Add + LayerNormalization
    # into its slow kernel (1x128x768: 491 us); the 2-D form runs in 77 us.
    model = add_layer_norm(shape=(1, 128, 768))
    optimized, report = optimize_with(model, ["FuseSkipLayerNorm"], target="ort-cpu")
    assert [n.op_type for n in optimized.graph.node] == ["Add", "Reshape", "LayerNormalization", "Reshape"]
    [decision] = report.decisions
    assert (decision.chosen, decision.basis) == ("unfused-2d", "table")
    predicted = {a.candidate: a.predicted_ms for a in decision.alternatives}
    assert predicted["unfused-2d"] < 0.5 * predicted["unfused"] and predicted["fused"] == predicted["unfused"]
    assert_same_outputs(model, optimized, feeds={"a": rand(1, 128, 768), "b": rand(1, 128, 768)})


def test_symbolic_rows_must_win_in_every_row_bucket() -> None:
    worlds = norm_worlds("SkipLayerNormalization", "f32", ["batch", "seq", 768], bias=False, sum_used=True)
    assert worlds is not None and len(worlds) == 5
    assert {dict(w[0].features)["rows"] for w in worlds} == {"r1-4", "r5-48", "r49-384", "r385-2048", "r2049+"}
    assert norm_worlds("SkipLayerNormalization", "f32", [2, 8, "hidden"], bias=False, sum_used=True) is None
    # Fused predicted faster at few rows only: a model whose row count is unknown stays unfused.
    few_rows = CostTable([
        Entry("CPUExecutionProvider", "skip_norm", "SkipLayerNormalization", "f32", {"rows": ("r5-48",)}, {"fused": 0.5, "unfused": 1.0}, source="test"),
        Entry("CPUExecutionProvider", "skip_norm", "SkipLayerNormalization", "f32", {}, {"fused": 2.0, "unfused": 1.0}, source="test"),
    ])
    fixed, _ = optimize_with(add_layer_norm(), ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=few_rows)
    assert _ops(fixed) == [(MS, "SkipLayerNormalization")]  # 2 x 8 = 16 rows
    symbolic = add_layer_norm(shape=("batch", "seq", H))
    out, report = optimize_with(symbolic, ["FuseSkipLayerNorm"], target="ort-cpu", cost_table=few_rows)
    assert _ops(out) == [("", "Add"), ("", "LayerNormalization")] and report.decisions[0].basis == "table"


class FakeTimer:
    def __init__(self, fused: float, unfused: float, two_d: float = 9.0) -> None:
        self.fused, self.unfused, self.two_d, self.calls = fused, unfused, two_d, 0

    def __call__(self, model: bytes, feeds, provider: str) -> float:
        import onnxruntime as ort

        self.calls += 1
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, dict(feeds))  # the candidate must run
        proto = onnx.ModelProto()
        proto.ParseFromString(model)
        ops = {n.op_type for n in proto.graph.node}
        return self.fused if any(op.startswith("Skip") for op in ops) else self.two_d if "Reshape" in ops else self.unfused


@pytest.mark.parametrize("sum_used", [False, True])
def test_tune_times_both_forms_on_the_cpu_provider(tmp_path: Path, sum_used: bool) -> None:
    model = add_layer_norm(sum_used=sum_used, bias=True)
    rules = ["FuseSkipLayerNorm", "FoldBiasIntoSkipLayerNorm"]
    timer = FakeTimer(fused=1.0, unfused=2.0)
    tuned, report = optimize_with(model, rules, target="ort-cpu", tune=True, tune_timer=timer, tune_cache=str(tmp_path / "c.json"),
                                  cost_table=unfused_wins())
    assert timer.calls == 3 and report.decisions[0].basis == "measured" and report.decisions[0].chosen == "fused"
    assert {a.candidate: a.measured_ms for a in report.decisions[0].alternatives} == {"fused": 1.0, "unfused": 2.0, "unfused-2d": 9.0}
    assert (MS, "SkipLayerNormalization") in _ops(tuned)
    assert_same_outputs(model, tuned)
    slow = FakeTimer(fused=3.0, unfused=1.0)
    tuned, report = optimize_with(model, rules, target="ort-cpu", tune=True, tune_timer=slow, tune_cache=str(tmp_path / "d.json"),
                                  cost_table=SKIP_NORM_WINS)
    assert report.decisions[0].chosen == "unfused" and (MS, "SkipLayerNormalization") not in _ops(tuned)
    assert_same_outputs(model, tuned)
    two_d = FakeTimer(fused=3.0, unfused=2.0, two_d=1.0)
    tuned, report = optimize_with(model, rules, target="ort-cpu", tune=True, tune_timer=two_d, tune_cache=str(tmp_path / "e.json"),
                                  cost_table=SKIP_NORM_WINS)
    assert report.decisions[0].chosen == "unfused-2d" and ("", "Reshape") in _ops(tuned)
    assert_same_outputs(model, tuned)


def test_the_shipped_entries_say_where_they_were_measured() -> None:
    entries = [e for e in default_table().entries if e.decision == "skip_norm"]
    assert entries and all(e.ep == "CPUExecutionProvider" for e in entries)
    assert all("ort_cpu_norms" in e.source and e.device.startswith("cpu-2core") for e in entries)
    assert {e.op for e in entries} == {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}


def test_float16_on_the_cpu_keeps_the_fused_op_and_says_why() -> None:
    # The CPU provider has no float16 Add: the unfused form cannot run there, whatever the table says.
    model = add_layer_norm(sum_used=True)
    optimized, report = optimize_with(model, None, target="ort-cpu", precision="fp16", cost_table=unfused_wins())
    assert (MS, "SkipLayerNormalization") in _ops(optimized)
    [decision] = [d for d in report.decisions if d.kind == "skip_norm"]
    assert decision.chosen == "fused" and "no Add kernel for f16" in decision.reason
