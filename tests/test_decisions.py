"""The decision point (graphopt/decisions): cost-table predictions, --tune timing and its cache.

The shipped table (graphopt/decisions/cost_table.json) holds only what was measured on
the H200; these tests use it where they check the default, and their own small tables
where they check the rules of choosing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from rule_testing import TensorProto, helper, init, make_model, optimize_with, rand

from graphopt.decisions import CostTable, DecisionPoint, Entry, OpClass, TuneCache, default_table
from graphopt.decisions.table import DEFAULT_TABLE_PATH

sys.path.insert(0, str(Path(__file__).parent))
from test_layout_nhwc import RESNET_TABLE, dense_block  # noqa: E402

DENSE = {"kind": ["dense"], "kernel": ["k3"], "channels": ["c33-96"], "batch": ["bN"]}


def table(decision: str, dtype: str, times: dict[str, float], ep: str = "CUDAExecutionProvider", match: dict | None = None) -> CostTable:
    return CostTable([Entry(ep, decision, "Conv", dtype, match or DENSE, times, per=1, source="test")])


def test_the_shipped_table_loads_and_says_where_every_figure_comes_from() -> None:
    shipped = default_table()
    assert shipped.entries
    for entry in shipped.entries:
        assert entry.source and entry.device and entry.times_ms
        assert set(entry.times_ms) <= {"nchw", "nhwc-add", "nhwc-kernel", "FusedConv", "Conv+activation"}
    assert json.loads(DEFAULT_TABLE_PATH.read_text())["format"] == "graphopt.cost_table/1"
    # The ResNet-50 figures stand for what ResNet-50 has: dense convolutions, not depthwise ones.
    depthwise = OpClass("Conv", "f16", (("kind", "depthwise"), ("kernel", "k3"), ("channels", "c97-384"), ("batch", "bN")))
    dense = OpClass("Conv", "f16", (("kind", "dense"), ("kernel", "k3"), ("channels", "c97-384"), ("batch", "bN")))
    assert RESNET_TABLE.lookup("CUDAExecutionProvider", "layout", depthwise) is None
    assert RESNET_TABLE.lookup("CUDAExecutionProvider", "layout", dense) is not None


def test_a_change_the_table_predicts_to_lose_is_not_applied() -> None:
    # NHWC predicted slower than NCHW for these convolutions: NCHW stays.
    losing = table("layout", "f32", {"nchw": 1.0, "nhwc-add": 1.2, "nhwc-kernel": 1.5})
    _, report = optimize_with(dense_block(), [], target="ort-cuda", cost_table=losing)
    assert report.layout.mode == "nchw" and report.layout.converted == {}
    [decision] = report.decisions
    assert decision.chosen == "nchw" and decision.basis == "table" and "predicted no faster" in decision.reason
    assert {a.candidate: a.predicted_ms for a in decision.alternatives} == pytest.approx({"nchw": 3.0, "nhwc-add": 3.6, "nhwc-kernel": 4.5})
    # Within the noise margin (2 % faster) is no evidence either.
    _, report = optimize_with(dense_block(), [], target="ort-cuda", cost_table=table("layout", "f32", {"nchw": 1.0, "nhwc-add": 0.98}))
    assert report.layout.mode == "nchw"
    # And the same table with NHWC faster does convert: the test above can fail.
    _, report = optimize_with(dense_block(), [], target="ort-cuda", cost_table=table("layout", "f32", {"nchw": 1.0, "nhwc-add": 0.8}))
    assert report.layout.mode == "nhwc" and report.decisions[0].chosen == "nhwc-add"


def test_every_batch_size_a_symbolic_batch_allows_must_win() -> None:
    model = dense_block()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    # Measured at batch 32 only (the ResNet-50 entries): batch 1 is unknown, so NCHW stays.
    _, report = optimize_with(model, [], target="ort-cuda", cost_table=RESNET_TABLE)
    assert report.layout.mode == "nchw" and "b1" in report.decisions[0].reason
    both = CostTable([
        Entry("CUDAExecutionProvider", "layout", "Conv", "f32", {**DENSE, "batch": ["b1"]}, {"nchw": 1.0, "nhwc-add": 0.5}),
        Entry("CUDAExecutionProvider", "layout", "Conv", "f32", DENSE, {"nchw": 1.0, "nhwc-add": 0.5}),
    ])
    _, report = optimize_with(model, [], target="ort-cuda", cost_table=both)
    assert report.layout.mode == "nhwc"


def depthwise_model(channels: int = 128, dtype=np.float16) -> onnx.ModelProto:
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits, nodes = [], []
    for i, src in enumerate(["x", "r0", "r1", "r2"]):
        group = channels if i % 2 else 1
        inits += [init(f"w{i}", (rand(channels, channels // group, 3, 3) * 0.1).astype(dtype)), init(f"b{i}", rand(channels).astype(dtype))]
        nodes += [helper.make_node("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1], group=group),
                  helper.make_node("HardSwish", [f"c{i}"], [f"r{i}"])]
    nodes.append(helper.make_node("Identity", ["r3"], ["y"]))
    return make_model(nodes, [helper.make_tensor_value_info("x", elem, [32, channels, 8, 8])], [helper.make_tensor_value_info("y", elem, None)], inits)


def test_a_mobilenet_style_model_stays_nchw_though_resnet_style_convs_win() -> None:
    # Issue 14: NHWC + bias Adds cost 6-21 % on MobileNetV3-style models while they paid on
    # ResNet-50. The dense convolutions here are of a class measured to win; the depthwise
    # ones were never measured, so the model stays as it is.
    _, report = optimize_with(depthwise_model(), [], target="ort-cuda", cost_table=RESNET_TABLE)
    assert report.layout.mode == "nchw"
    [decision] = report.decisions
    assert decision.basis == "no_entry" and "depthwise" in decision.reason


def conv_relu_model(channels: int = 8) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [init("w", rand(channels, 3, 3, 3)), init("b", rand(channels))],
    )


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


class FakeTimer:
    """Deterministic 'measurements': a model with a FusedConv node takes `fused` ms, others `split` ms."""

    def __init__(self, fused: float, split: float) -> None:
        self.fused, self.split, self.calls = fused, split, 0

    def __call__(self, model: bytes, feeds, provider: str) -> float:
        self.calls += 1
        proto = onnx.ModelProto()
        proto.ParseFromString(model)
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, dict(feeds))  # the candidate must run
        return self.fused if any(n.op_type == "FusedConv" for n in proto.graph.node) else self.split


def test_tune_keeps_the_measured_faster_candidate_and_caches_it(tmp_path: Path) -> None:
    model = conv_relu_model()
    x = rand(1, 3, 16, 16)
    default, report = optimize_with(model, None, target="ort-cpu", cost_table=RESNET_TABLE)
    assert [n.op_type for n in default.graph.node] == ["FusedConv"]
    assert [(d.kind, d.chosen, d.basis) for d in report.decisions] == [("fused_conv", "FusedConv", "no_entry")]
    cache = tmp_path / "tune.json"
    slow_fused = FakeTimer(fused=2.0, split=1.0)
    tuned, report = optimize_with(model, None, target="ort-cpu", tune=True, tune_timer=slow_fused, tune_cache=str(cache))
    assert [n.op_type for n in tuned.graph.node] == ["Conv", "Relu"] and slow_fused.calls == 2
    [decision] = report.decisions
    assert decision.basis == "measured" and decision.chosen == "Conv+activation"
    assert {a.candidate: a.measured_ms for a in decision.alternatives} == {"FusedConv": 2.0, "Conv+activation": 1.0}
    np.testing.assert_allclose(_run(tuned, x), _run(model, x), rtol=1e-5, atol=1e-5)
    # Second run: everything comes from the cache, nothing is timed.
    fresh = FakeTimer(fused=0.1, split=9.0)
    again, report = optimize_with(model, None, target="ort-cpu", tune=True, tune_timer=fresh, tune_cache=str(cache))
    assert fresh.calls == 0 and [n.op_type for n in again.graph.node] == ["Conv", "Relu"]
    assert "from the cache" in report.decisions[0].reason
    # A faster FusedConv (another cache) keeps it.
    fast_fused = FakeTimer(fused=1.0, split=2.0)
    kept, _ = optimize_with(model, None, target="ort-cpu", tune=True, tune_timer=fast_fused, tune_cache=str(tmp_path / "other.json"))
    assert [n.op_type for n in kept.graph.node] == ["FusedConv"]


def test_tune_without_the_target_provider_says_so_and_uses_the_table(tmp_path: Path) -> None:
    assert "CUDAExecutionProvider" not in ort.get_available_providers()
    timer = FakeTimer(1.0, 1.0)
    _, report = optimize_with(
        dense_block(), [], target="ort-cuda", tune=True, tune_timer=timer, tune_cache=str(tmp_path / "c.json"), cost_table=RESNET_TABLE
    )
    assert timer.calls == 0 and report.decisions[0].basis == "table"
    assert "CUDAExecutionProvider is not available here" in report.decisions[0].reason


def test_the_table_can_split_a_fused_conv_it_predicts_to_lose() -> None:
    small = {"kind": ["dense"], "kernel": ["k3"], "channels": ["c1-32"], "batch": ["b1"]}
    losing = table("fused_conv", "f32", {"FusedConv": 1.0, "Conv+activation": 0.5}, ep="CPUExecutionProvider", match=small)
    split, report = optimize_with(conv_relu_model(), None, target="ort-cpu", cost_table=losing)
    assert [n.op_type for n in split.graph.node] == ["Conv", "Relu"] and report.decisions[0].basis == "table"


def test_cache_survives_a_damaged_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.json"
    path.write_text("{not json")
    cache = TuneCache(path)
    assert cache.get("k") is None
    cache.put("k", 1.5)
    assert TuneCache(path).get("k") == 1.5


def test_forced_choice_is_recorded_as_forced() -> None:
    point = DecisionPoint("ort-cuda")
    record = point.choose("layout", "model", ["nchw", "nhwc-add"], "nchw", None, forced="nhwc-add")
    assert record.chosen == "nhwc-add" and record.basis == "forced" and point.records == [record]


def test_the_real_timer_times_a_model_on_the_cpu() -> None:
    from graphopt.decisions import OrtTimer

    model = conv_relu_model()
    ms = OrtTimer(warmup=1, runs=5, min_time_s=0.01)(model.SerializeToString(), {"x": rand(1, 3, 16, 16)}, "CPUExecutionProvider")
    assert 0 < ms < 1000
