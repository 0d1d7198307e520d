"""The convolutions' precision decision (graphopt/passes/precision_decision.py): with
`--precision fp16` on ort-cuda, the model's convolutions stay float32 (the original's form)
unless the cost table predicts (or --tune measures) fp16 faster, in every batch size the model
allows; with no entry they convert as asked; a transformer part converts either way.

Issue 14: 17 of 51 zoo models (small batch-1 CNNs) ran slower in fp16 than their float32
original on an H100. The tables here are fakes; the shipped table has no `precision` entry
yet (benchmarks/decisions_bench.py --decisions precision measures them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from rule_testing import TensorProto, helper, init, make_model, optimize_with, rand

from graphopt.decisions import CostTable, Entry

CUDA = "CUDAExecutionProvider"
SMALL_B1 = {"kind": ["dense"], "kernel": ["k3"], "channels": ["c1-32"], "batch": ["b1"]}


def precision_table(times: dict[str, float], match: dict | None = None, extra: tuple[Entry, ...] = ()) -> CostTable:
    return CostTable([Entry(CUDA, "precision", "Conv", "f32", match or SMALL_B1, times, per=1, source="test"), *extra])


FP16_SLOWER = {"fp32": 1.0, "fp32-nhwc": 1.0, "fp16": 1.5, "fp16-nhwc": 1.5}
FP16_FASTER = {"fp32": 1.0, "fp32-nhwc": 1.0, "fp16": 0.5, "fp16-nhwc": 0.5}


def cnn() -> onnx.ModelProto:
    """A small ResNet-like CNN at batch 1: the input normalized (Sub, Mul), two 3x3 convolutions,
    a residual Add, pooling, a Gemm head."""
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["xc"], name="center"),
        helper.make_node("Mul", ["xc", "scale"], ["xn"], name="normalize"),
        helper.make_node("Conv", ["xn", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Add", ["c1", "r0"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wh", "bh"], ["y"], transB=1, name="head"),
    ]
    inits = [init("w0", rand(16, 3, 3, 3) * 0.3), init("b0", rand(16) * 0.1), init("w1", rand(16, 16, 3, 3) * 0.1),
             init("b1", rand(16) * 0.1), init("wh", rand(10, 16) * 0.3), init("bh", rand(10) * 0.1),
             init("mean", rand(1, 3, 1, 1) * 0.1), init("scale", rand(1, 3, 1, 1, positive=True))]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def hybrid() -> onnx.ModelProto:
    """A CNN stem, then a transformer-style part on the sequence of its 64 positions
    (Reshape, Transpose, LayerNormalization, MatMul + bias, Relu, MatMul)."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Reshape", ["r1", "shape"], ["seq"], name="to_sequence"),
        helper.make_node("Transpose", ["seq"], ["tokens"], perm=[0, 2, 1], name="tokens"),
        helper.make_node("LayerNormalization", ["tokens", "gamma", "beta"], ["n"], axis=-1, name="norm"),
        helper.make_node("MatMul", ["n", "wq"], ["q"], name="proj"),
        helper.make_node("Add", ["q", "bq"], ["qb"], name="proj_bias"),
        helper.make_node("Relu", ["qb"], ["h"], name="act"),
        helper.make_node("MatMul", ["h", "wo"], ["y"], name="out"),
    ]
    inits = [init("w0", rand(16, 3, 3, 3) * 0.3), init("b0", rand(16) * 0.1), init("w1", rand(16, 16, 3, 3) * 0.1),
             init("b1", rand(16) * 0.1), init("shape", np.array([1, 16, 64], np.int64)), init("gamma", rand(16, positive=True)),
             init("beta", rand(16) * 0.1), init("wq", rand(16, 16) * 0.3), init("bq", rand(16) * 0.1), init("wo", rand(16, 8) * 0.3)]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def fp16(model: onnx.ModelProto, **kwargs):
    kwargs.setdefault("layout", "nchw")
    return optimize_with(model, None, target="ort-cuda", precision="fp16", **kwargs)


def weight_types(model: onnx.ModelProto, op: str) -> list[str]:
    """The element type of the weights (input 1) of every `op` node."""
    inits = {t.name: t for t in model.graph.initializer}
    return [TensorProto.DataType.Name(inits[n.input[1]].data_type) for n in model.graph.node if n.op_type == op]


