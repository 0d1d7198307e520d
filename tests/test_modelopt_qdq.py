"""NVIDIA ModelOpt's ONNX forms (int8 Q->DQ on float weights, int4 blocked DequantizeLinear, fp8 Q/DQ)
through graphopt (issue 18 item 3): golden counts, outputs against the input on onnxruntime's CPU
provider, and the cases each rewrite must leave alone. The models: tests/modelopt_models.py."""

from __future__ import annotations

import collections
from pathlib import Path

import ml_dtypes
import modelopt_models as mm
import numpy as np
import onnx
import pytest
import qdq_models as qm
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.passes.qdq_weights import quantize_constant

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


def _ops(path: Path) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def _run(path: Path, feeds: dict[str, np.ndarray], level: str = "ORT_ENABLE_ALL") -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _rel(a: np.ndarray, e: np.ndarray) -> float:
    return float(np.abs(a - e).max() / np.abs(e).max())


@pytest.fixture(scope="module")
def int8_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("modelopt")
    built = {}
    for name, make in (("cnn", qm.float_cnn), ("mlp", qm.float_mlp)):
        feeds = make(root / f"{name}.float.onnx")
        mm.modelopt_int8(root / f"{name}.float.onnx", root / f"{name}-int8.onnx", feeds)
        mm.int8_to_fp8(root / f"{name}-int8.onnx", root / f"{name}-fp8.onnx")
        built[f"{name}-int8"] = (root / f"{name}-int8.onnx", feeds)
        built[f"{name}-fp8"] = (root / f"{name}-fp8.onnx", feeds)
    return built


# ----------------------------------------------------------------------------- (a) int8, Q -> DQ on float weights

#: name -> (Q/DQ in the input, constant QuantizeLinear folded, onnxruntime's fused kernels from either)
INT8_GOLDEN = {
    "cnn-int8": (10, 4, {"QLinearConv": 1}),
    "mlp-int8": (13, 6, {"QLinearMatMul": 2}),
}


@pytest.mark.parametrize("target", ["onnx", "ort-cpu", "ort-cuda"])
@pytest.mark.parametrize("name", list(INT8_GOLDEN))
def test_int8_weight_quantize_folded(int8_models, tmp_path: Path, name: str, target: str) -> None:
    src, feeds = int8_models[name]
    qdq, folded, kernels = INT8_GOLDEN[name]
    before = _ops(src)
    assert before["QuantizeLinear"] == qdq and before["DequantizeLinear"] == qdq
    out = tmp_path / "opt.onnx"
    report = graphopt.optimize_file(src, out, target=target)
    after = _ops(out)
    assert report.pass_stats("weight_quantize_folding").changes == folded
    assert after["QuantizeLinear"] == qdq - folded and after["DequantizeLinear"] == qdq
    assert sum(after.values()) == sum(before.values()) - folded
    model = onnx.load(str(out))
    quantized = {i.name for i in model.graph.initializer if i.data_type == TensorProto.INT8}
    assert sum(n.op_type == "DequantizeLinear" and n.input[0] in quantized for n in model.graph.node) == folded
    assert _rel(_run(out, feeds, "ORT_DISABLE_ALL"), _run(src, feeds, "ORT_DISABLE_ALL")) == 0.0   # folding is exact
    assert qm.ort_optimized_kernels(out, tmp_path / "o.ort.onnx") == collections.Counter(kernels)
    assert qm.ort_optimized_kernels(src, tmp_path / "s.ort.onnx") == collections.Counter(kernels)


def test_quantize_of_an_activation_stays(int8_models, tmp_path: Path) -> None:
    """Negative case: a QuantizeLinear of a graph input (an activation) is not folded."""
    src, _ = int8_models["mlp-int8"]
    graphopt.optimize_file(src, tmp_path / "opt.onnx", target="ort-cpu")
    model = onnx.load(str(tmp_path / "opt.onnx"))
    assert any(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in model.graph.node)


def _reference_quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, out_type: int, **attrs: int) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(scale, "s")]
    inputs = ["x", "s"]
    if zp is not None:
        inits.append(helper.make_tensor("z", out_type, zp.shape, zp.astype(np.float32).flatten().tolist()
                                        if out_type in (TensorProto.FLOAT8E4M3FN,) else zp.astype(np.int64).flatten().tolist()))
        inputs.append("z")
    graph = helper.make_graph([helper.make_node("QuantizeLinear", inputs, ["y"], **attrs)], "q", [],
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])).run(None, {})[0]


