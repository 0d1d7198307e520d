"""--weights int4|int8 (graphopt.passes.weight_quant): golden tests of each form against onnxruntime's
CPU kernels, the block list and the SNR budget, verification of quantized models, and the CLI."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.errors import GraphoptError
from graphopt.quant.blockwise import dequantize, quantize
from graphopt.verify import verify
from tests.conftest import run_cli

K, N = 128, 64


def _model(nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _matmul_model(w: np.ndarray, x_shape: list, opset: int = 17, elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """x @ W -> Relu (one weight layer whose output is not a graph output: never taken for an LM head)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"), helper.make_node("Relu", ["h"], ["y"], name="relu")]
    y_shape = [*x_shape[:-1], w.shape[1]]
    return _model(nodes, [helper.make_tensor_value_info("x", elem, x_shape)], [helper.make_tensor_value_info("y", elem, y_shape)], {"W": w}, opset)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], fuse_dq_level: str | None = None) -> np.ndarray:
    options = ort.SessionOptions()
    if fuse_dq_level is not None:  # onnxruntime fuses DequantizeLinear -> MatMul into MatMulNBits at this accuracy_level
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", fuse_dq_level)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture
def weight() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)


@pytest.fixture
def x3d() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, 5, K)).astype(np.float32)


# ------------------------------------------------------------------ MatMulNBits (ort-cpu, ort-cuda)


@pytest.mark.parametrize("weights,bits", [("int4", 4), ("int8", 8)])
def test_matmul_3d_activations_become_matmulnbits_equal_to_x_times_dequantized(weight: np.ndarray, x3d: np.ndarray, weights: str, bits: int) -> None:
    model = _matmul_model(weight, [2, 5, K])
    out, report = graphopt.optimize(model, target="ort-cuda", weights=weights)
    assert _ops(out) == Counter({"MatMulNBits": 1, "Relu": 1})
    node = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"K": K, "N": N, "bits": bits, "block_size": 32, "accuracy_level": 0}
    assert len(node.input) == (4 if bits == 4 else 3)  # int4: asymmetric by default (zero points); int8: symmetric
    assert not any(t.name == "W" for t in out.graph.initializer)  # the float weight is gone
    q = quantize(weight, bits, 32, symmetric=bits == 8)
    got = _run(out, {"x": x3d})
    np.testing.assert_allclose(got, np.maximum(x3d @ dequantize(q), 0), rtol=1e-4, atol=1e-4)
    original = _run(model, {"x": x3d})
    assert _cosine(got, original) > (0.99 if bits == 4 else 0.9999)
    summary = report.weight_quantization
    assert (summary.quantized, summary.kept, summary.form) == (1, 0, "MatMulNBits")
    assert summary.layers[0].quantized and summary.layers[0].snr_db > (20 if bits == 4 else 35)
    assert summary.bytes_after < summary.bytes_before / (5 if bits == 4 else 3)


def test_ort_cpu_uses_accuracy_level_4_and_stays_within_int8_activation_error(weight: np.ndarray, x3d: np.ndarray) -> None:
    model = _matmul_model(weight, [2, 5, K])
    out, report = graphopt.optimize(model, target="ort-cpu", weights="int4")
    node = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "accuracy_level")) == 4
    assert report.weight_quantization.accuracy_level == 4
    want = np.maximum(x3d @ dequantize(quantize(weight, 4, 32, symmetric=False)), 0)
    got = _run(out, {"x": x3d})
    # int8 activations (quantized per block by the kernel): close to x @ dequantize(W), not equal
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()
    exact, _ = graphopt.optimize(model, target="ort-cpu", weights="int4", weights_accuracy_level=0)
    np.testing.assert_allclose(_run(exact, {"x": x3d}), want, rtol=1e-4, atol=1e-4)


