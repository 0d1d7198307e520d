"""--precision fp16 for ort-cuda never leaves a node without a CUDA kernel in its type.

onnxruntime's CUDA provider hands a node it has no kernel for (in that op, opset and type)
to the CPU provider, with copies around it: on the zoo's hb-fpn-upsample (opset 11) the
float16 Clips ran on the CPU and made the fp16 model 2.1-2.8x slower than the fp32 one. The
CUDA provider's table (graphopt/ops/data/ort_cuda_kernels.json, onnxruntime-gpu's registry)
says Clip-11 is float only: such a node stays float32 between Casts and the report says why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from rule_testing import init, make_model, op_types, optimize_with, rand

import graphopt
from graphopt.ops.targets import get_target
from graphopt.passes.precision_plan import PrecisionPlan
from graphopt.report.render import report_to_json

sys.path.insert(0, str(Path(__file__).parent))
from test_precision import feeds_for, run, within_budget  # noqa: E402
from test_report import validate  # noqa: E402

F, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
TABLE = Path(graphopt.__file__).parent / "ops" / "data" / "ort_cuda_kernels.json"
NO_F16_CLIP = "CUDA provider has no float16 kernel for Clip at opset 11"


def conv_relu6_conv(opset: int) -> onnx.ModelProto:
    """Conv -> Clip(min 0, max 6 as inputs) -> Conv: MobileNet's relu6 as opset-11 exporters write it."""
    return make_model(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
            helper.make_node("Clip", ["c1", "lo", "hi"], ["r"], name="relu6"),
            helper.make_node("Conv", ["r", "w2", "b2"], ["y"], pads=[1, 1, 1, 1], name="conv2"),
        ],
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])],
        [
            init("w1", rand(4, 3, 3, 3)), init("b1", rand(4)), init("w2", rand(4, 4, 3, 3)), init("b2", rand(4)),
            init("lo", np.array(0.0, np.float32)), init("hi", np.array(6.0, np.float32)),
        ],
        opset=opset,
    )


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every value: inputs, outputs, initializers, and what shape inference finds."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    return types


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    # onnxruntime's CPU provider has no float16 Conv (x86): onnx's reference evaluator runs the fp16 model.
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def cuda_placement_problems(model: onnx.ModelProto) -> list[str]:
    """Standard-domain nodes reading float16 that the CUDA provider's table has no float16 kernel for."""
    target, opset = get_target("ort-cuda"), next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    types = elem_types(model)
    problems = []
    for node in model.graph.node:
        first = next((name for name in node.input if name), None)
        if node.domain in ("", "ai.onnx") and first is not None and types.get(first) == F16:
            why = target.why_not("", node.op_type, "f16", opset)
            if why is not None:
                problems.append(f"{node.name or node.op_type}: {why}")
    return problems


# ------------------------------------------------------------------ the golden case and its negative


def test_opset11_clip_stays_fp32_between_fp16_convs() -> None:
    original = conv_relu6_conv(11)
    optimized, report = graphopt.optimize(original, target="ort-cuda", precision="fp16", precision_convs="low")
    nodes = {n.name: n for n in optimized.graph.node}
    types = elem_types(optimized)
    clip = nodes["relu6"]
    assert (types[clip.input[0]], types[clip.output[0]]) == (F, F)
    assert types["lo"] == types["hi"] == F
    # Casts surround it: fp16 -> fp32 before, fp32 -> fp16 after, each once.
    producers = {o: n for n in optimized.graph.node for o in n.output}
    before = producers[clip.input[0]]
    assert before.op_type == "Cast" and types[before.input[0]] == F16
    readers = [n for n in optimized.graph.node if clip.output[0] in n.input]
    assert [n.op_type for n in readers] == ["Cast"] and types[readers[0].output[0]] == F16
    convs = [n for n in optimized.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2 and all(types[c.input[0]] == types[c.input[1]] == types[c.output[0]] == F16 for c in convs)
    # The report lists the Clip, and why.
    conversion = report.precision_conversion
    assert conversion.kept == {"no_kernel": 1}
    [kept] = conversion.kept_for_kernel
    assert (kept.node, kept.op, kept.reason) == ("relu6", "Clip", "no_kernel") and NO_F16_CLIP in kept.detail
    assert cuda_placement_problems(optimized) == []
    validate(json.loads(report_to_json(report)))
    feeds = feeds_for(original)
    within_budget(run(original, feeds), run_reference(optimized, feeds), "fp16")


def test_opset13_clip_converts_to_fp16() -> None:
    """Clip-13 has a float16 CUDA kernel: converted like the convolutions, no Casts in between."""
    original = conv_relu6_conv(13)
    optimized, report = graphopt.optimize(original, target="ort-cuda", precision="fp16", precision_convs="low")
    types = elem_types(optimized)
    clip = next(n for n in optimized.graph.node if n.op_type == "Clip")
    assert (types[clip.input[0]], types[clip.output[0]]) == (F16, F16)
    assert [n.op_type for n in optimized.graph.node] == ["Cast", "Conv", "Clip", "Conv", "Cast"]
    assert report.precision_conversion.kept_for_kernel == [] and report.precision_conversion.nodes_kept == 0
    feeds = feeds_for(original)
    within_budget(run(original, feeds), run_reference(optimized, feeds), "fp16")


def test_the_placement_check_can_fail() -> None:
    """A float16 Clip at opset 11 (what the conversion made before it read the table) is caught."""
    half = make_model(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="relu6")],
        [helper.make_tensor_value_info("x", F16, [1, 4])],
        [helper.make_tensor_value_info("y", F16, [1, 4])],
        [init("lo", np.array(0.0, np.float16)), init("hi", np.array(6.0, np.float16))],
        opset=11,
    )
    assert [p for p in cuda_placement_problems(half) if NO_F16_CLIP in p] == [f"relu6: {get_target('ort-cuda').why_not('', 'Clip', 'f16', 11)}"]


