"""Quantized models from onnxruntime.quantization come out of graphopt fusable and correct (issue 18 item 3).

onnxruntime fuses QDQ node units (DequantizeLinear -> op -> QuantizeLinear) into
QLinearConv/QLinearMatMul/QLinearAdd/... and dynamic quantization into
DynamicQuantizeMatMul/MatMulIntegerToFloat. graphopt's output, optimized by onnxruntime,
must hold at least as many of those kernels as the input optimized by onnxruntime, and
compute the same numbers within the quantized tolerance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import qdq_models as qm

import graphopt
from graphopt.passes import eliminate_common_subexpressions

pytest.importorskip("onnxruntime.quantization")
pytest.importorskip("transformers")

TARGETS = ("onnx", "ort-cpu", "ort-cuda")
#: max error relative to the output's largest magnitude; graphopt keeps every QDQ unit, so
#: only float rewrites elsewhere may move a value across a rounding step
TOLERANCE = 1e-2

BUILDS = {
    "cnn-qdq-pc-s8s8": (qm.float_cnn, lambda s, d, f: qm.static_qdq(s, d, f, per_channel=True, activation_int8=True)),
    "cnn-qdq-pt-u8s8": (qm.float_cnn, lambda s, d, f: qm.static_qdq(s, d, f, per_channel=False, activation_int8=False)),
    "mlp-qdq-pc-s8s8": (qm.float_mlp, lambda s, d, f: qm.static_qdq(s, d, f, per_channel=True, activation_int8=True)),
    "mlp-qdq-pt-u8s8": (qm.float_mlp, lambda s, d, f: qm.static_qdq(s, d, f, per_channel=False, activation_int8=False)),
    "bert-qdq-pc-s8s8": (qm.float_tiny_bert, lambda s, d, f: qm.static_qdq(s, d, f, per_channel=True, activation_int8=True)),
    "bert-dynamic": (qm.float_tiny_bert, lambda s, d, f: qm.dynamic_int8(s, d)),
    "cnn-handmade-qdq-act": (qm.handmade_qdq_cnn, lambda s, d, f: __import__("shutil").copyfile(s, d)),
    "mlp-dynamic": (qm.float_mlp, lambda s, d, f: qm.dynamic_int8(s, d)),
}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("qdq")
    built = {}
    for name, (make_float, quantize) in BUILDS.items():
        src = root / f"{name}.float.onnx"
        feeds = make_float(src)
        dst = root / f"{name}.onnx"
        quantize(src, dst, feeds)
        built[name] = (dst, feeds)
    return built


@pytest.mark.parametrize("precision", [None, "fp16"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(BUILDS))
def test_graphopt_keeps_onnxruntime_quantized_fusions(quantized, tmp_path: Path, name: str, target: str, precision: str | None) -> None:
    """Also with --precision fp16: a Cast between a QDQ unit's op and its Q/DQ would hide the unit."""
    src, feeds = quantized[name]
    out = tmp_path / "opt.onnx"
    graphopt.optimize_file(src, out, target=target, precision=precision)
    before = qm.ort_optimized_kernels(src, tmp_path / "orig.ort.onnx")
    after = qm.ort_optimized_kernels(out, tmp_path / "opt.ort.onnx")
    assert sum(before.values()) > 0, f"onnxruntime fused nothing in {name}: the model does not test anything"
    for op, count in before.items():
        assert after[op] >= count, f"{name} --target {target}: onnxruntime makes {after[op]} {op} from graphopt's output, {count} from the input"
    expected = qm.run_cpu(src, feeds)
    actual = qm.run_cpu(out, feeds)
    for e, a in zip(expected, actual, strict=True):
        assert a.shape == e.shape
        tolerance = TOLERANCE if precision is None or name.startswith(("cnn-qdq", "mlp-qdq", "bert-qdq")) else 3e-2
        assert float(np.abs(a - e).max()) <= tolerance * float(np.abs(e).max())


def test_fp16_keeps_qdq_units_float32(quantized, tmp_path: Path) -> None:
    """Golden counts: the static QDQ CNN's Conv/Add/Gemm units stay float32, no Cast is made, the
    report says why; the float ops of the dynamic model (outside any QDQ unit) are still converted."""
    out = tmp_path / "opt.onnx"
    report = graphopt.optimize_file(quantized["cnn-qdq-pt-u8s8"][0], out, target="ort-cuda", precision="fp16")
    assert not any(n.op_type == "Cast" for n in onnx.load(str(out)).graph.node)
    assert report.precision_conversion.kept.get("qdq_unit", 0) >= 5      # 3 Conv, Add, pool, Flatten, Gemm
    assert report.precision_conversion.nodes_converted == 0
    dynamic = graphopt.optimize_file(quantized["bert-dynamic"][0], tmp_path / "dyn.onnx", target="ort-cuda", precision="fp16")
    assert dynamic.precision_conversion.kept.get("qdq_unit", 0) <= 3    # only readers of the 3 DQs after an int8 Gather
    assert dynamic.precision_conversion.nodes_converted > 0