def test_gemm_transb_alpha_beta_bias(weight: np.ndarray) -> None:
    rng = np.random.default_rng(2)
    b = weight.T.copy()  # [N, K] read with transB
    c = rng.standard_normal(N).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "B", "C"], ["g"], transB=1, alpha=0.5, beta=2.0, name="fc"), helper.make_node("Relu", ["g"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", 1, [3, K])], [helper.make_tensor_value_info("y", 1, [3, N])], {"B": b, "C": c})
    out, report = graphopt.optimize(model, target="ort-cuda", weights="int8", block_size=64)
    assert _ops(out) == Counter({"MatMulNBits": 1, "Add": 1, "Relu": 1})
    x = rng.standard_normal((3, K)).astype(np.float32)
    want = np.maximum(x @ dequantize(quantize(0.5 * weight, 8, 64)) + 2.0 * c, 0)
    np.testing.assert_allclose(_run(out, {"x": x}), want, rtol=1e-4, atol=1e-4)
    assert report.weight_quantization.layers[0].op == "Gemm"


def test_fp16_model_gets_fp16_scales(weight: np.ndarray, x3d: np.ndarray) -> None:
    model = _matmul_model(weight.astype(np.float16), [2, 5, K], elem=TensorProto.FLOAT16)
    out, _ = graphopt.optimize(model, target="ort-cpu", weights="int4", weights_accuracy_level=0)
    node = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    scales = next(t for t in out.graph.initializer if t.name == node.input[2])
    assert scales.data_type == TensorProto.FLOAT16 and list(scales.dims) == [N * K // 32]
    got = _run(out, {"x": x3d.astype(np.float16)})
    want = np.maximum(x3d @ dequantize(quantize(weight.astype(np.float16), 4, 32, symmetric=False)).astype(np.float32), 0)
    assert np.abs(got.astype(np.float32) - want).max() < 0.01 * np.abs(want).max()


def test_composes_with_precision_fp16(weight: np.ndarray, x3d: np.ndarray) -> None:
    """Quantized after the precision pass: the weight is float16 by then, so are its scales."""
    model = _matmul_model(weight, [2, 5, K])
    out, report = graphopt.optimize(model, target="ort-cuda", precision="fp16", weights="int4")
    node = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    assert next(t for t in out.graph.initializer if t.name == node.input[2]).data_type == TensorProto.FLOAT16
    assert report.precision_conversion is not None and report.weight_quantization.quantized == 1
    assert _cosine(_run(out, {"x": x3d}), _run(model, {"x": x3d})) > 0.99


def test_shared_weight_is_stored_once(weight: np.ndarray) -> None:
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("MatMul", ["z", "W"], ["b"])]
    vi = [helper.make_tensor_value_info(n, 1, [4, K]) for n in ("x", "z")]
    model = _model(nodes, vi, [helper.make_tensor_value_info(n, 1, [4, N]) for n in ("a", "b")], {"W": weight})
    out, report = graphopt.optimize(model, target="ort-cpu", weights="int8")
    nbits = [n for n in out.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and nbits[0].input[1:] == nbits[1].input[1:]
    assert len(out.graph.initializer) == 2  # one packed weight, one scales
    assert report.weight_quantization.quantized == 2


# ------------------------------------------------------------------ standard forms (target onnx)


@pytest.mark.parametrize("weights,symmetric", [("int4", None), ("int4", True), ("int8", None), ("int8", False)])
def test_opset21_dequantize_linear_form_runs_in_onnxruntime(weight: np.ndarray, x3d: np.ndarray, weights: str, symmetric: bool | None) -> None:
    w = weight[:100]  # K = 100: the last block is partial
    model = _matmul_model(w, [2, 5, 100], opset=21)
    out, report = graphopt.optimize(model, target="onnx", weights=weights, weights_symmetric=symmetric)
    assert _ops(out) == Counter({"DequantizeLinear": 1, "MatMul": 1, "Relu": 1})
    assert report.weight_quantization.form == "DequantizeLinear"
    onnx.checker.check_model(out, full_check=True)
    bits = 4 if weights == "int4" else 8
    q = quantize(w, bits, 32, symmetric=symmetric if symmetric is not None else bits == 8)
    x = x3d[..., :100].copy()
    # onnxruntime's CPU provider fuses DequantizeLinear -> MatMul into MatMulNBits with int8 activations
    # (accuracy level 4) unless told otherwise: level 0 gives x @ dequantize(W) exactly.
    np.testing.assert_allclose(_run(out, {"x": x}, fuse_dq_level="0"), np.maximum(x @ dequantize(q), 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_before_opset_21_is_cast_mul(weight: np.ndarray, x3d: np.ndarray, symmetric: bool) -> None:
    w = weight[:100]
    model = _matmul_model(w, [2, 5, 100], opset=17)
    out, report = graphopt.optimize(model, target="onnx", weights="int8", weights_symmetric=symmetric)
    assert report.weight_quantization.form == "Cast-Mul"
    assert _ops(out) == Counter({"Cast": 1, "Mul": 1, "Reshape": 1, "Slice": 1, "MatMul": 1, "Relu": 1, **({} if symmetric else {"Sub": 1})})
    x = x3d[..., :100].copy()
    np.testing.assert_allclose(_run(out, {"x": x}), np.maximum(x @ dequantize(quantize(w, 8, 32, symmetric)), 0), rtol=1e-4, atol=1e-4)


def test_int4_on_target_onnx_below_opset_21_is_refused(weight: np.ndarray) -> None:
    with pytest.raises(GraphoptError, match="opset 21"):
        graphopt.optimize(_matmul_model(weight, [2, 5, K], opset=17), target="onnx", weights="int4")


# ------------------------------------------------------------------ what is not quantized


def test_non_constant_and_rank_3_weights_are_not_layers(weight: np.ndarray) -> None:
    w3 = np.random.default_rng(3).standard_normal((2, K, N)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "v"], ["a"]), helper.make_node("MatMul", ["x", "W3"], ["b"])]
    inputs = [helper.make_tensor_value_info("x", 1, [2, 5, K]), helper.make_tensor_value_info("v", 1, [K, N])]
    outputs = [helper.make_tensor_value_info(n, 1, None) for n in ("a", "b")]
    out, report = graphopt.optimize(_model(nodes, inputs, outputs, {"W3": w3}), target="ort-cpu", weights="int4")
    assert _ops(out) == Counter({"MatMul": 2})
    assert report.weight_quantization.layers == []


def test_lm_head_is_kept_by_default_and_none_clears_the_default() -> None:
    """The widest MatMul (N > K) whose output is a graph output: the LM head."""
    rng = np.random.default_rng(4)
    w1, head = rng.standard_normal((K, K)).astype(np.float32), rng.standard_normal((K, 512)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mlp"), helper.make_node("MatMul", ["h", "HEAD"], ["logits"], name="lm_head")]
    model = _model(nodes, [helper.make_tensor_value_info("x", 1, [1, 3, K])], [helper.make_tensor_value_info("logits", 1, [1, 3, 512])],
                   {"W1": w1, "HEAD": head})
    out, report = graphopt.optimize(model, target="ort-cpu", weights="int4")
    assert _ops(out) == Counter({"MatMulNBits": 1, "MatMul": 1})
    kept = [layer for layer in report.weight_quantization.layers if not layer.quantized]
    assert [(layer.node, layer.reason, layer.snr_db) for layer in kept] == [("lm_head", "lm_head", None)]
    out, report = graphopt.optimize(model, target="ort-cpu", weights="int4", weights_keep=["none"])
    assert _ops(out) == Counter({"MatMulNBits": 2})
    out, report = graphopt.optimize(model, target="ort-cpu", weights="int4", weights_keep=["ml*", "absent_*"])
    assert _ops(out) == Counter({"MatMul": 2})
    assert {layer.reason for layer in report.weight_quantization.layers} == {"keep_list", "lm_head"}
    assert any("--weights-keep absent_*" in w for w in report.warnings)


def _outlier_weight() -> np.ndarray:
    """Gaussian with one value of 8 per block of 32: the int4 step grows to fit it and the rest rounds coarsely."""
    w = np.random.default_rng(5).standard_normal((K, N)).astype(np.float32)
    w[::32] = 8.0
    return w


def test_a_layer_under_its_budget_keeps_its_weight(weight: np.ndarray) -> None:
    nodes = [helper.make_node("MatMul", ["x", "GOOD"], ["a"], name="good"), helper.make_node("MatMul", ["a", "BAD"], ["b"], name="bad"),
             helper.make_node("Relu", ["b"], ["y"])]
    square = weight[:, :N].copy()
    model = _model(nodes, [helper.make_tensor_value_info("x", 1, [3, K])], [helper.make_tensor_value_info("y", 1, [3, N])],
                   {"GOOD": np.concatenate([square, square], 1), "BAD": _outlier_weight()})
    out, report = graphopt.optimize(model, target="ort-cpu", weights="int4")
    assert _ops(out) == Counter({"MatMulNBits": 1, "MatMul": 1, "Relu": 1})
    bad = next(layer for layer in report.weight_quantization.layers if layer.node == "bad")
    assert (bad.quantized, bad.reason) == (False, "budget") and bad.snr_db is not None and bad.snr_db < 20
    assert "kept: bad (MatMul 128x64): SNR" in str(report) and "1 of 2 MatMuls (0.1 -> 0.0 MiB), 1 kept:" in str(report)
    from graphopt.report.html import render_html

    assert "weights kept: bad (MatMul): budget, SNR" in render_html(report, drawings=False)
    out, report = graphopt.optimize(model, target="ort-cpu", weights="int4", weights_min_snr=10.0)
    assert _ops(out)["MatMulNBits"] == 2
    out, _ = graphopt.optimize(model, target="ort-cpu", weights="int8")  # int8 has levels enough for the outlier
    assert _ops(out)["MatMulNBits"] == 2


def test_bad_options_fail_before_any_work(weight: np.ndarray) -> None:
    model = _matmul_model(weight, [2, 5, K])
    for kwargs, words in [({"weights": "int3"}, "int4 or int8"), ({"weights": "int4", "block_size": 48}, "--block-size 48")]:
        with pytest.raises(GraphoptError, match=words):
            graphopt.optimize(model, **kwargs)


# ------------------------------------------------------------------ verification


def test_verify_accepts_quantization_error_and_refuses_a_wrong_weight(weight: np.ndarray) -> None:
    model = _matmul_model(weight, [2, 5, K])
    out, _ = graphopt.optimize(model, target="ort-cpu", weights="int4")
    plain = verify(model, out)
    assert not plain.passed  # element-wise tolerances flag the expected error ...
    checked = verify(model, out, weights="int4")
    assert checked.passed and 0.99 < checked.cosine["y"] < 1.0 and checked.min_cosine == 0.9  # ... the cosine does not
    wrong, _ = graphopt.optimize(_matmul_model(np.ascontiguousarray(weight[::-1]), [2, 5, K]), target="ort-cpu", weights="int4")
    failed = verify(model, wrong, weights="int4")
    assert not failed.passed and "cosine similarity" in failed.message


# ------------------------------------------------------------------ CLI


@pytest.fixture
def model_path(tmp_path: Path, weight: np.ndarray) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(_matmul_model(weight, [2, 5, K]), path)
    return path


def test_cli_weights_int4_with_verify_and_report(tmp_path: Path, model_path: Path) -> None:
    result = run_cli("optimize", model_path, tmp_path / "out.onnx", "--target", "ort-cpu", "--weights", "int4", "--block-size", "64",
                     "--verify", "--report", tmp_path / "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "weights int4 (block 64, zero points, MatMulNBits): 1 of 1 MatMuls (0.0 -> 0.0 MiB), 0 kept" in result.stdout
    assert "cosine similarity >= 0.9 " in result.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["weight_quantization"]["layers"][0]["quantized"] is True
    assert report["verification"]["cosine"]["y"] > 0.95
    import jsonschema

    from graphopt.report.model import SCHEMA_NAME

    schema = json.loads((Path(graphopt.__file__).parent / "report" / "schema.json").read_text())
    jsonschema.validate(report, schema)
    from tests.test_report import _undocumented

    assert _undocumented(report, schema) == []  # every field the report has is in the schema
    assert report["schema"] == SCHEMA_NAME
    assert _ops(onnx.load(tmp_path / "out.onnx"))["MatMulNBits"] == 1


@pytest.mark.parametrize("args,level", [([], 4), (["--weights-accuracy-level", "1"], 1), (["--weights-accuracy-level", "0"], 0)])
def test_cli_weights_accuracy_level(tmp_path: Path, model_path: Path, args: list[str], level: int) -> None:
    """--weights-accuracy-level sets MatMulNBits' accuracy_level (ort-cpu's default 4 without it)."""
    result = run_cli("optimize", model_path, tmp_path / "out.onnx", "--target", "ort-cpu", "--weights", "int4", *args, "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [node] = [n for n in onnx.load(tmp_path / "out.onnx").graph.node if n.op_type == "MatMulNBits"]
    assert {a.name: a.i for a in node.attribute}["accuracy_level"] == level


@pytest.mark.parametrize(
    "args,words",
    [
        (["--weights", "int2"], "--weights int2"),
        (["--weights", "int4", "--block-size", "48"], "--block-size 48"),
        (["--weights", "int4", "--block-size", "big"], "--block-size big"),
        (["--weights", "int4", "--weights-min-snr", "lots"], "--weights-min-snr lots"),
        (["--weights-keep", "lm_head"], "only apply with --weights"),
        (["--weights-accuracy-level", "1"], "only apply with --weights"),
        (["--weights", "int4", "--weights-accuracy-level", "5"], "--weights-accuracy-level 5"),
        (["--weights", "int4", "--weights-accuracy-level", "high"], "--weights-accuracy-level high"),
        (["--weights", "int4", "--target", "onnx"], "opset 21"),
    ],
)
def test_cli_bad_weight_options_are_one_error_line(tmp_path: Path, model_path: Path, args: list[str], words: str) -> None:
    result = run_cli("optimize", model_path, tmp_path / "out.onnx", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.strip().count("\n") == 0 and words in result.stderr, result.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_matmulnbits_with_a_partial_last_block(weight: np.ndarray, x3d: np.ndarray) -> None:
    w, x = weight[:100], x3d[..., :100].copy()  # K = 100: 4 blocks of 32, the last padded with zeros
    out, _ = graphopt.optimize(_matmul_model(w, [2, 5, 100]), target="ort-cuda", weights="int4", weights_symmetric=True)
    node = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    packed = next(t for t in out.graph.initializer if t.name == node.input[1])
    assert list(packed.dims) == [N, 4, 16]
    np.testing.assert_allclose(_run(out, {"x": x}), np.maximum(x @ dequantize(quantize(w, 4, 32)), 0), rtol=1e-4, atol=1e-4)


def test_bfloat16_on_ort_cpu_has_no_kernel_and_stays() -> None:
    w = np.random.default_rng(6).standard_normal((K, N)).astype(np.float32)
    model = _matmul_model(w, [2, 5, K], elem=TensorProto.BFLOAT16)
    model.graph.initializer[0].CopyFrom(helper.make_tensor("W", TensorProto.BFLOAT16, [K, N], w.ravel().tolist()))
    out, report = graphopt.optimize(model, target="ort-cpu", weights="int4")
    assert _ops(out)["MatMul"] == 1 and report.weight_quantization.layers[0].reason == "no_kernel"
    out, report = graphopt.optimize(model, target="ort-cuda", weights="int4")  # the CUDA kernel has bfloat16
    assert _ops(out)["MatMulNBits"] == 1
