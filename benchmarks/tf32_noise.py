"""How far onnxruntime's CUDA provider moves a float32 model's outputs by computing in TF32,
emulated on the CPU: the noise floor of a float32 output check on CUDA.

The CUDA provider runs MatMul, Gemm and Conv with TF32 tensor cores by default (provider
option `use_tf32`, on unless set to 0): their inputs keep 10 mantissa bits. This script
rounds every such input through float16 (the same 10 bits, exact for values in float16's
normal range) and runs both models in onnxruntime's CPU provider, so two models that compute
the same thing with different kernels (a fused attention against its MatMuls) can be
compared with the noise TF32 alone makes:

    python benchmarks/tf32_noise.py ORIGINAL.onnx OPTIMIZED.onnx INPUTS.npz

prints, relative to the largest |output| of the original (zoo_bench.py's measure):
the original in TF32 against the original in float32 (TF32's noise on this model), and the
optimized model against the original, both in TF32 (what zoo_bench compares on CUDA).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

TF32_OPS = ("MatMul", "Gemm", "Conv")


def tf32_emulated(model: onnx.ModelProto) -> bytes:
    """The model with the first two inputs of every MatMul/Gemm/Conv rounded to 10 mantissa bits."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = []
    for k, node in enumerate(copy.graph.node):
        if node.op_type in TF32_OPS and node.domain in ("", "ai.onnx"):
            for j in range(min(2, len(node.input))):
                half, back = f"tf32_{k}_{j}_h", f"tf32_{k}_{j}_f"
                nodes += [helper.make_node("Cast", [node.input[j]], [half], to=TensorProto.FLOAT16),
                          helper.make_node("Cast", [half], [back], to=TensorProto.FLOAT)]
                node.input[j] = back
        nodes.append(node)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy.SerializeToString()


def run(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [o.astype(np.float64) for o in session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})]


def worst(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) / max(float(np.abs(x).max()), 1e-6) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("original")
    parser.add_argument("optimized")
    parser.add_argument("inputs", help="an .npz of the model's inputs (benchmarks/.zoo/NAME/inputs.npz)")
    args = parser.parse_args()
    with np.load(args.inputs) as data:
        feeds = {k: data[k] for k in data.files}
    original, optimized = onnx.load(args.original), onnx.load(args.optimized)
    exact = run(original.SerializeToString(), feeds)
    original_tf32 = run(tf32_emulated(original), feeds)
    optimized_tf32 = run(tf32_emulated(optimized), feeds)
    print(f"original, TF32 against float32:       {worst(exact, original_tf32):.3g}")
    print(f"optimized against original, both TF32: {worst(original_tf32, optimized_tf32):.3g}")
    print(f"optimized against original, float32:   {worst(exact, run(optimized.SerializeToString(), feeds)):.3g}")


if __name__ == "__main__":
    main()