@pytest.mark.parametrize("case", ["per-tensor-int8", "per-axis-int8", "blocked-int4", "uint8-zero-point", "fp8-saturating"])
def test_quantize_constant_matches_onnx_reference(case: str) -> None:
    import onnx_ir as ir

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 16)) * 3).astype(np.float32)
    x[0, 0], x[1, 1] = 2.5 * 0.05, -1000.0          # a tie (round half to even) and a value past the range
    cases = {
        "per-tensor-int8": (np.array(0.05, np.float32), np.array(0, np.int8), TensorProto.INT8, ir.DataType.INT8, {}),
        "per-axis-int8": ((rng.uniform(0.01, 0.1, 16)).astype(np.float32), np.zeros(16, np.int8), TensorProto.INT8, ir.DataType.INT8, {"axis": 1}),
        "blocked-int4": ((rng.uniform(0.2, 1.0, (2, 16))).astype(np.float32), None, TensorProto.INT4, ir.DataType.INT4,
                         {"axis": 0, "block_size": 32, "output_dtype": TensorProto.INT4}),
        "uint8-zero-point": (np.array(0.05, np.float32), np.array(128, np.uint8), TensorProto.UINT8, ir.DataType.UINT8, {}),
        "fp8-saturating": (np.array(0.01, np.float32), np.array(0, np.float32), TensorProto.FLOAT8E4M3FN, ir.DataType.FLOAT8E4M3FN, {}),
    }
    scale, zp, onnx_type, ir_type, attrs = cases[case]
    zp_for_ours = None if zp is None else (zp.astype(ml_dtypes.float8_e4m3fn) if onnx_type == TensorProto.FLOAT8E4M3FN else zp)
    ours = quantize_constant(x, scale, zp_for_ours, ir_type, attrs.get("axis", 1), attrs.get("block_size", 0))
    assert ours is not None
    expected = _reference_quantize(x, scale, zp, onnx_type, **attrs)
    np.testing.assert_array_equal(ours.astype(np.float32), np.asarray(expected).astype(np.float32))


def test_quantize_constant_refuses_what_it_cannot_compute() -> None:
    import onnx_ir as ir

    x = np.ones((4, 6), np.float32)
    assert quantize_constant(x, np.ones(5, np.float32), None, ir.DataType.INT8, axis=1) is None      # scale of another shape
    assert quantize_constant(x, np.ones((), np.float32), None, ir.DataType.FLOAT, axis=1) is None    # not a quantized type
    assert quantize_constant(x, np.ones((), np.float32), np.ones((), ml_dtypes.float8_e4m3fn), ir.DataType.FLOAT8E4M3FN) is None


# ----------------------------------------------------------------------------- (b) int4 weight-only

#: variant -> nodes of graphopt's output on ort targets (3 MatMulNBits, 3 bias Adds, 2 Relu, AWQ's 3 Muls)
INT4_GOLDEN = {"plain": 8, "awq": 11, "transpose": 8, "cast": 8}


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("variant", list(INT4_GOLDEN))
@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_int4_lowered_to_matmul_nbits(tmp_path: Path, target: str, variant: str, zero_point: bool) -> None:
    src = tmp_path / "int4.onnx"
    feeds = mm.modelopt_int4_mlp(src, variant, zero_point)
    out = tmp_path / "opt.onnx"
    report = graphopt.optimize_file(src, out, target=target)
    ops = _ops(out)
    assert report.pass_stats("dq_matmul_nbits").changes == 3
    assert ops["MatMulNBits"] == 3 and ops["DequantizeLinear"] == 0 and ops["Transpose"] == 0 and ops["Cast"] == 0
    assert sum(ops.values()) == INT4_GOLDEN[variant]
    model = onnx.load(str(out))
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    attrs = {a.name: a.i for a in nbits[0].attribute}
    assert attrs["bits"] == 4 and attrs["block_size"] == 64 and attrs["K"] == 128 and attrs["N"] == 128
    assert attrs["accuracy_level"] == (4 if target == "ort-cpu" else 0)
    assert all(len(n.input) == (4 if zero_point else 3) for n in nbits)   # a signed weight needs no zero point
    expected = _run(src, feeds, "ORT_DISABLE_ALL")                       # the DequantizeLinear in float
    actual = _run(out, feeds)
    # ort-cpu: accuracy level 4 quantizes the activations per block (what onnxruntime's own fusion does);
    # ort-cuda's level 0 computes in float: the lowering itself is exact (float16 scales: their rounding)
    tolerance = 2e-2 if target == "ort-cpu" else (1e-3 if variant == "cast" else 1e-5)
    assert _rel(actual, expected) <= tolerance


