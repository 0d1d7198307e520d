"""Build the example model: a small ResNet-style CNN with random weights, written
with onnx.helper so that it needs nothing but onnx and numpy.

It has what exporters typically leave behind: Conv + BatchNormalization + Relu
blocks (grouped and depthwise convolutions among them), an explicit Pad before a
Conv, residual Adds, a MatMul + Add classifier head, a redundant Cast round trip
through float64, and shape arithmetic (Shape -> Gather -> Concat -> Reshape) on a
symbolic batch dimension.

    python examples/make_example.py [OUT.onnx]      (default: examples/model.onnx)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
nodes: list[onnx.NodeProto] = []
inits: list[onnx.TensorProto] = []


def const(name: str, array: np.ndarray) -> str:
    inits.append(numpy_helper.from_array(np.asarray(array), name))
    return name


def conv_bn_relu(x: str, name: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1, relu: bool = True, pad: bool = True) -> str:
    w = const(f"{name}.weight", (rng.standard_normal((cout, cin // group, k, k)) * (2.0 / (cin // group * k * k)) ** 0.5).astype(np.float32))
    p = k // 2 if pad else 0
    nodes.append(helper.make_node("Conv", [x, w], [f"{name}.conv"], name=f"{name}.conv", pads=[p] * 4, strides=[stride] * 2, group=group))
    bn = [const(f"{name}.bn.{s}", v.astype(np.float32)) for s, v in (
        ("scale", 1 + 0.1 * rng.standard_normal(cout)), ("bias", 0.1 * rng.standard_normal(cout)),
        ("mean", 0.1 * rng.standard_normal(cout)), ("var", 1 + 0.2 * rng.random(cout)))]
    out = f"{name}.bn"
    nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *bn], [out], name=f"{name}.bn", epsilon=1e-5))
    if relu:
        nodes.append(helper.make_node("Relu", [out], [f"{name}.relu"], name=f"{name}.relu"))
        out = f"{name}.relu"
    return out


def block(x: str, name: str, c: int, group: int) -> str:
    y = conv_bn_relu(x, f"{name}.a", c, c, k=1)
    y = conv_bn_relu(y, f"{name}.b", c, c, k=3, group=group)
    y = conv_bn_relu(y, f"{name}.c", c, c, k=1, relu=False)
    nodes.append(helper.make_node("Add", [x, y], [f"{name}.sum"], name=f"{name}.add"))
    nodes.append(helper.make_node("Relu", [f"{name}.sum"], [f"{name}.out"], name=f"{name}.out"))
    return f"{name}.out"


def build() -> onnx.ModelProto:
    # Stem: an explicit Pad (as some exporters emit) before an unpadded Conv.
    pads = const("stem.pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    nodes.append(helper.make_node("Pad", ["image", pads], ["stem.padded"], name="stem.pad", mode="constant"))
    x = conv_bn_relu("stem.padded", "stem", 3, 32, stride=2, pad=False)
    x = block(x, "layer1", 32, group=1)
    x = conv_bn_relu(x, "down", 32, 64, stride=2)
    x = block(x, "layer2", 64, group=4)
    x = block(x, "layer3", 64, group=64)  # depthwise
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pool"))
    # Flatten through shape arithmetic on the symbolic batch dim: [N, 64, 1, 1] -> [N, 64].
    nodes.append(helper.make_node("Shape", ["pooled"], ["pooled.shape"], name="flatten.shape"))
    nodes.append(helper.make_node("Gather", ["pooled.shape", const("idx0", np.array([0], np.int64))], ["batch"], name="flatten.batch", axis=0))
    nodes.append(helper.make_node("Gather", ["pooled.shape", const("idx1", np.array([1], np.int64))], ["chan"], name="flatten.chan", axis=0))
    nodes.append(helper.make_node("Concat", ["batch", "chan"], ["flat.shape"], name="flatten.concat", axis=0))
    nodes.append(helper.make_node("Reshape", ["pooled", "flat.shape"], ["flat"], name="flatten"))
    # A Cast round trip through float64 that changes nothing.
    nodes.append(helper.make_node("Cast", ["flat"], ["flat64"], name="to_f64", to=TensorProto.DOUBLE))
    nodes.append(helper.make_node("Cast", ["flat64"], ["flat32"], name="to_f32", to=TensorProto.FLOAT))
    # Classifier head: MatMul + Add (a Gemm in disguise).
    w = const("fc.weight", (rng.standard_normal((64, 10)) * 0.1).astype(np.float32))
    b = const("fc.bias", (rng.standard_normal(10) * 0.1).astype(np.float32))
    nodes.append(helper.make_node("MatMul", ["flat32", w], ["fc.mm"], name="fc.matmul"))
    nodes.append(helper.make_node("Add", ["fc.mm", b], ["logits"], name="fc.add"))
    graph = helper.make_graph(
        nodes, "example_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 64, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="graphopt-example")
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "model.onnx")
    onnx.save(build(), out)
    print(f"wrote {out} ({len(nodes)} nodes)")


if __name__ == "__main__":
    main()