def run_cpu(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def the_decision(report):
    [decision] = [d for d in report.decisions if d.kind == "precision"]
    return decision


def test_table_says_fp16_slower_at_batch_1_convolutions_stay_float32() -> None:
    model, x = cnn(), rand(1, 3, 16, 16)
    out, report = fp16(model, cost_table=precision_table(FP16_SLOWER))
    decision = the_decision(report)
    assert (decision.chosen, decision.baseline, decision.basis) == ("fp32", "fp32", "table")
    assert "kept in float32: fp16 predicted no faster here" in decision.reason
    assert {a.candidate: a.predicted_ms for a in decision.alternatives} == pytest.approx({"fp16": 3.0, "fp32": 2.0})  # 2 convolutions
    # A pure CNN stays wholly float32, head included: no Cast, every weight float32.
    assert weight_types(out, "Conv") == ["FLOAT", "FLOAT"] and weight_types(out, "Gemm") == ["FLOAT"]
    assert not [n for n in out.graph.node if n.op_type == "Cast"]
    conversion = report.precision_conversion
    # The input's normalization stays with the convolutions it feeds (no Cast pair on the way in).
    assert {"center", "normalize", "conv0", "conv1", "residual", "head"} <= set(conversion.kept_for_speed)
    assert conversion.kept["speed_decision"] == len(conversion.kept_for_speed) and conversion.nodes_converted == 0
    from graphopt.report.html import render_html

    page = render_html(report, drawings=False)
    assert "kept in fp32 for speed (decision precision): " in page and "fp16 predicted no faster here" in page
    np.testing.assert_allclose(run_cpu(out, x), run_cpu(model, x), rtol=1e-5, atol=1e-5)


def test_table_says_fp16_faster_convolutions_convert() -> None:
    model, x = cnn(), rand(1, 3, 16, 16)
    out, report = fp16(model, cost_table=precision_table(FP16_FASTER))
    decision = the_decision(report)
    assert (decision.chosen, decision.basis) == ("fp16", "table") and "against 2 ms for fp32" in decision.reason
    assert weight_types(out, "Conv") == ["FLOAT16", "FLOAT16"]
    assert not report.precision_conversion.kept_for_speed and "speed_decision" not in report.precision_conversion.kept
    want = run_cpu(model, x)
    np.testing.assert_allclose(run_cpu(out, x), want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))


@pytest.mark.parametrize("fp16_ms", [0.98, 1.02])
def test_fp16_faster_only_within_the_noise_margin_keeps_float32(fp16_ms: float) -> None:
    out, report = fp16(cnn(), cost_table=precision_table({"fp32": 1.0, "fp16": fp16_ms}))
    assert the_decision(report).chosen == "fp32" and weight_types(out, "Conv") == ["FLOAT", "FLOAT"]


def test_a_dynamic_batch_converts_only_if_fp16_wins_at_every_batch_size() -> None:
    # fp16 wins at batch 32 but loses at batch 1 (EfficientNet's depthwise convolutions on an
    # H100): a dynamic-batch CNN stays float32, so it is never slower than its original.
    dynamic = cnn()
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    batch_n = {**SMALL_B1, "batch": ["bN"]}
    loses_at_1 = precision_table(FP16_SLOWER, extra=(Entry(CUDA, "precision", "Conv", "f32", batch_n, FP16_FASTER, per=1, source="test"),))
    out, report = fp16(dynamic, cost_table=loses_at_1)
    decision = the_decision(report)
    assert (decision.chosen, decision.basis) == ("fp32", "table") and weight_types(out, "Conv") == ["FLOAT", "FLOAT"]
    # With an entry for batch 32 only, batch 1 predicts nothing: converted as asked.
    out, report = fp16(dynamic, cost_table=precision_table(FP16_FASTER, match=batch_n))
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp16", "no_entry")
    both = precision_table(FP16_FASTER, extra=(Entry(CUDA, "precision", "Conv", "f32", batch_n, FP16_FASTER, per=1, source="test"),))
    out, report = fp16(dynamic, cost_table=both)
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp16", "table")
    assert weight_types(out, "Conv") == ["FLOAT16", "FLOAT16"]


def test_no_entry_converts_as_asked() -> None:
    # An empty table, and a table whose entry is for another class.
    other = {**SMALL_B1, "batch": ["bN"]}
    for table in (CostTable(), precision_table(FP16_SLOWER, match=other)):
        out, report = fp16(cnn(), cost_table=table)
        decision = the_decision(report)
        assert (decision.chosen, decision.basis) == ("fp16", "no_entry") and "no measured entry" in decision.reason
        assert weight_types(out, "Conv") == ["FLOAT16", "FLOAT16"]