def test_int4_plain_form_matches_onnxruntimes_own_fusion(tmp_path: Path) -> None:
    """onnxruntime fuses the plain DQ -> MatMul itself (same kernel, same accuracy level): equal outputs."""
    src = tmp_path / "int4.onnx"
    feeds = mm.modelopt_int4_mlp(src, "plain", False)
    graphopt.optimize_file(src, tmp_path / "opt.onnx", target="ort-cpu")
    assert qm.ort_optimized_kernels(src, tmp_path / "s.ort.onnx")["MatMulNBits"] == 3
    assert _rel(_run(tmp_path / "opt.onnx", feeds), _run(src, feeds)) == 0.0


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("variant", ["transpose", "cast"])
def test_int4_onnx_target_writes_the_plain_form(tmp_path: Path, variant: str, zero_point: bool) -> None:
    """Standard ops only; the Transpose or Cast folded into the DequantizeLinear (axis 0 of [K, N]),
    which onnxruntime then fuses into MatMulNBits itself (it fuses none of the input's three)."""
    src = tmp_path / "int4.onnx"
    feeds = mm.modelopt_int4_mlp(src, variant, zero_point)
    out = tmp_path / "opt.onnx"
    report = graphopt.optimize_file(src, out, target="onnx")
    ops = _ops(out)
    assert report.pass_stats("dq_matmul_nbits").changes == 3
    assert ops == collections.Counter({"DequantizeLinear": 3, "MatMul": 3, "Add": 3, "Relu": 2})
    model = onnx.load(str(out))
    assert not any(n.domain == "com.microsoft" for n in model.graph.node)
    for node in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        assert {a.name: a.i for a in node.attribute} == {"axis": 0, "block_size": 64}
    assert qm.ort_optimized_kernels(src, tmp_path / "s.ort.onnx")["MatMulNBits"] == 0
    assert qm.ort_optimized_kernels(out, tmp_path / "o.ort.onnx")["MatMulNBits"] == 3
    expected = _run(src, feeds, "ORT_DISABLE_ALL")
    assert _rel(_run(out, feeds, "ORT_DISABLE_ALL"), expected) <= (1e-3 if variant == "cast" else 1e-6)


def test_int4_onnx_target_leaves_the_plain_form(tmp_path: Path) -> None:
    src = tmp_path / "int4.onnx"
    mm.modelopt_int4_mlp(src, "plain", True)
    report = graphopt.optimize_file(src, tmp_path / "opt.onnx", target="onnx")
    assert report.pass_stats("dq_matmul_nbits").changes == 0
    assert _ops(tmp_path / "opt.onnx")["DequantizeLinear"] == 3


def _edit(path: Path, change) -> None:  # noqa: ANN001
    model = onnx.load(str(path))
    change(model)
    onnx.save(model, str(path))


