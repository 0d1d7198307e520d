"""Build one zoo model with JAX/Flax (nnx) and convert it with jax2onnx.

Runs in the jax2onnx virtual environment (see benchmarks/zoo-requirements.txt):
``python jax_worker.py NAME OUT_DIR``. Writes OUT_DIR/model.onnx, inputs.npz and
expected.npz (JAX's outputs, for the zoo's check). Flax convolutions are NHWC, so the
export has the NHWC-around-Conv form; activations are jax.nn's (hard_swish, silu, gelu)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax2onnx  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from flax import nnx  # noqa: E402


class CNN(nnx.Module):
    """MobileNet-flavoured: Conv + BatchNorm + hard_swish, depthwise Conv, a squeeze-excite
    gate with hard_sigmoid, SiLU, global pooling, Linear head."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.stem = nnx.Conv(3, 16, (3, 3), strides=2, use_bias=False, rngs=rngs)
        self.bn0 = nnx.BatchNorm(16, use_running_average=True, rngs=rngs)
        self.expand = nnx.Conv(16, 48, (1, 1), rngs=rngs)
        self.dw = nnx.Conv(48, 48, (3, 3), strides=2, feature_group_count=48, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(48, use_running_average=True, rngs=rngs)
        self.se1, self.se2 = nnx.Linear(48, 12, rngs=rngs), nnx.Linear(12, 48, rngs=rngs)
        self.project = nnx.Conv(48, 32, (1, 1), rngs=rngs)
        self.head = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.hard_swish(self.bn0(self.stem(x)))
        h = jax.nn.silu(self.expand(h))
        h = jax.nn.hard_swish(self.bn1(self.dw(h)))
        s = jax.nn.hard_sigmoid(self.se2(jax.nn.relu(self.se1(h.mean(axis=(1, 2))))))
        h = self.project(h * s[:, None, None, :])
        return self.head(h.mean(axis=(1, 2)))


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.ln1, self.ln2 = nnx.LayerNorm(128, rngs=rngs), nnx.LayerNorm(128, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(4, 128, decode=False, rngs=rngs)
        self.fc1, self.fc2 = nnx.Linear(128, 256, rngs=rngs), nnx.Linear(256, 128, rngs=rngs)

    def __call__(self, h):
        n = self.ln1(h)
        h = h + self.attn(n, n, n)
        return h + self.fc2(jax.nn.gelu(self.fc1(self.ln2(h))))


class Transformer(nnx.Module):
    """A ViT-style encoder: patch embedding (a strided Conv), 2 pre-LN blocks of
    MultiHeadAttention and a GELU MLP."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.patch = nnx.Conv(3, 128, (16, 16), strides=16, rngs=rngs)
        self.block1, self.block2 = Block(rngs), Block(rngs)
        self.norm = nnx.LayerNorm(128, rngs=rngs)

    def __call__(self, x):
        h = self.patch(x)
        h = h.reshape(h.shape[0], -1, h.shape[-1])
        return self.norm(self.block2(self.block1(h)))


MODELS = {"cnn": (CNN, (1, 96, 96, 3), 21), "transformer": (Transformer, (1, 96, 96, 3), 23)}


def _randomize_bn(model) -> None:
    """BatchNorm statistics and every 1-D parameter (biases, scales) away from their initial 0 and 1."""
    rng = np.random.default_rng(14)
    for _, m in nnx.iter_graph(model):
        if isinstance(m, nnx.Param) and m.value.ndim == 1:
            m.set_value(m.value + (rng.standard_normal(m.value.shape) * 0.1).astype(np.float32))
        if isinstance(m, nnx.BatchNorm):
            m.mean.set_value((rng.standard_normal(m.mean.shape) * 0.1).astype(np.float32))
            m.var.set_value((rng.random(m.var.shape) + 0.5).astype(np.float32))


def main(name: str, out_dir: str) -> None:
    cls, shape, opset = MODELS[name]
    model = cls(nnx.Rngs(14))
    _randomize_bn(model)
    x = np.random.default_rng(14).standard_normal(shape).astype(np.float32)
    expected = np.asarray(model(x))
    proto = jax2onnx.to_onnx(model, [jax.ShapeDtypeStruct(shape, np.float32)], opset=opset, input_names=["x"])
    onnx.save(proto, os.path.join(out_dir, "model.onnx"))
    np.savez(os.path.join(out_dir, "inputs.npz"), x=x)
    np.savez(os.path.join(out_dir, "expected.npz"), expected)
    print(f"jax2onnx {getattr(jax2onnx, '__version__', '?')} jax {jax.__version__} opset {opset}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
