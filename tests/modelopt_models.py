"""Tiny models in the forms NVIDIA ModelOpt's ONNX quantizers write (issue 18 item 3), built on the fly.

ModelOpt is not installed here; the forms follow its sources (NVIDIA/TensorRT-Model-Optimizer,
modelopt/onnx/quantization/{int8,fp8,int4,ort_utils,qdq_utils}.py):

* int8 (``modelopt.onnx.quantization.int8``): onnxruntime's quantize_static, QDQ format, per-channel,
  with ModelOpt's "TensorRT-guided" options (ort_utils.configure_ort): ``AddQDQPairToWeight`` (each
  float weight stays an initializer, followed by QuantizeLinear -> DequantizeLinear), symmetric int8
  activations (zero points 0), no bias quantization, no output quantization (a unit is DQ -> op with
  no Q after it), Conv per channel on axis 0.
* fp8 (``modelopt.onnx.quantization.fp8``): the int8 model converted: scales x 448/127, zero points
  float8e4m3fn zeros, opset 19 or later (float8 Quantize/DequantizeLinear).
* int4 weight-only (``modelopt.onnx.quantization.int4``, RTN or AWQ): each MatMul weight [K, N] a
  blocked DequantizeLinear (opset 21, axis 0, block_size, int4 without zero point or uint4 with
  one), scales [K / block, N]; AWQ adds a pre-quant-scale Mul on the activation where it cannot fold
  it into the producer. Two variants of other exporters: a Transpose of a [N, K] weight blocked on
  axis 1, and a Cast of a float16 dequantized weight to float32, between the DQ and the MatMul.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import qdq_models as qm
from onnx import TensorProto, helper, numpy_helper

SEED = 18

#: ModelOpt's extra options for onnxruntime's quantize_static (ort_utils.configure_ort, int8.py)
MODELOPT_INT8_OPTIONS = {
    "QuantizeBias": False,
    "ActivationSymmetric": True,
    "AddQDQPairToWeight": True,
    "QDQOpTypePerChannelSupportToAxis": {"Conv": 0, "ConvTranspose": 1},
    "DedicatedQDQPair": False,
    "ForceQuantizeNoInputCheck": True,
    "QDQDisableWeightAdjustForInt32Bias": True,
}
_QUANTIZED_OPS = ["Conv", "Gemm", "MatMul", "Add", "GlobalAveragePool"]


def modelopt_int8(src: Path, dst: Path, feeds: dict[str, np.ndarray]) -> None:
    """The int8 form: float weights with Q -> DQ pairs, symmetric int8 activations, no output Q."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    options = dict(MODELOPT_INT8_OPTIONS, OpTypesToExcludeOutputQuantization=list(_QUANTIZED_OPS))
    quantize_static(str(src), str(dst), qm._Reader(feeds), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=_QUANTIZED_OPS,
                    calibrate_method=CalibrationMethod.MinMax, extra_options=options)


def int8_to_fp8(src: Path, dst: Path, opset: int = 19) -> None:
    """ModelOpt's fp8.int8_to_fp8: every Q/DQ's scale x 448/127, its zero point float8e4m3fn zeros."""
    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    done: set[str] = set()
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
            continue
        scale, zero = node.input[1], node.input[2]
        if scale not in done:
            array = numpy_helper.to_array(inits[scale])
            inits[scale].CopyFrom(numpy_helper.from_array((array * 448.0 / 127.0).astype(array.dtype), scale))
            done.add(scale)
        if zero not in done:
            dims = list(inits[zero].dims)
            count = int(np.prod(dims)) if dims else 1
            inits[zero].CopyFrom(helper.make_tensor(zero, TensorProto.FLOAT8E4M3FN, dims, bytes(count), raw=True))
            done.add(zero)
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, opset)
    del model.graph.value_info[:]
    onnx.save(model, str(dst))


def _int4_tensor(name: str, array: np.ndarray, signed: bool) -> TensorProto:
    return helper.make_tensor(name, TensorProto.INT4 if signed else TensorProto.UINT4, array.shape,
                              array.astype(np.int32).flatten().tolist())