@pytest.mark.parametrize("times", [FP16_SLOWER, FP16_FASTER], ids=["fp16-slower", "fp16-faster"])
def test_a_transformer_part_converts_whatever_the_convolutions_do(times: dict[str, float]) -> None:
    model, x = hybrid(), rand(1, 3, 8, 8)
    out, report = fp16(model, cost_table=precision_table(times))
    slower = times is FP16_SLOWER
    assert the_decision(report).chosen == ("fp32" if slower else "fp16")
    assert weight_types(out, "Conv") == ["FLOAT" if slower else "FLOAT16"] * 2
    assert weight_types(out, "MatMul") == ["FLOAT16", "FLOAT16"]  # fp16 pays there
    kept = set(report.precision_conversion.kept_for_speed)
    if slower:
        # The region ends at the sequence ops: the layout ops after the convolutions stay with them.
        assert {"conv0", "relu1", "to_sequence", "tokens"} <= kept and not kept & {"norm", "proj", "proj_bias", "act", "out"}
    else:
        assert not kept
    want = run_cpu(model, x)
    np.testing.assert_allclose(run_cpu(out, x), want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))


def test_each_candidate_is_read_in_the_layout_it_will_get() -> None:
    # fp16 NCHW loses to fp32 here, but the layout decision puts the fp16 model in NHWC, where it wins.
    from test_layout_nhwc import dense_block

    layout_f16 = Entry(CUDA, "layout", "Conv", "f16", SMALL_B1, {"nchw": 1.0, "nhwc-add": 0.5}, source="test")
    times = {"fp32": 1.0, "fp16": 1.5, "fp16-nhwc": 0.6}
    model = dense_block(channels=16, batch=1)
    out, report = optimize_with(model, None, target="ort-cuda", precision="fp16", cost_table=precision_table(times, extra=(layout_f16,)))
    decision = the_decision(report)
    assert decision.chosen == "fp16" and "fp16 NHWC" in decision.reason and "fp32 NCHW" in decision.reason
    assert {a.candidate: a.predicted_ms for a in decision.alternatives} == pytest.approx({"fp16": 3.6, "fp32": 6.0})
    assert report.layout.mode == "nhwc"
    # The same figures in NCHW (no layout entry): fp32 wins, and the model stays NCHW float32.
    out, report = optimize_with(model, None, target="ort-cuda", precision="fp16", cost_table=precision_table(times))
    assert the_decision(report).chosen == "fp32" and report.layout.mode == "nchw"
    assert set(weight_types(out, "Conv")) == {"FLOAT"}


def test_an_explicit_choice_is_taken_as_it_is() -> None:
    out, report = fp16(cnn(), cost_table=precision_table(FP16_SLOWER), precision_convs="low")
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp16", "forced")
    assert weight_types(out, "Conv") == ["FLOAT16", "FLOAT16"]
    out, report = fp16(cnn(), precision_convs="fp32")
    assert (the_decision(report).chosen, the_decision(report).basis) == ("fp32", "forced")
    assert weight_types(out, "Conv") == ["FLOAT", "FLOAT"]
    with pytest.raises(ValueError, match="precision_convs"):
        fp16(cnn(), precision_convs="maybe")


def test_nothing_to_decide_without_convolutions_or_on_a_target_without_a_provider() -> None:
    _, report = fp16(hybrid(), cost_table=precision_table(FP16_SLOWER), keep_fp32=["Conv"])
    assert not [d for d in report.decisions if d.kind == "precision"]
    out, report = optimize_with(cnn(), None, target="onnx", precision="fp16", cost_table=precision_table(FP16_SLOWER))
    assert not [d for d in report.decisions if d.kind == "precision"] and weight_types(out, "Conv") == ["FLOAT16", "FLOAT16"]


class ConvTimer:
    """Fake timings: a model whose convolutions run in fp16 takes `fp16` ms, else `fp32` ms."""

    def __init__(self, fp16: float, fp32: float) -> None:
        self.fp16, self.fp32, self.calls = fp16, fp32, 0

    def __call__(self, model: bytes, feeds, provider: str) -> float:
        self.calls += 1
        assert provider == CUDA
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, dict(feeds))  # the candidate must run
        proto = onnx.ModelProto()
        proto.ParseFromString(model)
        return self.fp16 if "FLOAT16" in weight_types(proto, "Conv") else self.fp32