def test_int4_forms_left_alone(tmp_path: Path) -> None:
    """Negative cases: blocks of 8 (MatMulNBits wants >= 16), blocks along N (axis 1 of [K, N]), a
    DequantizeLinear read by two MatMuls."""
    small = tmp_path / "small.onnx"
    mm.modelopt_int4_mlp(small, "plain", False, block=8)
    report = graphopt.optimize_file(small, tmp_path / "small.opt.onnx", target="ort-cpu")
    assert report.pass_stats("dq_matmul_nbits").changes == 0 and _ops(tmp_path / "small.opt.onnx")["DequantizeLinear"] == 3

    along_n = tmp_path / "along_n.onnx"
    mm.modelopt_int4_mlp(along_n, "plain", False)

    def block_along_n(model: onnx.ModelProto) -> None:  # [K, N] blocked on axis 1: scales [K, N / block]
        inits = {i.name: i for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "DequantizeLinear":
                for a in node.attribute:
                    if a.name == "axis":
                        a.i = 1
                scale = inits[node.input[1]]
                scale.CopyFrom(numpy_helper.from_array(np.full((128, 2), 0.01, np.float32), scale.name))
                if len(node.input) > 2:
                    del node.input[2]
    _edit(along_n, block_along_n)
    report = graphopt.optimize_file(along_n, tmp_path / "along_n.opt.onnx", target="ort-cpu")
    assert report.pass_stats("dq_matmul_nbits").changes == 0

    shared = tmp_path / "shared.onnx"
    mm.modelopt_int4_mlp(shared, "plain", False, layers=2)

    def share(model: onnx.ModelProto) -> None:  # the second layer reads the first layer's weight
        for node in model.graph.node:
            if node.op_type == "MatMul" and node.input[1] == "w1_dq":
                node.input[1] = "w0_dq"
    _edit(shared, share)
    report = graphopt.optimize_file(shared, tmp_path / "shared.opt.onnx", target="ort-cpu")
    assert report.pass_stats("dq_matmul_nbits").changes == 0


# ----------------------------------------------------------------------------- (c) fp8

@pytest.mark.parametrize("name", ["cnn-fp8", "mlp-fp8"])
def test_fp8_on_ort_targets(int8_models, tmp_path: Path, name: str) -> None:
    """float8 weights stored dequantized, Relu after the float8 Q/DQ: onnxruntime's full optimization of
    graphopt's output computes what the model says (its ReluQuantFusion drops a Relu before a float8 Q)."""
    src, feeds = int8_models[name]
    out = tmp_path / "opt.onnx"
    report = graphopt.optimize_file(src, out, target="ort-cpu")
    ops = _ops(out)
    activations = {"cnn-fp8": 6, "mlp-fp8": 7}[name]          # the activations' Q/DQ (weights' folded)
    assert ops["QuantizeLinear"] == activations and ops["DequantizeLinear"] == activations and ops["Relu"] == 2
    model = onnx.load(str(out))
    producers = {o: n for n in model.graph.node for o in n.output}
    assert all(producers[n.input[0]].op_type == "DequantizeLinear" for n in model.graph.node if n.op_type == "Relu")
    assert not any(i.data_type == TensorProto.FLOAT8E4M3FN and len(i.dims) >= 2 for i in model.graph.initializer)
    assert any("float8 QuantizeLinear/DequantizeLinear kept" in w and "no FP8" in w for w in report.warnings)
    reference = _run(src, feeds, "ORT_DISABLE_ALL")
    assert _rel(_run(out, feeds, "ORT_DISABLE_ALL"), reference) <= 1e-6
    assert _rel(_run(out, feeds), reference) <= 1e-2        # NCHWc convolutions reorder float sums


def test_fp8_onnx_target_and_int8_keep_relu_in_place(int8_models, tmp_path: Path) -> None:
    """Negative cases: on the standard target the float8 weights stay float8 (Q folded, DQ kept) and
    Relu stays; an int8 Q (ReluQuantFusion is right there) keeps its Relu before it."""
    src, _ = int8_models["mlp-fp8"]
    graphopt.optimize_file(src, tmp_path / "onnx.onnx", target="onnx")
    model = onnx.load(str(tmp_path / "onnx.onnx"))
    assert sum(i.data_type == TensorProto.FLOAT8E4M3FN and len(i.dims) == 2 for i in model.graph.initializer) == 3
    users = {i: n for n in model.graph.node for i in n.input}
    assert all(users[n.output[0]].op_type == "QuantizeLinear" for n in model.graph.node if n.op_type == "Relu")
    src, _ = int8_models["mlp-int8"]
    graphopt.optimize_file(src, tmp_path / "int8.onnx", target="ort-cpu")
    model = onnx.load(str(tmp_path / "int8.onnx"))
    users = {i: n for n in model.graph.node for i in n.input}
    assert all(users[n.output[0]].op_type == "QuantizeLinear" for n in model.graph.node if n.op_type == "Relu")


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda", "onnx"])
def test_int4_float16_model(tmp_path: Path, target: str) -> None:
    """ModelOpt's default: the model in float16 (scales, biases, activations). The Transpose form:
    MatMulNBits with float16 scales on ort targets, the plain form on onnx (fused by onnxruntime)."""
    src = tmp_path / "int4.onnx"
    feeds = mm.modelopt_int4_mlp(src, "transpose", False, fp16=True)
    out = tmp_path / "opt.onnx"
    report = graphopt.optimize_file(src, out, target=target)
    assert report.pass_stats("dq_matmul_nbits").changes == 3
    model = onnx.load(str(out))
    if target == "onnx":
        assert _ops(out)["DequantizeLinear"] == 3
    else:
        nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
        inits = {i.name: i for i in model.graph.initializer}
        assert len(nbits) == 3 and all(inits[n.input[2]].data_type == TensorProto.FLOAT16 for n in nbits)
    assert qm.ort_optimized_kernels(out, tmp_path / "o.ort.onnx")["MatMulNBits"] == 3
    expected = _run(src, feeds, "ORT_DISABLE_ALL").astype(np.float32)
    assert _rel(_run(out, feeds).astype(np.float32), expected) <= (3e-2 if target != "ort-cuda" else 2e-3)


def test_blocked_int8_weight_is_not_lowered(tmp_path: Path) -> None:
    """Negative case: a blocked int8 DequantizeLinear -> MatMul stays (8-bit MatMulNBits lost to the
    unquantized MatMul in the weights decision's measurements)."""
    rng = np.random.default_rng(5)
    inits = [helper.make_tensor("q", TensorProto.INT8, [128, 32], rng.integers(-100, 100, 128 * 32).tolist()),
             numpy_helper.from_array(np.full((2, 32), 0.01, np.float32), "s")]
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=0, block_size=64),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "m.onnx"))
    report = graphopt.optimize_file(tmp_path / "m.onnx", tmp_path / "o.onnx", target="ort-cpu")
    assert report.pass_stats("dq_matmul_nbits").changes == 0
    assert _ops(tmp_path / "o.onnx") == collections.Counter({"DequantizeLinear": 1, "MatMul": 1})