def _blockwise(w: np.ndarray, block: int, axis: int, zero_point: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Round-to-nearest int4 of `w` in blocks of `block` along `axis`: (q, scales, zero points)."""
    moved = np.moveaxis(w, axis, 0)                                  # [K, N]
    blocks = moved.reshape(moved.shape[0] // block, block, -1)
    if zero_point:
        lo, hi = blocks.min(axis=1), blocks.max(axis=1)
        scale = np.maximum(hi - lo, 1e-6) / 15.0
        zp = np.clip(np.round(-lo / scale), 0, 15)
        q = np.clip(np.round(blocks / scale[:, None]) + zp[:, None], 0, 15)
    else:
        scale = np.maximum(np.abs(blocks).max(axis=1), 1e-6) / 7.0
        zp = None
        q = np.clip(np.round(blocks / scale[:, None]), -8, 7)
    q = np.moveaxis(q.reshape(moved.shape), 0, axis)
    scale, zp = np.moveaxis(scale, 0, axis), (None if zp is None else np.moveaxis(zp, 0, axis))
    return q, scale.astype(np.float32), zp


def modelopt_int4_mlp(path: Path, variant: str = "plain", zero_point: bool = False, block: int = 64,
                      dim: int = 128, layers: int = 3, fp16: bool = False) -> dict[str, np.ndarray]:
    """ModelOpt's int4 weight-only form on an MLP of `layers` MatMul + bias Add (+ Relu), opset 21.

    variant: "plain" (DQ axis 0 -> MatMul), "awq" (a pre-quant-scale Mul on each MatMul's activation),
    "transpose" (a [N, K] weight blocked on axis 1 -> DQ -> Transpose -> MatMul), "cast" (float16
    scales: DQ -> float16 -> Cast(float) -> MatMul). fp16: the whole model in float16 (ModelOpt's default
    high_precision_dtype: scales, biases and activations)."""
    float_type = np.float16 if fp16 else np.float32
    elem = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    rng = np.random.default_rng(SEED)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    x = "x"
    for i in range(layers):
        w = (rng.standard_normal((dim, dim)) * 0.1).astype(np.float32)      # [K, N]
        transposed = variant == "transpose"
        stored = w.T if transposed else w
        q, scale, zp = _blockwise(stored, block, 1 if transposed else 0, zero_point)
        if variant == "cast" or fp16:
            scale = scale.astype(np.float16)
        inits += [_int4_tensor(f"w{i}_q", q, signed=not zero_point), numpy_helper.from_array(scale, f"w{i}_scale")]
        dq_inputs = [f"w{i}_q", f"w{i}_scale"]
        if zp is not None:
            inits.append(_int4_tensor(f"w{i}_zp", zp, signed=False))
            dq_inputs.append(f"w{i}_zp")
        nodes.append(helper.make_node("DequantizeLinear", dq_inputs, [f"w{i}_dq"], axis=1 if transposed else 0,
                                      block_size=block, name=f"fc{i}/weight_DequantizeLinear"))
        weight = f"w{i}_dq"
        if transposed:
            nodes.append(helper.make_node("Transpose", [weight], [f"w{i}_t"], perm=[1, 0], name=f"fc{i}/Transpose"))
            weight = f"w{i}_t"
        elif variant == "cast":
            nodes.append(helper.make_node("Cast", [weight], [f"w{i}_f32"], to=TensorProto.FLOAT, name=f"fc{i}/Cast"))
            weight = f"w{i}_f32"
        a = x
        if variant == "awq":
            inits.append(numpy_helper.from_array((1.0 / rng.uniform(0.5, 2.0, (1, dim))).astype(float_type), f"pqs{i}"))
            nodes.append(helper.make_node("Mul", [x, f"pqs{i}"], [f"x{i}_pqs"], name=f"fc{i}/pre_quant_scale_mul"))
            a = f"x{i}_pqs"
        inits.append(numpy_helper.from_array((rng.standard_normal(dim) * 0.1).astype(float_type), f"b{i}"))
        nodes += [helper.make_node("MatMul", [a, weight], [f"m{i}"], name=f"fc{i}/MatMul"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"], name=f"fc{i}/Add")]
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [f"y{i}"], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    graph = helper.make_graph(nodes, f"modelopt_int4_{variant}", [helper.make_tensor_value_info("x", elem, [1, 16, dim])],
                              [helper.make_tensor_value_info(f"y{layers - 1}", elem, [1, 16, dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return {"x": rng.standard_normal((1, 16, dim)).astype(float_type)}
