"""The bias_act decision (graphopt/passes/bias_act.py): on ort-cpu a MatMul's bias Add that
FuseBiasGelu moved into the activation (com.microsoft.BiasGelu / FastGelu with a bias) stays
there only where the cost table (or --tune) says so; otherwise the Add comes back before the
activation, so that onnxruntime folds it into a Gemm as it does for the original model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import (
    BIAS_ACT_WINS,
    TensorProto,
    assert_same_outputs,
    bias_act_table,
    helper,
    init,
    make_model,
    optimize_with,
    rand,
)

from graphopt.decisions import CostTable, Entry, default_table
from graphopt.decisions.shapes import bias_act_worlds

MS = "com.microsoft"
K, N = 16, 64


def _value(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def mlp_up(approximate: str = "none", rows=(2, 8), producer: str = "MatMul", extra_reader: bool = False) -> onnx.ModelProto:
    """x [rows.., K] @ W [K, N] + bias -> Gelu (opset 20) ; `producer` "Relu": no MatMul before the Add."""
    x_shape = [*rows, K if producer == "MatMul" else N]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])] if producer == "MatMul" else [helper.make_node("Relu", ["x"], ["h"])]
    nodes += [helper.make_node("Add", ["h", "bias"], ["hb"]), helper.make_node("Gelu", ["hb"], ["y"], approximate=approximate)]
    outputs = [_value("y", [*rows, N])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["h"], ["z"]))
        outputs.append(_value("z", [*rows, N]))
    inits = [init("bias", rand(N))] + ([init("w", rand(K, N))] if producer == "MatMul" else [])
    return make_model(nodes, [_value("x", x_shape)], outputs, inits, opset=20)


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


UNFUSED_WINS = bias_act_table(fused_ms=2.0, unfused_ms=1.0)


def test_unfused_predicted_faster_gives_back_the_add_before_gelu() -> None:
    model = mlp_up()
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=UNFUSED_WINS)
    assert report.rules["FuseBiasGelu"].applications == 1  # the rule fused; the decision split it back
    assert _ops(optimized) == [("", "MatMul"), ("", "Add"), (MS, "Gelu")]
    assert optimized.graph.node[-1].output[0] == "y" and [o.name for o in optimized.graph.output] == ["y"]
    [decision] = report.decisions
    assert (decision.kind, decision.chosen, decision.baseline, decision.basis) == ("bias_act", "unfused", "unfused", "table")
    assert {a.candidate: a.predicted_ms for a in decision.alternatives} == {"fused": 2.0, "unfused": 1.0}
    assert_same_outputs(model, optimized)


def test_fused_predicted_faster_keeps_bias_gelu() -> None:
    model = mlp_up()
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=BIAS_ACT_WINS)
    assert _ops(optimized) == [("", "MatMul"), (MS, "BiasGelu")]
    [decision] = report.decisions
    assert (decision.chosen, decision.basis) == ("fused", "table") and "predicted 0.5 ms against 1 ms" in decision.reason
    assert_same_outputs(model, optimized)
    # Faster, but inside the noise margin: no evidence, the unfused form stays.
    kept, _ = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=bias_act_table(0.99, 1.0))
    assert _ops(kept) == [("", "MatMul"), ("", "Add"), (MS, "Gelu")]


def test_the_tanh_form_splits_into_add_and_fast_gelu_without_bias() -> None:
    model = mlp_up("tanh")
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=UNFUSED_WINS)
    assert _ops(optimized) == [("", "MatMul"), ("", "Add"), (MS, "FastGelu")]
    assert len(optimized.graph.node[-1].input) == 1 and report.decisions[0].kind == "bias_act"
    assert_same_outputs(model, optimized, rtol=1e-3, atol=1e-4)
    kept, _ = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=BIAS_ACT_WINS)
    assert _ops(kept) == [("", "MatMul"), (MS, "FastGelu")] and len(kept.graph.node[-1].input) == 2


def test_no_entry_keeps_the_unfused_form_and_says_which_class() -> None:
    model = mlp_up()
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=CostTable([]))
    assert _ops(optimized) == [("", "MatMul"), ("", "Add"), (MS, "Gelu")]
    [decision] = report.decisions
    assert (decision.chosen, decision.basis) == ("unfused", "no_entry")
    assert "no measured entry for BiasGelu f32 r5-48 h1-128" in decision.reason
    # An entry for another N bucket predicts nothing for N = 64.
    other = CostTable([Entry("CPUExecutionProvider", "bias_act", "BiasGelu", "f32", {"n": ("h3073+",)},
                             {"fused": 0.1, "unfused": 1.0}, source="test")])
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=other)
    assert _ops(optimized)[-1] == (MS, "Gelu") and report.decisions[0].basis == "no_entry"


@pytest.mark.parametrize("case", ["not-after-matmul", "product-read-elsewhere"])
def test_without_a_gemm_to_fold_into_the_fused_op_stays_undecided(case: str) -> None:
    # onnxruntime would fuse the Add into the activation itself here: nothing to decide.
    model = mlp_up(producer="Relu") if case == "not-after-matmul" else mlp_up(extra_reader=True)
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=UNFUSED_WINS)
    assert (MS, "BiasGelu") in _ops(optimized) and not [d for d in report.decisions if d.kind == "bias_act"]
    assert_same_outputs(model, optimized)


def test_ort_cuda_decides_by_its_own_entries() -> None:
    # The shipped CUDA entries measure the fused form faster (H200): BiasGelu stays there.
    model = mlp_up()
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cuda")
    assert (MS, "BiasGelu") in _ops(optimized)
    [decision] = [d for d in report.decisions if d.kind == "bias_act"]
    assert (decision.chosen, decision.basis) == ("fused", "table") and "NVIDIA" in decision.alternatives[0].source
    # A table where Gemm + activation wins on CUDA splits it, as on the CPU.
    split, _ = optimize_with(model, ["FuseBiasGelu"], target="ort-cuda", cost_table=UNFUSED_WINS)
    assert _ops(split)[-2:] == [("", "Add"), (MS, "Gelu")]


def test_symbolic_rows_need_every_row_bucket() -> None:
    worlds = bias_act_worlds("BiasGelu", "f32", ["batch", 7, 64])
    assert worlds is not None and [w[0].key() for w in worlds][:2] == ["BiasGelu f32 r1-4 h1-128", "BiasGelu f32 r5-48 h1-128"]
    assert len(worlds) == 5 and bias_act_worlds("BiasGelu", "f32", [1, "n"]) is None
    # fused wins only at small row counts: with a symbolic batch it must win in every world, so it stays unfused
    small_only = CostTable([
        Entry("CPUExecutionProvider", "bias_act", "BiasGelu", "f32", {"rows": ("r1-4",)}, {"fused": 0.5, "unfused": 1.0}, source="test"),
        Entry("CPUExecutionProvider", "bias_act", "BiasGelu", "f32", {}, {"fused": 1.0, "unfused": 1.0}, source="test"),
    ])
    model = mlp_up(rows=("batch", 1))
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=small_only)
    assert _ops(optimized)[-1] == (MS, "Gelu") and report.decisions[0].basis == "table"
    fixed = mlp_up(rows=(1, 1))
    optimized, report = optimize_with(fixed, ["FuseBiasGelu"], target="ort-cpu", cost_table=small_only)
    assert _ops(optimized)[-1] == (MS, "BiasGelu")


def test_tune_measures_both_forms_on_the_cpu_provider(tmp_path: Path) -> None:
    import onnxruntime as ort

    timed: list[list[str]] = []

    def timer(model_bytes: bytes, feeds, ep: str) -> float:
        ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, dict(feeds))  # the candidate must run
        ops = [n.op_type for n in onnx.load_from_string(model_bytes).graph.node]
        timed.append(ops)
        assert set(feeds) == {"x"} and ep == "CPUExecutionProvider"
        return 1.0 if "BiasGelu" in ops else 2.0  # the fused form measured faster

    model = mlp_up(rows=("batch", 8))
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", tune=True, tune_timer=timer,
                                      tune_cache=str(tmp_path / "c.json"), cost_table=UNFUSED_WINS)
    assert sorted(timed) == [["MatMul", "Add", "Gelu"], ["MatMul", "BiasGelu"]]
    assert _ops(optimized)[-1] == (MS, "BiasGelu") and report.decisions[0].basis == "measured"
    assert_same_outputs(model, optimized, shapes={"x": (2, 8, K)})


def test_the_shipped_table_unfuses_convnext_sized_mlps_on_the_cpu() -> None:
    # ConvNeXt's first stage: [1, 32, 32, 16] @ [16, 64]: measured faster as Gemm + Gelu.
    model = mlp_up(rows=(1, 32, 32))
    model.graph.input[0].CopyFrom(_value("x", [1, 32, 32, K]))
    assert default_table().lookup("CPUExecutionProvider", "bias_act", bias_act_worlds("BiasGelu", "f32", [1, 32, 32, N])[0][0]) is not None
    optimized, report = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu")
    assert _ops(optimized)[-1] == (MS, "Gelu") and report.decisions[0].basis == "table"
    assert_same_outputs(model, optimized)


def test_outputs_equal_with_real_onnxruntime_gemm_fold(tmp_path: Path) -> None:
    # What onnxruntime runs from the unfused form: the Add is folded into a Gemm.
    import onnxruntime as ort

    model = mlp_up(rows=(1, 8))
    optimized, _ = optimize_with(model, ["FuseBiasGelu"], target="ort-cpu", cost_table=UNFUSED_WINS)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    options.log_severity_level = 4
    ort.InferenceSession(optimized.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ran = [n.op_type for n in onnx.load(str(tmp_path / "ort.onnx")).graph.node]
    assert "Gemm" in ran and "BiasGelu" not in ran and "MatMul" not in ran
    x = np.random.default_rng(0).standard_normal((1, 8, K)).astype(np.float32)
    assert_same_outputs(model, optimized, feeds={"x": x})