def test_other_targets_do_not_read_the_cuda_table() -> None:
    """onnx converts the opset-11 Clip (the ONNX schema takes float16); ort-cpu decides by its own table."""
    optimized, report = graphopt.optimize(conv_relu6_conv(11), target="onnx", precision="fp16")
    clip = next(n for n in optimized.graph.node if n.op_type == "Clip")
    assert elem_types(optimized)[clip.input[0]] == F16 and report.precision_conversion.kept_for_kernel == []


def test_the_text_report_names_the_kept_node(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from graphopt.report.render import print_summary

    _, report = graphopt.optimize(conv_relu6_conv(11), target="ort-cuda", precision="fp16", precision_convs="low")
    print_summary(report, Console(width=300, no_color=True))
    out = capsys.readouterr().out
    assert "kept in fp32: relu6 (Clip):" in out and NO_F16_CLIP in out


# ------------------------------------------------------------------ the target's answers


def test_why_not_reads_the_opset_range_and_type() -> None:
    cuda = get_target("ort-cuda")
    assert NO_F16_CLIP in (cuda.why_not("", "Clip", "f16", 11) or "")
    assert "no float16 kernel for Clip at opset 10" in (cuda.why_not("", "Clip", "f16", 10) or "")
    assert cuda.why_not("", "Clip", "f16", 13) is None
    assert cuda.why_not("", "Clip", "f32", 11) is None
    assert "no bfloat16 kernel for Add at opset 11" in (cuda.why_not("", "Add", "bf16", 11) or "")
    assert cuda.why_not("", "Add", "bf16", 14) is None
    # Not about integer types: onnxruntime runs shape arithmetic where it likes.
    assert cuda.why_not("", "Clip", "i64", 11) is None and cuda.why_not("", "Shape", "i64", 11) is None
    # Ops the CUDA provider has in no type (Mish, Celu) are not blocked from conversion.
    assert cuda.why_not("", "Mish", "f16", 18) is None and cuda.why_not("", "Celu", "f16", 12) is None
    plan = PrecisionPlan.make("fp16")
    assert plan is not None and NO_F16_CLIP in (plan.cannot_run_low(cuda, "", "Clip", 11) or "")
    assert plan.cannot_run_low(cuda, "", "Clip", 13) is None


def test_missing_kernel_only_for_standard_ops_the_provider_lacks() -> None:
    cuda = get_target("ort-cuda")
    assert "CUDA provider has no Mish kernel at opset 18" in (cuda.missing_kernel("", "Mish", 18) or "")
    assert cuda.missing_kernel("", "Softplus", 18) is None and cuda.missing_kernel("", "HardSwish", 14) is None
    assert cuda.missing_kernel("com.microsoft", "FusedConv", 17) is None  # contrib ops: the contrib table decides
    for other in ("onnx", "ort-cpu"):
        assert get_target(other).missing_kernel("", "Mish", 18) is None  # ort-cpu's complete table refuses it in why_not


# ------------------------------------------------------------------ Mish


def mish_written_out(opset: int = 18) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Softplus", ["x"], ["sp"]), helper.make_node("Tanh", ["sp"], ["t"]), helper.make_node("Mul", ["x", "t"], ["y"])],
        [helper.make_tensor_value_info("x", F, [2, 8])],
        [helper.make_tensor_value_info("y", F, [2, 8])],
        opset=opset,
    )


def test_ort_cuda_does_not_emit_mish() -> None:
    """The CUDA provider has no Mish kernel (onnxruntime-gpu 1.31.1): a Mish would leave the GPU."""
    optimized, report = optimize_with(mish_written_out(), ["FuseMish"], target="ort-cuda")
    assert op_types(optimized) == ["Softplus", "Tanh", "Mul"]
    assert report.rules["FuseMish"].applications == 0
    assert any("no Mish kernel at opset 18" in m.reason for m in report.rules["FuseMish"].near_misses)
    fused, report = optimize_with(mish_written_out(), ["FuseMish"], target="onnx")
    assert op_types(fused) == ["Mish"] and report.rules["FuseMish"].applications == 1