def test_static_qdq_models_have_what_broke_fusion(quantized) -> None:
    """The tiny BERT keeps the trap: Quantize/DequantizeLinear of zero biases, equal in every node unit."""
    model = onnx.load(str(quantized["bert-qdq-pc-s8s8"][0]))
    consts = {i.name: onnx.numpy_helper.to_array(i).tobytes() for i in model.graph.initializer}
    bias_q = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0].endswith("dense.bias")]
    assert len(bias_q) >= 4
    assert len({consts[q.input[1]] for q in bias_q}) == 1, "the zero biases should all get the same scale"


def test_cse_leaves_quantize_dequantize_and_their_constants_apart(quantized) -> None:
    model = onnx.load(str(quantized["bert-qdq-pc-s8s8"][0]))
    import onnx_ir as ir

    irm = ir.from_proto(model)
    dq_before = sum(1 for n in irm.graph if n.op_type == "DequantizeLinear")
    q_before = sum(1 for n in irm.graph if n.op_type == "QuantizeLinear")
    inits_before = len(irm.graph.initializers)
    eliminate_common_subexpressions(irm)
    assert sum(1 for n in irm.graph if n.op_type == "DequantizeLinear") == dq_before
    assert sum(1 for n in irm.graph if n.op_type == "QuantizeLinear") == q_before
    assert len(irm.graph.initializers) == inits_before


def test_cse_still_merges_equal_float_constants() -> None:
    """Negative case of the exemption: constants no Q/DQ reads still merge."""
    from onnx import TensorProto, helper, numpy_helper

    zeros = np.zeros(4, np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "a"], ["y0"]), helper.make_node("Add", ["x", "b"], ["y1"]),
         helper.make_node("Mul", ["y0", "y1"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(zeros, "a"), numpy_helper.from_array(zeros, "b")])
    import onnx_ir as ir

    irm = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert eliminate_common_subexpressions(irm) >= 1
    assert len(irm.graph.initializers) == 1


def test_rules_leave_qdq_units_alone(tmp_path: Path) -> None:
    """Conv + Relu -> FusedConv would hide DQ -> Conv -> Relu -> Q from onnxruntime's QLinearConv
    fusion: the driver refuses it and says why; with weight-only DQs (no unit) the rule still applies."""
    quantized, weight_only = tmp_path / "qdq.onnx", tmp_path / "weights.onnx"
    qm.handmade_qdq_cnn(quantized)
    qm.handmade_qdq_cnn(weight_only, activations_quantized=False)
    report = graphopt.optimize_file(quantized, tmp_path / "qdq.opt.onnx", target="ort-cpu", trace=True)
    stats = report.rules["FuseConvActivation"]
    assert stats.matches >= 2 and stats.applications == 0
    assert sum("QDQ node unit" in miss.reason for miss in stats.near_misses) == 2
    report = graphopt.optimize_file(weight_only, tmp_path / "weights.opt.onnx", target="ort-cpu")
    assert report.rules["FuseConvActivation"].applications == 2


def test_nhwc_layout_leaves_qdq_convs_alone(quantized, tmp_path: Path) -> None:
    """--layout nhwc on ort-cuda: a QDQ unit's Conv stays an NCHW Conv (Transposes between it and
    its Q/DQ would hide the unit); the float model's Convs still become NhwcConv."""
    src, feeds = quantized["cnn-qdq-pt-u8s8"]
    out = tmp_path / "opt.onnx"
    graphopt.optimize_file(src, out, target="ort-cuda", layout="nhwc")
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops.count("Conv") == 3 and "NhwcConv" not in ops and "Transpose" not in ops
    float_model = tmp_path / "float.onnx"
    qm.float_cnn(float_model)
    graphopt.optimize_file(float_model, tmp_path / "float.opt.onnx", target="ort-cuda", layout="nhwc")
    assert sum(n.op_type == "NhwcConv" for n in onnx.load(str(tmp_path / "float.opt.onnx")).graph.node) == 3