@pytest.mark.parametrize("fp16_ms, chosen", [(2.0, "fp32"), (0.5, "fp16"), (0.99, "fp32")])
def test_tune_times_the_whole_model_both_ways(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fp16_ms: float, chosen: str) -> None:
    monkeypatch.setattr("graphopt.decisions.point.provider_present", lambda ep: True)  # as if the CUDA provider were here
    timer = ConvTimer(fp16=fp16_ms, fp32=1.0)
    model, x = cnn(), rand(1, 3, 16, 16)
    out, report = fp16(model, tune=True, tune_timer=timer, tune_cache=str(tmp_path / "c.json"), cost_table=CostTable([]))
    decision = the_decision(report)
    assert timer.calls == 2 and decision.basis == "measured" and decision.chosen == chosen
    assert {a.candidate: a.measured_ms for a in decision.alternatives} == {"fp16": fp16_ms, "fp32": 1.0}
    assert weight_types(out, "Conv") == (["FLOAT", "FLOAT"] if chosen == "fp32" else ["FLOAT16", "FLOAT16"])
    if chosen == "fp32":
        assert "fp16 measured no faster here" in decision.reason and report.precision_conversion.kept_for_speed
    want = run_cpu(model, x)
    np.testing.assert_allclose(run_cpu(out, x), want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))
    # Again: from the cache, nothing timed.
    again = ConvTimer(fp16=fp16_ms, fp32=1.0)
    _, report = fp16(model, tune=True, tune_timer=again, tune_cache=str(tmp_path / "c.json"), cost_table=CostTable([]))
    assert again.calls == 0 and the_decision(report).chosen == chosen


def test_the_command_line_forces_it_and_the_summary_lists_the_nodes(tmp_path: Path) -> None:
    from conftest import run_cli

    src = tmp_path / "cnn.onnx"
    onnx.save(cnn(), src)
    done = run_cli("optimize", src, "-o", tmp_path / "out.onnx", "--target", "ort-cuda", "--precision", "fp16",
                   "--precision-convs", "fp32", "--layout", "nchw", "--report", tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    assert "kept in fp32 for speed (decision 'precision'): " in done.stdout and "conv0" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert "conv1" in report["precision_conversion"]["kept_for_speed"]
    assert [(d["kind"], d["chosen"], d["basis"]) for d in report["decisions"] if d["kind"] == "precision"] == [("precision", "fp32", "forced")]
    # Bad input: one error line, exit 2.
    for bad in (["--precision-convs", "fp32"], ["--precision", "fp16", "--precision-convs", "half"]):
        done = run_cli("optimize", src, "-o", tmp_path / "bad.onnx", "--target", "ort-cuda", *bad)
        assert done.returncode == 2 and done.stderr.count("error:") == 1 and "--precision-convs" in done.stderr


def test_fused_activations_stay_float32_with_the_convolutions() -> None:
    # x * Sigmoid(x) after each convolution becomes graphopt's QuickGelu before the precision step:
    # a fused op, but an elementwise one, so it stays with the float32 convolutions and no Casts
    # appear between them (tf-efficientnet came out with 82 Casts when it did not).
    model = cnn()
    graph = model.graph
    for relu in [n for n in graph.node if n.op_type == "Relu"]:
        src, dst = relu.input[0], relu.output[0]
        index = list(graph.node).index(relu)
        graph.node.remove(relu)
        graph.node.insert(index, helper.make_node("Mul", [src, src + "_sig"], [dst], name=relu.name + "_mul"))
        graph.node.insert(index, helper.make_node("Sigmoid", [src], [src + "_sig"], name=relu.name + "_sigmoid"))
    out, report = fp16(model, cost_table=precision_table(FP16_SLOWER))
    assert the_decision(report).chosen == "fp32"
    assert [n.op_type for n in out.graph.node].count("QuickGelu") == 2
    assert "Cast" not in [n.op_type for n in out.graph.node]
    assert weight_types(out, "Conv") == ["FLOAT", "FLOAT"]
    x = rand(1, 3, 16, 16)
    np.testing.assert_allclose(run_cpu(out, x), run_cpu(model, x), rtol=1e-5, atol=1e-5)
