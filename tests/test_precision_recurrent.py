"""The recurrent ops' precision decision (graphopt/passes/precision_recurrent.py): with
`--precision fp16` on ort-cuda, the model's LSTM/GRU/RNN stay float32 (the original's form)
unless the cost table predicts (or --tune measures) fp16 faster, at every batch size the model
allows; with no entry they convert as asked.

Issue 14: paddle-crnn (conv backbone + two bidirectional LSTMs) ran 1.034x its float32
original in fp16 on an H100. The tables here are fakes; the shipped table has no
`recurrent_precision` entry yet (benchmarks/decisions_bench.py --decisions recurrent_precision
measures them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from rule_testing import TensorProto, helper, init, make_model, optimize_with, rand

from graphopt.decisions import CostTable, Entry
from graphopt.decisions.shapes import recurrent_worlds

CUDA = "CUDAExecutionProvider"
T, HIDDEN, CLASSES = 12, 8, 5
LSTM_B1 = {"hidden": ["h1-96"], "direction": ["bidirectional"], "sequence": ["s1-50"], "batch": ["b1"]}
CONV_B1 = {"kind": ["dense"], "kernel": ["k3"], "channels": ["c1-32"], "batch": ["b1"]}
FP16_SLOWER = {"fp32": 1.0, "fp16": 1.5}
FP16_FASTER = {"fp32": 1.0, "fp16": 0.5}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def table(times: dict[str, float], *, op: str = "LSTM", match: dict | None = None, convs: dict[str, float] | None = None,
          extra: tuple[Entry, ...] = ()) -> CostTable:
    entries = [Entry(CUDA, "recurrent_precision", op, "f32", match or LSTM_B1, times, per=1, source="test"), *extra]
    if convs is not None:
        entries.append(Entry(CUDA, "precision", "Conv", "f32", CONV_B1, {**convs, "fp32-nhwc": convs["fp32"], "fp16-nhwc": convs["fp16"]},
                             per=1, source="test"))
    return CostTable(entries)


def crnn(op: str = "LSTM", batch: int | str = 1, head: str = "gemm") -> onnx.ModelProto:
    """A tiny CRNN: Conv + Relu over [batch, 3, 4, T], the columns as a sequence (Reshape,
    Transpose to [T, batch, 32]), a bidirectional recurrent op, its two directions side by side
    (Transpose, Reshape to [T * batch, 16]) and a Gemm head; or (`head="matmul"`, paddle-crnn's
    form) the directions side by side per step ([T, batch, 16]), a MatMul + bias, a Softmax."""
    gates = _GATES[op]
    if head == "matmul":
        model = crnn(op, batch)
        graph = model.graph
        del graph.node[-1]
        graph.node.extend([helper.make_node("MatMul", ["rows", "wm"], ["logits"], name="head"),
                           helper.make_node("Add", ["logits", "bh"], ["scores"], name="head_bias"),
                           helper.make_node("Softmax", ["scores"], ["y"], axis=-1, name="probabilities")])
        graph.initializer.extend([init("wm", rand(2 * HIDDEN, CLASSES) * 0.3)])
        [shape] = [t for t in graph.initializer if t.name == "to_rows"]
        shape.CopyFrom(init("to_rows", np.array([T, -1, 2 * HIDDEN], np.int64)))
        return model
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Reshape", ["r0", "to_columns"], ["cols"], name="columns"),
        helper.make_node("Transpose", ["cols"], ["seq"], perm=[2, 0, 1], name="to_sequence"),
        helper.make_node(op, ["seq", "W", "R", "B"], ["Y"], hidden_size=HIDDEN, direction="bidirectional", name="rnn"),
        helper.make_node("Transpose", ["Y"], ["yt"], perm=[0, 2, 1, 3], name="directions"),
        helper.make_node("Reshape", ["yt", "to_rows"], ["rows"], name="rows"),
        helper.make_node("Gemm", ["rows", "wh", "bh"], ["y"], transB=1, name="head"),
    ]
    inits = [init("w0", rand(8, 3, 3, 3) * 0.3), init("b0", rand(8) * 0.1),
             init("to_columns", np.array([0, 32, T], np.int64)), init("to_rows", np.array([-1, 2 * HIDDEN], np.int64)),
             init("W", rand(2, gates * HIDDEN, 32) * 0.2), init("R", rand(2, gates * HIDDEN, HIDDEN) * 0.2),
             init("B", rand(2, 2 * gates * HIDDEN) * 0.1), init("wh", rand(CLASSES, 2 * HIDDEN) * 0.3), init("bh", rand(CLASSES) * 0.1)]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 4, T])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=14)


def fp16(model: onnx.ModelProto, **kwargs):
    kwargs.setdefault("layout", "nchw")
    return optimize_with(model, None, target="ort-cuda", precision="fp16", **kwargs)


def weight_type(model: onnx.ModelProto, name: str) -> str:
    [tensor] = [t for t in model.graph.initializer if t.name == name or t.name.startswith(name + "_")]
    return TensorProto.DataType.Name(tensor.data_type)


def run_cpu(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def the_decision(report):
    [decision] = [d for d in report.decisions if d.kind == "recurrent_precision"]
    return decision


def casts_next_to(model: onnx.ModelProto, op: str) -> list[str]:
    """Casts that feed the `op` node or read its outputs."""
    [node] = [n for n in model.graph.node if n.op_type == op]
    producers = {o: n for n in model.graph.node for o in n.output}
    feeding = [producers[i].name for i in node.input if i in producers and producers[i].op_type == "Cast"]
    reading = [n.name for n in model.graph.node if n.op_type == "Cast" and set(n.input) & set(node.output)]
    return feeding + reading


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_table_says_fp16_slower_a_crnn_stays_wholly_float32(op: str) -> None:
    # paddle-crnn's case: the convolutions' and the recurrent ops' decisions both keep float32.
    model, x = crnn(op), rand(1, 3, 4, T)
    out, report = fp16(model, cost_table=table(FP16_SLOWER, op=op, convs=FP16_SLOWER))
    decision = the_decision(report)
    assert (decision.chosen, decision.baseline, decision.basis) == ("fp32", "fp32", "table")
    assert decision.site == f"model (1 recurrent ops: 1 {op})"
    assert "kept in float32: fp16 predicted no faster here" in decision.reason
    assert {a.candidate: a.predicted_ms for a in decision.alternatives} == pytest.approx({"fp16": 1.5, "fp32": 1.0})
    assert weight_type(out, "W") == "FLOAT" and weight_type(out, "w0") == "FLOAT"
    assert not [n for n in out.graph.node if n.op_type == "Cast"]
    conversion = report.precision_conversion
    assert {"rnn", "directions", "rows", "head"} <= set(conversion.kept_for_speed) and conversion.nodes_converted == 0
    np.testing.assert_allclose(run_cpu(out, x), run_cpu(model, x), rtol=1e-5, atol=1e-5)


def test_a_per_step_classifier_after_the_recurrence_stays_with_it() -> None:
    # paddle-crnn's head: a MatMul on [T, batch, 2 * hidden] with nothing heavy after it (a tail
    # head): it stays float32 with the recurrence rather than convert alone between two Casts.
    model, x = crnn(head="matmul"), rand(1, 3, 4, T)
    out, report = fp16(model, cost_table=table(FP16_SLOWER, convs=FP16_SLOWER))
    assert the_decision(report).chosen == "fp32" and weight_type(out, "wm") == "FLOAT"
    assert not [n for n in out.graph.node if n.op_type == "Cast"]
    assert {"head", "head_bias"} <= set(report.precision_conversion.kept_for_speed)
    np.testing.assert_allclose(run_cpu(out, x), run_cpu(model, x), rtol=1e-5, atol=1e-6)
    # When the recurrence converts, so does the head.
    out, report = fp16(model, cost_table=table(FP16_FASTER, convs=FP16_SLOWER))
    assert weight_type(out, "W") == "FLOAT16" and weight_type(out, "wm") == "FLOAT16"
    close(run_cpu(out, x), run_cpu(model, x))


def test_only_a_product_with_nothing_heavy_after_it_is_a_tail_head() -> None:
    import onnx_ir as ir

    from graphopt.passes.precision_region import tail_heads

    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"), helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "w2"], ["o"], name="second"), helper.make_node("MatMul", ["x", "x2"], ["p"], name="dynamic"),
             helper.make_node("Add", ["o", "p"], ["y"], name="sum")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4]),
                               helper.make_tensor_value_info("x2", TensorProto.FLOAT, [2, 4, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [init("w1", rand(4, 4)), init("w2", rand(4, 4))])
    graph = ir.serde.deserialize_model(model).graph
    assert {n.name for n in graph if id(n) in tail_heads(graph)} == {"second"}  # "dynamic" has no constant weight


def test_recurrent_ops_stay_float32_while_the_convolutions_convert() -> None:
    model, x = crnn(), rand(1, 3, 4, T)
    out, report = fp16(model, cost_table=table(FP16_SLOWER, convs=FP16_FASTER))
    assert the_decision(report).chosen == "fp32"
    assert [d.chosen for d in report.decisions if d.kind == "precision"] == ["fp16"]
    assert weight_type(out, "W") == "FLOAT" and weight_type(out, "w0") == "FLOAT16"
    # One Cast up into the float32 recurrence; none after it (its readers stay float32 with it).
    [into] = casts_next_to(out, "LSTM")
    assert [n for n in out.graph.node if n.name == into][0].attribute[0].i == TensorProto.FLOAT
    kept = set(report.precision_conversion.kept_for_speed)
    assert {"rnn", "directions", "rows", "head"} <= kept and not kept & {"conv0", "relu0"}
    assert report.precision_conversion.kept["speed_decision"] == len(kept)
    close(run_cpu(out, x), run_cpu(model, x))


def test_table_says_fp16_faster_recurrent_ops_convert() -> None:
    model, x = crnn(), rand(1, 3, 4, T)
    out, report = fp16(model, cost_table=table(FP16_FASTER, convs=FP16_SLOWER))
    decision = the_decision(report)
    assert (decision.chosen, decision.basis) == ("fp16", "table") and "against 1 ms for fp32" in decision.reason
    assert weight_type(out, "W") == "FLOAT16" and weight_type(out, "w0") == "FLOAT"
    assert "rnn" not in report.precision_conversion.kept_for_speed
    close(run_cpu(out, x), run_cpu(model, x))


@pytest.mark.parametrize("fp16_ms", [0.98, 1.02])
def test_fp16_faster_only_within_the_noise_margin_keeps_float32(fp16_ms: float) -> None:
    out, report = fp16(crnn(), cost_table=table({"fp32": 1.0, "fp16": fp16_ms}))
    assert the_decision(report).chosen == "fp32" and weight_type(out, "W") == "FLOAT"


def test_no_entry_converts_as_asked() -> None:
    # An empty table, a table whose entry is for another class, and one for another op.
    other = {**LSTM_B1, "direction": ["forward"]}
    for cost in (CostTable(), table(FP16_SLOWER, match=other), table(FP16_SLOWER, op="GRU")):
        out, report = fp16(crnn(), cost_table=cost)
        decision = the_decision(report)
        assert (decision.chosen, decision.basis) == ("fp16", "no_entry") and "no measured entry" in decision.reason
        assert "fp16 as asked" in decision.reason and weight_type(out, "W") == "FLOAT16"


def test_a_dynamic_batch_converts_only_if_fp16_wins_at_b1_and_bn() -> None:
    dynamic = crnn(batch="batch")
    batch_n = {**LSTM_B1, "batch": ["bN"]}
    loses_at_1 = table(FP16_SLOWER, extra=(Entry(CUDA, "recurrent_precision", "LSTM", "f32", batch_n, FP16_FASTER, source="test"),))
    out, report = fp16(dynamic, cost_table=loses_at_1)
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp32", "table") and weight_type(out, "W") == "FLOAT"
    # An entry for batch N only: batch 1 predicts nothing, converted as asked.
    out, report = fp16(dynamic, cost_table=table(FP16_FASTER, match=batch_n))
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp16", "no_entry")
    wins_at_both = table(FP16_FASTER, extra=(Entry(CUDA, "recurrent_precision", "LSTM", "f32", batch_n, FP16_FASTER, source="test"),))
    out, report = fp16(dynamic, cost_table=wins_at_both)
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp16", "table") and weight_type(out, "W") == "FLOAT16"
    x = rand(3, 3, 4, T)
    close(run_cpu(out, x), run_cpu(dynamic, x))


def test_the_classes_of_symbolic_dimensions() -> None:
    # A symbolic sequence and batch: four worlds; fixed ones: one. Layout 1 (batch first) is read too.
    worlds = recurrent_worlds([("LSTM", "f32", 48, "bidirectional", "seq", "batch"), ("GRU", "f32", 300, "reverse", 100, 1)])
    assert [[c.key() for c in w] for w in worlds] == [
        ["LSTM f32 h1-96 bidirectional s1-50 b1", "GRU f32 h193-384 forward s51+ b1"],
        ["LSTM f32 h1-96 bidirectional s51+ b1", "GRU f32 h193-384 forward s51+ b1"],
        ["LSTM f32 h1-96 bidirectional s1-50 bN", "GRU f32 h193-384 forward s51+ b1"],
        ["LSTM f32 h1-96 bidirectional s51+ bN", "GRU f32 h193-384 forward s51+ b1"],
    ]
    assert len(recurrent_worlds([("RNN", "f32", 512, "forward", 25, 32)])) == 1


def test_an_explicit_choice_is_taken_as_it_is() -> None:
    out, report = fp16(crnn(), cost_table=table(FP16_SLOWER), precision_recurrent="low")
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp16", "forced") and weight_type(out, "W") == "FLOAT16"
    out, report = fp16(crnn(), precision_recurrent="fp32")
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp32", "forced") and weight_type(out, "W") == "FLOAT"
    with pytest.raises(ValueError, match="precision_recurrent"):
        fp16(crnn(), precision_recurrent="maybe")


def test_nothing_to_decide_when_kept_anyway_or_on_a_target_without_a_provider() -> None:
    _, report = fp16(crnn(), cost_table=table(FP16_SLOWER), keep_fp32=["LSTM"])
    assert not [d for d in report.decisions if d.kind == "recurrent_precision"]
    out, report = optimize_with(crnn(), None, target="onnx", precision="fp16", cost_table=table(FP16_SLOWER))
    assert not [d for d in report.decisions if d.kind == "recurrent_precision"] and weight_type(out, "W") == "FLOAT16"


class RecurrentTimer:
    """Fake timings: a model whose recurrent op runs in fp16 takes `fp16` ms, else `fp32` ms."""

    def __init__(self, fp16: float, fp32: float) -> None:
        self.fp16, self.fp32, self.calls = fp16, fp32, 0

    def __call__(self, model: bytes, feeds, provider: str) -> float:
        self.calls += 1
        assert provider == CUDA
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, dict(feeds))  # the candidate must run
        proto = onnx.ModelProto()
        proto.ParseFromString(model)
        return self.fp16 if weight_type(proto, "W") == "FLOAT16" else self.fp32


@pytest.mark.parametrize("fp16_ms, chosen", [(2.0, "fp32"), (0.5, "fp16")])
def test_tune_times_the_whole_model_both_ways(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fp16_ms: float, chosen: str) -> None:
    monkeypatch.setattr("graphopt.decisions.point.provider_present", lambda ep: True)  # as if the CUDA provider were here
    timer = RecurrentTimer(fp16=fp16_ms, fp32=1.0)
    model, x = crnn(), rand(1, 3, 4, T)
    # The convolutions forced (so only the recurrent decision is timed).
    out, report = fp16(model, tune=True, tune_timer=timer, tune_cache=str(tmp_path / "c.json"), cost_table=CostTable([]), precision_convs="fp32")
    decision = the_decision(report)
    assert timer.calls == 2 and decision.basis == "measured" and decision.chosen == chosen
    assert {a.candidate: a.measured_ms for a in decision.alternatives} == {"fp16": fp16_ms, "fp32": 1.0}
    assert weight_type(out, "W") == ("FLOAT" if chosen == "fp32" else "FLOAT16")
    if chosen == "fp32":
        assert "fp16 measured no faster here" in decision.reason and not [n for n in out.graph.node if n.op_type == "Cast"]
    close(run_cpu(out, x), run_cpu(model, x))
    again = RecurrentTimer(fp16=fp16_ms, fp32=1.0)
    _, report = fp16(model, tune=True, tune_timer=again, tune_cache=str(tmp_path / "c.json"), cost_table=CostTable([]), precision_convs="fp32")
    assert again.calls == 0 and the_decision(report).chosen == chosen


def test_the_command_line_forces_it_and_the_summary_lists_the_nodes(tmp_path: Path) -> None:
    from conftest import run_cli

    src = tmp_path / "crnn.onnx"
    onnx.save(crnn(), src)
    done = run_cli("optimize", src, "-o", tmp_path / "out.onnx", "--target", "ort-cuda", "--precision", "fp16",
                   "--precision-recurrent", "fp32", "--precision-convs", "low", "--layout", "nchw", "--report", tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    assert "kept in fp32 for speed (decision 'recurrent_precision'): " in done.stdout and "rnn" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert "rnn" in report["precision_conversion"]["kept_for_speed"]
    assert [(d["kind"], d["chosen"], d["basis"]) for d in report["decisions"] if d["kind"] == "recurrent_precision"] == [
        ("recurrent_precision", "fp32", "forced")]
    for bad in (["--precision-recurrent", "fp32"], ["--precision", "fp16", "--precision-recurrent", "half"]):
        done = run_cli("optimize", src, "-o", tmp_path / "bad.onnx", "--target", "ort-cuda", *bad)
        assert done.returncode == 2 and done.stderr.count("error:") == 1 and "--precision-recurrent" in done.stderr
