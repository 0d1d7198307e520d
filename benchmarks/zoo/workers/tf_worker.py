"""Build one zoo model with Keras (TensorFlow CPU) and convert it with tf2onnx.

Runs in the tf2onnx virtual environment (see benchmarks/zoo-requirements.txt), never in
graphopt's: ``python tf_worker.py NAME OUT_DIR``. Writes OUT_DIR/model.onnx, inputs.npz and
expected.npz (Keras' outputs, for the zoo's check)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402

keras = tf.keras


def mobilenetv3() -> tuple[object, tuple[int, ...]]:
    model = keras.applications.MobileNetV3Small(input_shape=(128, 128, 3), alpha=0.5, weights=None, include_top=False,
                                                pooling="avg", include_preprocessing=False)
    return model, (1, 128, 128, 3)


def efficientnet() -> tuple[object, tuple[int, ...]]:
    from keras.src.applications import efficientnet

    full = efficientnet.EfficientNet(0.35, 0.5, 128, 0.2, name="efficientnet_small", include_top=False, weights=None,
                                     input_shape=(128, 128, 3), pooling="avg")
    # Without its Rescaling/Normalization front: tf2onnx turns the Normalization layer's
    # statistics into extra graph inputs instead of constants.
    stem = full.get_layer("stem_conv_pad")
    return keras.Model(stem.input, full.output), (1, 128, 128, 3)


def resnet() -> tuple[object, tuple[int, ...]]:
    from keras.src.applications import resnet as kr

    def stack_fn(x):
        x = kr.stack_residual_blocks_v1(x, 16, 1, stride1=1, name="conv2")
        x = kr.stack_residual_blocks_v1(x, 32, 2, name="conv3")
        x = kr.stack_residual_blocks_v1(x, 48, 2, name="conv4")
        return kr.stack_residual_blocks_v1(x, 96, 1, name="conv5")

    model = kr.ResNet(stack_fn, False, True, name="resnet_small", include_top=False, weights=None, input_shape=(128, 128, 3), pooling="avg")
    return model, (1, 128, 128, 3)


def transformer() -> tuple[object, tuple[int, ...]]:
    """A Keras text encoder: Embedding + positions, 2 blocks of MultiHeadAttention,
    LayerNormalization and a GELU feed-forward, pooled into a classifier."""
    layers = keras.layers
    class AddPositions(layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=(shape[1], shape[2]), initializer="random_normal")

        def call(self, x):
            return x + self.table[None]

    ids = keras.Input((128,), dtype="int32", name="input_ids")
    h = AddPositions()(layers.Embedding(256, 128)(ids))
    for _ in range(2):
        a = layers.MultiHeadAttention(num_heads=4, key_dim=32)(h, h)
        h = layers.LayerNormalization(epsilon=1e-6)(h + a)
        f = layers.Dense(128)(layers.Dense(256, activation=lambda v: keras.activations.gelu(v, approximate=True))(h))
        h = layers.LayerNormalization(epsilon=1e-6)(h + f)
    out = layers.Dense(8, activation="softmax")(layers.GlobalAveragePooling1D()(h))
    return keras.Model(ids, out), (1, 128)


MODELS = {"mobilenetv3": (mobilenetv3, 13), "efficientnet": (efficientnet, 13), "resnet": (resnet, 15), "transformer": (transformer, 17)}


def _randomize_bn(model) -> None:
    """BatchNormalization statistics and every 1-D weight (biases, norm scales) get values
    other than their initial 0 and 1, which an optimizer could drop where trained ones stay."""
    rng = np.random.default_rng(14)
    for layer in model.layers:
        weights = layer.get_weights()
        if weights and not isinstance(layer, keras.layers.BatchNormalization):
            layer.set_weights([w + (rng.standard_normal(w.shape) * 0.1).astype(w.dtype) if w.ndim == 1 else w for w in weights])
        if isinstance(layer, keras.layers.BatchNormalization):
            weights = [w + (rng.standard_normal(w.shape) * 0.1).astype(w.dtype) for w in weights]   # gamma, beta, mean, var
            weights[-2] = (rng.standard_normal(weights[-2].shape) * 0.1).astype(np.float32)
            weights[-1] = (rng.random(weights[-1].shape) + 0.5).astype(np.float32)
            layer.set_weights(weights)


def main(name: str, out_dir: str) -> None:
    keras.utils.set_random_seed(14)
    make, opset = MODELS[name]
    model, shape = make()
    _randomize_bn(model)
    rng = np.random.default_rng(14)
    x = rng.integers(0, 256, shape).astype(np.int32) if name == "transformer" else rng.standard_normal(shape).astype(np.float32)
    spec = (tf.TensorSpec(shape, tf.int32 if name == "transformer" else tf.float32, name="input"),)

    @tf.function(input_signature=spec)
    def forward(inp):
        return model(inp, training=False)

    expected = forward(tf.constant(x)).numpy()
    tf2onnx.convert.from_function(forward, input_signature=spec, opset=opset, output_path=os.path.join(out_dir, "model.onnx"))
    np.savez(os.path.join(out_dir, "inputs.npz"), input=x)
    np.savez(os.path.join(out_dir, "expected.npz"), expected)
    print(f"tf2onnx {tf2onnx.__version__} tensorflow {tf.__version__} opset {opset}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
