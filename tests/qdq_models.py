"""Tiny quantized models as onnxruntime.quantization makes them (issue 18 item 3), built on the fly.

Float models are written with onnx.helper (seeded random weights; biases of zeros, as a
freshly initialized transformers layer has them: quantize_static then gives every bias
the same bytes, which is what tempted CSE to merge them), then quantized with
onnxruntime.quantization the way benchmarks/qdq_zoo.py does for the full-size ones.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 18

#: the fused quantized ops onnxruntime's CPU optimizer makes out of QDQ node units and dynamic quantization
QUANTIZED_KERNELS = frozenset({
    "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSoftmax", "QLinearAveragePool",
    "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearWhere", "QGemm",
    "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulNBits", "QAttention",
})


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def float_cnn(path: Path) -> dict[str, np.ndarray]:
    """Conv+Relu, Conv with a zero bias + residual Add + Relu, Conv, GlobalAveragePool, Flatten, Gemm (opset 17)."""
    rng = np.random.default_rng(SEED)
    c = 8
    inits = [
        _init("w1", rng.standard_normal((c, 3, 3, 3)) * 0.3), _init("b1", rng.standard_normal(c) * 0.1),
        _init("w2", rng.standard_normal((c, c, 3, 3)) * 0.2), _init("b2", np.zeros(c)),
        _init("w3", rng.standard_normal((c, c, 1, 1)) * 0.3), _init("b3", np.zeros(c)),
        _init("fc_w", rng.standard_normal((4, c)) * 0.3), _init("fc_b", np.zeros(4)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3"),
        helper.make_node("GlobalAveragePool", ["c3"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(nodes, "tiny_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}


def float_mlp(path: Path) -> dict[str, np.ndarray]:
    """Three MatMul + zero-bias Add layers (a transformer's projections), Relu between, a residual Add (opset 17)."""
    rng = np.random.default_rng(SEED)
    d = 32
    inits = []
    nodes = []
    x = "x"
    for i in range(3):
        inits += [_init(f"w{i}", rng.standard_normal((d, d)) * 0.2), _init(f"b{i}", np.zeros(d))]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"fc{i}/MatMul"),
                  helper.make_node("Add", [f"b{i}", f"m{i}"], [f"a{i}"], name=f"fc{i}/Add")]
        if i < 2:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    nodes.append(helper.make_node("Add", ["a2", "r0"], ["y"], name="residual"))
    graph = helper.make_graph(nodes, "tiny_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, d])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return {"x": rng.standard_normal((1, 16, d)).astype(np.float32)}


def float_tiny_bert(path: Path) -> dict[str, np.ndarray]:
    """A transformers BertModel (2 layers, hidden 32, seq 16, random weights) exported by TorchScript, opset 17.

    Its biases are zeros as initialized; quantize_static turns each into QuantizeLinear of
    a float zero tensor with scale 1 -> DequantizeLinear, all of equal bytes: the case where
    merging them took onnxruntime's QLinearAdd count from 12 to 2."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16)
    bert = transformers.BertModel(config).eval()

    class FirstOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, return_dict=False)[0]

    ids = np.random.default_rng(SEED).integers(3, 64, (1, 16)).astype(np.int64)
    torch.onnx.export(FirstOutput().eval(), (torch.from_numpy(ids),), str(path), dynamo=False, opset_version=17,
                      input_names=["input_ids"], output_names=["y"])
    return {"input_ids": ids}


def handmade_qdq_cnn(path: Path, activations_quantized: bool = True) -> dict[str, np.ndarray]:
    """A QDQ CNN in the form other quantizers write (torch.ao, TensorRT-style): the activation
    stays between the op and its QuantizeLinear -- DQ -> Conv -> Relu -> Q, DQ -> Conv -> Clip(0, 6) -> Q,
    DQ -> Gemm -> Relu -> Q -- where a rule fusing the activation into the op would hide the unit.
    ``activations_quantized=False``: weight-only (DQ of the weights, no Q/DQ on activations), no unit."""
    rng = np.random.default_rng(SEED)

    def q(name: str, array: np.ndarray, dtype: type = np.int8) -> TensorProto:
        return numpy_helper.from_array(np.asarray(array).astype(dtype), name)

    inits = [
        _init("s_x", np.array(0.05)), q("z_x", np.array(128), np.uint8), q("w", rng.integers(-100, 100, (8, 3, 3, 3))),
        _init("s_w", np.array(0.01)), q("z_w", np.array(0)), q("b", rng.integers(-50, 50, 8), np.int32),
        _init("s_b", np.array(0.05 * 0.01)), q("z_b", np.array(0), np.int32),
        _init("s_y", np.array(0.05)), q("z_y", np.array(0), np.uint8), q("w2", rng.integers(-100, 100, (8, 8, 1, 1))),
        _init("s_y2", np.array(0.1)), q("z_y2", np.array(0), np.uint8), q("fc_w", rng.integers(-100, 100, (4, 8))),
        _init("lo", np.array(0.0)), _init("hi", np.array(6.0)),
    ]

    def qdq(x: str, scale: str, zero: str) -> list[onnx.NodeProto]:
        if not activations_quantized:
            return [helper.make_node("Identity", [x], [f"{x}_dq"])]
        return [helper.make_node("QuantizeLinear", [x, scale, zero], [f"{x}_q"]),
                helper.make_node("DequantizeLinear", [f"{x}_q", scale, zero], [f"{x}_dq"])]

    nodes = [
        *qdq("x", "s_x", "z_x"),
        helper.make_node("DequantizeLinear", ["w", "s_w", "z_w"], ["w_dq"]),
        helper.make_node("DequantizeLinear", ["b", "s_b", "z_b"], ["b_dq"]),
        helper.make_node("Conv", ["x_dq", "w_dq", "b_dq"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        *qdq("r1", "s_y", "z_y"),
        helper.make_node("DequantizeLinear", ["w2", "s_w", "z_w"], ["w2_dq"]),
        helper.make_node("Conv", ["r1_dq", "w2_dq"], ["c2"], name="conv2"),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="relu6"),
        *qdq("r2", "s_y2", "z_y2"),
        helper.make_node("GlobalAveragePool", ["r2_dq"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        *qdq("f", "s_y2", "z_y2"),
        helper.make_node("DequantizeLinear", ["fc_w", "s_w", "z_w"], ["fc_w_dq"]),
        helper.make_node("Gemm", ["f_dq", "fc_w_dq"], ["g"], transB=1, name="fc"),
        helper.make_node("Relu", ["g"], ["gr"], name="relu_fc"),
        *qdq("gr", "s_y", "z_y"),
        helper.make_node("Identity", ["gr_dq"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "handmade_qdq_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}


class _Reader:
    def __init__(self, feeds: dict[str, np.ndarray], count: int = 4) -> None:
        rng = np.random.default_rng(SEED + 1)
        self._it = iter([{k: _like(v, rng) for k, v in feeds.items()} for _ in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _like(value: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if value.dtype.kind == "f":
        return rng.standard_normal(value.shape).astype(value.dtype)
    return rng.integers(3, int(value.max()) + 1, value.shape).astype(value.dtype)     # token ids


def static_qdq(src: Path, dst: Path, feeds: dict[str, np.ndarray], per_channel: bool, activation_int8: bool) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(str(src), str(dst), _Reader(feeds), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=QuantType.QInt8 if activation_int8 else QuantType.QUInt8, weight_type=QuantType.QInt8)


def dynamic_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)


def ort_optimized_kernels(path: Path, dump: Path) -> collections.Counter[str]:
    """The fused quantized ops in onnxruntime's CPU-optimized (ENABLE_ALL) form of the model at ``path``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(dump)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(str(dump)).graph.node if n.op_type in QUANTIZED_KERNELS)


def run_cpu(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