def test_a_models_own_mish_is_left_to_convert() -> None:
    """Only a new Mish is refused: one the model has stays, and converts to float16 (onnxruntime expands it)."""
    model = make_model([helper.make_node("Mish", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2, 8])],
                       [helper.make_tensor_value_info("y", F, [2, 8])], opset=18)
    optimized, report = graphopt.optimize(ir.serde.deserialize_model(model), target="ort-cuda", precision="fp16", precision_convs="low")
    [mish] = [n for n in optimized.graph if n.op_type == "Mish"]
    assert mish.inputs[0].dtype == ir.DataType.FLOAT16 and report.precision_conversion.kept_for_kernel == []


# ------------------------------------------------------------------ the shipped table


def test_the_shipped_cuda_table_is_well_formed() -> None:
    data = json.loads(TABLE.read_text())
    assert data["provider"] == "CUDAExecutionProvider" and data["onnxruntime"] and "onnxruntime-gpu" in data["package"]
    assert set(data["kernels"]) == set(data["ranges"]) == set(data["range_types"])
    for op, spans in data["ranges"].items():
        assert all(0 < lo <= hi for lo, hi in spans), op
        assert {f"{lo}-{hi}" for lo, hi in spans} == set(data["range_types"][op]), op
        newest = max(spans)
        assert set(data["kernels"][op]) == set(data["range_types"][op][f"{newest[0]}-{newest[1]}"]), op
    assert len(data["kernels"]) > 200


USUAL_F16 = ["Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Softmax",
             "Transpose", "Reshape", "Concat", "Slice", "Gather", "Resize", "BatchNormalization", "ReduceMean", "Erf",
             "HardSigmoid", "MaxPool", "AveragePool", "GlobalAveragePool", "Sqrt", "Pow", "Cast", "Where", "Expand"]


@pytest.mark.parametrize("opset", [11, 13, 17, 21])
def test_the_usual_ops_have_float16_cuda_kernels(opset: int) -> None:
    table = get_target("ort-cuda").standard_kernels
    assert table is not None
    missing = [op for op in USUAL_F16 if op != "Where" and "f16" not in (table.types_at(("", op), opset) or set())]
    assert missing == []
    if opset >= 17:
        assert "f16" in (table.types_at(("", "LayerNormalization"), opset) or set())
    assert "f16" not in (table.types_at(("", "Clip"), 11) or set())  # the table can say no


def test_a_table_without_types_per_range_decides_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older snapshot (the shipped CPU one records no `range_types`) cannot say a type is missing."""
    from graphopt.ops.targets import KernelTable

    monkeypatch.setenv("GRAPHOPT_ORT_REGISTRY", "0")  # the shipped file, not the installed build
    old = KernelTable("CPUExecutionProvider", fallback="ort_cpu_kernels.json")
    assert ("", "Clip") in old and old.types_at(("", "Clip"), 11) is None
    cuda = KernelTable("CUDAExecutionProvider", fallback="ort_cuda_kernels.json")
    assert cuda.types_at(("", "Clip"), 11) == {"f32"} and cuda.types_at(("", "Clip"), 5) == frozenset()
    assert cuda.types_at(("", "Clip"), None) is None


def attention_scores_softmax() -> onnx.ModelProto:
    """q @ k^T * scale -> Softmax -> @ v: a written-out attention whose Softmax reads an fp16 MatMul."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info(n, F, [2, 6, 8]) for n in ("q", "k", "v")]
    return make_model(nodes, inputs, [helper.make_tensor_value_info("y", F, None)], [init("scale", np.array(0.35, np.float32))], opset=17)


@pytest.mark.parametrize("target, softmax_in_fp32", [("ort-cuda", False), ("onnx", True)])
def test_softmax_is_kept_in_fp32_only_where_its_kernel_sums_in_16_bits(target: str, softmax_in_fp32: bool) -> None:
    # onnxruntime's CUDA Softmax accumulates half in float (core/providers/cuda/math/softmax.h):
    # on ort-cuda the block list's reason does not hold, and the Casts around it only cost kernels.
    model = attention_scores_softmax()
    optimized, report = optimize_with(model, [], target=target, precision="fp16")
    summary = report.precision_conversion
    assert summary is not None
    assert ("Softmax" in summary.kept_ops) == softmax_in_fp32
    casts = op_types(optimized).count("Cast")
    assert casts == (3 + 1 + 2 if softmax_in_fp32 else 3 + 1)  # 3 inputs down, the output up (+ around Softmax)
    feeds = feeds_for(model)
    within_budget(run(model, feeds), run(optimized, feeds), "fp16")
