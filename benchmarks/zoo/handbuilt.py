"""Zoo models built with onnx.helper in the styles other exporters write.

Each graph reproduces export forms met in models from tf2onnx, paddle2onnx and older
exporters: NHWC Transposes around every Conv, the bias as a separate Add, activations
written out (HardSwish as x * relu6(x + 3) / 6, HardSigmoid as clip(x + 3, 0, 6) * (1/6),
Mish as x * tanh(log(1 + exp(x)))), Resize-based upsampling, ConvTranspose + bias Add +
BatchNormalization, Constant nodes and shape chains, over opsets 11 to 23. Weights are
seeded random; BatchNormalization statistics are not trivial.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["HANDBUILT_MODELS", "HandBuilt"]

F = TensorProto.FLOAT


class _Graph:
    """A tiny graph builder: unique names, initializers, one node per call."""

    def __init__(self, seed: int, constant_nodes: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0
        self.constant_nodes = constant_nodes   # constants as Constant nodes, not initializers

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, array: Any, hint: str = "c") -> str:
        array = np.asarray(array)
        name = self.name(hint)
        if self.constant_nodes:
            self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)))
        else:
            self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, *shape: int, scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        s = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        return self.const((self.rng.standard_normal(shape) * s).astype(np.float32), "w")

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> Any:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def scalar(self, value: float) -> str:
        return self.const(np.array(value, np.float32), "s")

    # --- layers, in the forms the exporters write
    def bn(self, x: str, c: int) -> str:
        g = self.const((self.rng.random(c) + 0.5).astype(np.float32), "bn_g")
        b = self.const((self.rng.standard_normal(c) * 0.1).astype(np.float32), "bn_b")
        m = self.const((self.rng.standard_normal(c) * 0.1).astype(np.float32), "bn_m")
        v = self.const((self.rng.random(c) + 0.5).astype(np.float32), "bn_v")
        return self.op("BatchNormalization", [x, g, b, m, v], epsilon=1e-3)

    def clip(self, x: str, lo: float, hi: float, opset: int) -> str:
        if opset < 11:
            return self.op("Clip", [x], min=lo, max=hi)
        return self.op("Clip", [x, self.scalar(lo), self.scalar(hi)])

    def hard_swish_div(self, x: str, opset: int) -> str:
        """x * relu6(x + 3) / 6 (paddle2onnx below opset 14, torch's F.hardswish in old exports)."""
        return self.op("Div", [self.op("Mul", [x, self.clip(self.op("Add", [x, self.scalar(3.0)]), 0.0, 6.0, opset)]), self.scalar(6.0)])

    def hard_sigmoid_mul(self, x: str, opset: int) -> str:
        """clip(x + 3, 0, 6) * (1/6) (tf2onnx's relu6(x + 3) * 0.16666667)."""
        return self.op("Mul", [self.clip(self.op("Add", [x, self.scalar(3.0)]), 0.0, 6.0, opset), self.scalar(1.0 / 6.0)])

    def conv_nhwc(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
        """tf2onnx without its transpose optimizer: Transpose, Conv, Transpose back, bias Add on the channel axis."""
        t = self.op("Transpose", [x], perm=[0, 3, 1, 2])
        c = self.op("Conv", [t, self.weight(cout, cin // group, k, k)], kernel_shape=[k, k], strides=[stride, stride],
                    pads=[k // 2] * 4, group=group)
        back = self.op("Transpose", [c], perm=[0, 2, 3, 1])
        return self.op("Add", [back, self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32), "bias")])

    def conv_bias_add(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
        """NCHW Conv without bias, then Add of a [1, C, 1, 1] bias (paddle2onnx, some Caffe converters)."""
        c = self.op("Conv", [x, self.weight(cout, cin // group, k, k)], kernel_shape=[k, k], strides=[stride, stride],
                    pads=[k // 2] * 4, group=group)
        return self.op("Add", [c, self.const((self.rng.standard_normal((1, cout, 1, 1)) * 0.1).astype(np.float32), "bias")])

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
        return self.op("Conv", [x, self.weight(cout, cin // group, k, k), self.const(np.zeros(cout, np.float32) + 0.01, "b")],
                       kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[str], opset: int, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name=f"graphopt-zoo/{name}")
        model.ir_version = min(model.ir_version, 8 if opset <= 17 else 10)
        return onnx.shape_inference.infer_shapes(model)

    def with_output_shapes(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
        """Declare the outputs' shapes (as exporters do), taken from a run where inference stops short."""
        import onnxruntime as ort

        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for value, array in zip(model.graph.output, session.run(None, feeds)):
            value.type.tensor_type.ClearField("shape")
            for d in array.shape:
                value.type.tensor_type.shape.dim.add().dim_value = d
        return model


def _mobilenetv3_nhwc(opset: int = 11) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """tf2onnx-style MobileNetV3 blocks: NHWC, Transposes around every Conv, bias Adds,
    HardSwish as x * relu6(x + 3) / 6, squeeze-excite gated by relu6(x + 3) * (1/6)."""
    g = _Graph(11)
    x = "input"
    h = g.conv_nhwc(x, 3, 16, 3, stride=2)
    h = g.hard_swish_div(h, opset)
    c = 16
    for expand, out, stride, se in ((32, 16, 1, True), (64, 24, 2, False), (72, 24, 1, True), (96, 40, 2, True)):
        e = g.hard_swish_div(g.conv_nhwc(h, c, expand, 1), opset)
        d = g.hard_swish_div(g.conv_nhwc(e, expand, expand, 3, stride=stride, group=expand), opset)
        if se:
            pooled = g.op("ReduceMean", [d], axes=[1, 2], keepdims=1)
            s = g.op("Relu", [g.conv_nhwc(pooled, expand, expand // 4, 1)])
            s = g.hard_sigmoid_mul(g.conv_nhwc(s, expand // 4, expand, 1), opset)
            d = g.op("Mul", [d, s])
        p = g.conv_nhwc(d, expand, out, 1)
        h = g.op("Add", [h, p]) if (stride == 1 and out == c) else p
        c = out
    pooled = g.op("ReduceMean", [h], axes=[1, 2], keepdims=0)
    logits = g.op("Add", [g.op("MatMul", [pooled, g.weight(c, 32)]), g.const(np.zeros(32, np.float32) + 0.1, "fc_b")])
    y = g.op("Softmax", [logits], axis=-1)
    model = g.model([helper.make_tensor_value_info(x, F, [1, 96, 96, 3])], [y], opset, "mobilenetv3_nhwc")
    return model, {x: np.random.default_rng(1).standard_normal((1, 96, 96, 3)).astype(np.float32)}


def _seg_decoder(opset: int = 13) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """paddle2onnx-style segmentation net: Conv + BatchNormalization, HardSwish written out,
    squeeze-excite with HardSigmoid(alpha 0.2) times the input, ConvTranspose upsampling with
    a separate bias Add then BatchNormalization, Resize (scales) upsampling, Concat skips."""
    g = _Graph(13)
    x = "image"
    skips = []
    h, c = x, 3
    for out in (16, 32, 64):
        h = g.hard_swish_div(g.bn(g.op("Conv", [h, g.weight(out, c, 3, 3)], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4), out), opset)
        pooled = g.op("GlobalAveragePool", [h])
        s = g.op("Relu", [g.conv(pooled, out, out // 4, 1)])
        s = g.op("HardSigmoid", [g.conv(s, out // 4, out, 1)], alpha=0.2, beta=0.5)
        h = g.op("Mul", [h, s])
        skips.append((h, out))
        c = out
    # decoder: ConvTranspose x2 with bias Add + BN + Relu, then Resize x2 nearest
    for (skip, sc) in reversed(skips[:-1]):
        up = g.op("ConvTranspose", [h, g.weight(c, sc, 2, 2)], kernel_shape=[2, 2], strides=[2, 2])
        up = g.op("Add", [up, g.const((g.rng.standard_normal((1, sc, 1, 1)) * 0.1).astype(np.float32), "deconv_b")])
        up = g.op("Relu", [g.bn(up, sc)])
        h = g.op("Concat", [up, skip], axis=1)
        h = g.op("Relu", [g.bn(g.op("Conv", [h, g.weight(sc, 2 * sc, 3, 3)], kernel_shape=[3, 3], pads=[1] * 4), sc)])
        c = sc
    roi = g.const(np.array([], np.float32), "roi")
    h = g.op("Resize", [h, roi, g.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="nearest")
    y = g.conv(h, c, 4, 1)
    model = g.model([helper.make_tensor_value_info(x, F, [1, 3, 128, 128])], [y], opset, "seg_decoder")
    return model, {x: np.random.default_rng(2).standard_normal((1, 3, 128, 128)).astype(np.float32)}


def _crnn_neck(opset: int = 17) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """OCR recognizer: conv backbone (Conv, bias Add, Mul by HardSigmoid = HardSwish), a
    transformer neck with decomposed LayerNorm, MatMul + bias Add, QuickGELU written out
    (x * sigmoid(1.702 x)), and a CTC head with shape chains (Shape/Gather/Concat/Reshape)."""
    g = _Graph(17)
    x = "image"
    h, c = x, 3
    for out, stride in ((16, 2), (32, 2), (64, 2)):
        h = g.conv_bias_add(h, c, out, 3, stride)
        h = g.op("Mul", [h, g.op("HardSigmoid", [h], alpha=1.0 / 6.0, beta=0.5)])
        c = out
    # [N, C, H, W] -> [N, W, C*H] through a shape chain, as paddle2onnx writes it
    shape = g.op("Shape", [h])
    n = g.op("Gather", [shape, g.const(np.array([0], np.int64), "i0")], axis=0)
    w = g.op("Gather", [shape, g.const(np.array([3], np.int64), "i3")], axis=0)
    t = g.op("Transpose", [h], perm=[0, 3, 1, 2])
    seq = g.op("Reshape", [t, g.op("Concat", [n, w, g.const(np.array([-1], np.int64), "m1")], axis=0)])
    d = c * 4   # H is 4 at the end of the backbone
    hid = g.op("Add", [g.op("MatMul", [seq, g.weight(d, 64)]), g.const(np.zeros(64, np.float32) + 0.05, "b")])
    d = 64

    def layer_norm(v: str) -> str:
        mean = g.op("ReduceMean", [v], axes=[-1])
        diff = g.op("Sub", [v, mean])
        var = g.op("ReduceMean", [g.op("Pow", [diff, g.scalar(2.0)])], axes=[-1])
        normed = g.op("Div", [diff, g.op("Sqrt", [g.op("Add", [var, g.scalar(1e-5)])])])
        return g.op("Add", [g.op("Mul", [normed, g.const((g.rng.random(d) + 0.5).astype(np.float32), "ln_g")]),
                            g.const((g.rng.standard_normal(d) * 0.1).astype(np.float32), "ln_b")])

    def linear(v: str, i: int, o: int) -> str:
        return g.op("Add", [g.op("MatMul", [v, g.weight(i, o)]), g.const((g.rng.standard_normal(o) * 0.1).astype(np.float32), "b")])

    for _ in range(2):
        n1 = layer_norm(hid)
        q, k, v = linear(n1, d, d), linear(n1, d, d), linear(n1, d, d)
        heads = g.const(np.array([1, -1, 4, 16], np.int64), "heads")
        qh, kh, vh = (g.op("Transpose", [g.op("Reshape", [z, heads])], perm=[0, 2, 1, 3]) for z in (q, k, v))
        scores = g.op("Mul", [g.op("MatMul", [qh, g.op("Transpose", [kh], perm=[0, 1, 3, 2])]), g.scalar(0.25)])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), vh])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.const(np.array([1, -1, d], np.int64), "merge")])
        hid = g.op("Add", [hid, linear(ctx, d, d)])
        f = linear(layer_norm(hid), d, 2 * d)
        f = g.op("Mul", [f, g.op("Sigmoid", [g.op("Mul", [f, g.scalar(1.702)])])])
        hid = g.op("Add", [hid, linear(f, 2 * d, d)])
    y = g.op("Softmax", [linear(layer_norm(hid), d, 40)], axis=-1)
    model = g.model([helper.make_tensor_value_info(x, F, [1, 3, 32, 160])], [y], opset, "crnn_neck")
    return model, {x: np.random.default_rng(3).standard_normal((1, 3, 32, 160)).astype(np.float32)}


def _yolo_mish(opset: int = 18) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Darknet/YOLOv4-style: Conv + BatchNormalization + Mish written out (x * tanh(softplus(x)),
    softplus as Log(1 + Exp(x)) or the Softplus op), Swish (x * sigmoid(x)) in the neck,
    Resize by sizes, Concat, and Constant nodes for every constant."""
    g = _Graph(18, constant_nodes=True)
    x = "images"

    def mish(v: str, form: str) -> str:
        sp = g.op("Softplus", [v]) if form == "op" else g.op("Log", [g.op("Add", [g.op("Exp", [v]), g.scalar(1.0)])])
        return g.op("Mul", [v, g.op("Tanh", [sp])])

    h, c, feats = x, 3, []
    for i, out in enumerate((16, 32, 64, 64)):
        h = mish(g.bn(g.op("Conv", [h, g.weight(out, c, 3, 3)], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4), out),
                 "op" if i % 2 else "exp")
        r = mish(g.bn(g.op("Conv", [h, g.weight(out, out, 3, 3)], kernel_shape=[3, 3], pads=[1] * 4), out), "op")
        h = g.op("Add", [h, r])
        feats.append((h, out))
        c = out
    top, tc = feats[-1]
    mid, mc = feats[-2]
    t = g.bn(g.op("Conv", [top, g.weight(32, tc, 1, 1)], kernel_shape=[1, 1]), 32)
    t = g.op("Mul", [t, g.op("Sigmoid", [t])])
    size = g.const(np.array([1, 32, 32, 32], np.int64), "sizes")
    up = g.op("Resize", [t, "", "", size], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    h = g.op("Concat", [up, mid], axis=1)
    h = g.bn(g.op("Conv", [h, g.weight(32, 32 + mc, 3, 3)], kernel_shape=[3, 3], pads=[1] * 4), 32)
    h = g.op("Mul", [h, g.op("Sigmoid", [h])])
    y = g.op("Sigmoid", [g.conv(h, 32, 18, 1)])
    model = g.model([helper.make_tensor_value_info(x, F, [1, 3, 256, 256])], [y], opset, "yolo_mish")
    feeds = {x: np.random.default_rng(4).standard_normal((1, 3, 256, 256)).astype(np.float32)}
    return g.with_output_shapes(model, feeds), feeds


def _mlp_bn(opset: int = 23) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A tabular/recommender MLP at opset 23: MatMul, bias Add, BatchNormalization (batch of
    rows), standard HardSwish; Gemm then BatchNormalization; Gemm without C + bias Add."""
    g = _Graph(23)
    x = "features"
    h = g.op("MatMul", [x, g.weight(64, 256)])
    h = g.op("HardSwish", [g.bn(g.op("Add", [h, g.const(np.zeros(256, np.float32) + 0.1, "b")]), 256)])
    h = g.op("Relu", [g.bn(g.op("Gemm", [h, g.weight(128, 256), g.const(np.zeros(128, np.float32) + 0.1, "c")], transB=1), 128)])
    h = g.op("Add", [g.op("Gemm", [h, g.weight(128, 64)]), g.const(np.zeros(64, np.float32) + 0.2, "b")])
    h = g.op("Mul", [h, g.op("HardSigmoid", [h], alpha=1.0 / 6.0, beta=0.5)])
    y = g.op("Gemm", [h, g.weight(64, 8), g.const(np.zeros(8, np.float32), "c")])
    model = g.model([helper.make_tensor_value_info(x, F, [256, 64])], [y], opset, "mlp_bn")
    return model, {x: np.random.default_rng(5).standard_normal((256, 64)).astype(np.float32)}


def _fpn_upsample(opset: int = 11) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An FPN as exporters of opset 11 wrote it: Relu6 as Clip, Resize with an empty roi and
    scales computed by a shape chain (Shape, Slice, Cast, Div), and sizes from Constant nodes."""
    g = _Graph(12, constant_nodes=True)
    x = "input"
    h, c, feats = x, 3, []
    for out in (16, 32, 64):
        h = g.clip(g.bn(g.op("Conv", [h, g.weight(out, c, 3, 3)], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4), out), 0.0, 6.0, opset)
        feats.append((h, out))
        c = out
    top = g.conv(h, c, 32, 1)
    for feat, fc in reversed(feats[:-1]):
        lateral = g.conv(feat, fc, 32, 1)
        # sizes of the lateral taken from its shape: the old exporters' upsample-to-size form
        hw = g.op("Slice", [g.op("Shape", [lateral]), g.const(np.array([2], np.int64), "st"), g.const(np.array([4], np.int64), "en")])
        nc = g.op("Slice", [g.op("Shape", [top]), g.const(np.array([0], np.int64), "st"), g.const(np.array([2], np.int64), "en")])
        sizes = g.op("Concat", [nc, hw], axis=0)
        up = g.op("Resize", [top, g.const(np.array([], np.float32), "roi"), g.const(np.array([], np.float32), "scales"), sizes],
                  mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        top = g.op("Add", [up, lateral])
    y = g.conv(top, 32, 8, 3)
    model = g.model([helper.make_tensor_value_info(x, F, [1, 3, 128, 128])], [y], opset, "fpn_upsample")
    return model, {x: np.random.default_rng(6).standard_normal((1, 3, 128, 128)).astype(np.float32)}


@dataclass(frozen=True)
class HandBuilt:
    name: str
    style: str
    make: Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]


HANDBUILT_MODELS: list[HandBuilt] = [
    HandBuilt("hb-mobilenetv3-nhwc-op11", "tf2onnx style: NHWC Transposes, bias Add, HardSwish/HardSigmoid written out",
              _mobilenetv3_nhwc),
    HandBuilt("hb-seg-decoder-op13", "paddle2onnx style: Conv+BN, HardSwish written out, SE with HardSigmoid, "
              "ConvTranspose+bias Add+BN, Resize", _seg_decoder),
    HandBuilt("hb-crnn-neck-op17", "OCR: Mul by HardSigmoid, shape chain, decomposed LayerNorm, QuickGELU written out", _crnn_neck),
    HandBuilt("hb-yolo-mish-op18", "Darknet style: Mish written out, Swish, Resize by sizes, Constant nodes", _yolo_mish),
    HandBuilt("hb-mlp-bn-op23", "MLP: MatMul+bias Add+BN, Gemm+BN, HardSwish, Mul by HardSigmoid", _mlp_bn),
    HandBuilt("hb-fpn-upsample-op11", "FPN: Relu6 as Clip, Resize to sizes from a shape chain, Constant nodes", _fpn_upsample),
]
