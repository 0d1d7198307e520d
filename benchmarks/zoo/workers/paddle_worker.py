"""Build one zoo model with PaddlePaddle and convert it with paddle2onnx.

Runs in the paddle2onnx virtual environment (see benchmarks/zoo-requirements.txt):
``python paddle_worker.py NAME OUT_DIR``. Writes OUT_DIR/model.onnx, inputs.npz and
expected.npz (Paddle's outputs, for the zoo's check)."""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import paddle
import paddle2onnx
from paddle import nn


def mobilenetv3() -> tuple[nn.Layer, list[int]]:
    return paddle.vision.models.mobilenet_v3_small(scale=0.5, num_classes=16), [1, 3, 128, 128]


class SmallResNet(nn.Layer):
    """paddle.vision's ResNet-18 layout (its BasicBlock, a 1x1 Conv+BN downsample) at a
    quarter of the width: paddle.vision's ResNet fixes the widths at 64..512."""

    def __init__(self) -> None:
        super().__init__()
        from paddle.vision.models.resnet import BasicBlock

        self.stem = nn.Sequential(nn.Conv2D(3, 16, 7, stride=2, padding=3, bias_attr=False), nn.BatchNorm2D(16), nn.ReLU(),
                                  nn.MaxPool2D(3, stride=2, padding=1))
        blocks, c = [], 16
        for out, stride in ((16, 1), (24, 2), (48, 2), (96, 2)):
            down = None if (stride == 1 and c == out) else nn.Sequential(nn.Conv2D(c, out, 1, stride=stride, bias_attr=False), nn.BatchNorm2D(out))
            blocks += [BasicBlock(c, out, stride, down), BasicBlock(out, out)]
            c = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, 16)

    def forward(self, x):
        h = nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
        return self.fc(paddle.flatten(h, 1))


def resnet() -> tuple[nn.Layer, list[int]]:
    return SmallResNet(), [1, 3, 128, 128]


class CRNN(nn.Layer):
    """PaddleOCR's recognizer shape: a MobileNetV3-style conv backbone (Conv+BN+HardSwish,
    squeeze-excite with HardSigmoid), a 2-layer bidirectional LSTM neck, a CTC head."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Layer] = []
        c = 3
        for out, stride in ((16, (2, 2)), (32, (2, 1)), (48, (2, 1)), (64, (2, 1))):
            layers += [nn.Conv2D(c, out, 3, stride=stride, padding=1, bias_attr=False), nn.BatchNorm2D(out), nn.Hardswish()]
            c = out
        self.backbone = nn.Sequential(*layers)
        self.se_fc1, self.se_fc2 = nn.Conv2D(c, c // 4, 1), nn.Conv2D(c // 4, c, 1)
        self.pool = nn.MaxPool2D(kernel_size=(2, 1), stride=(2, 1))
        self.lstm = nn.LSTM(c, 48, num_layers=2, direction="bidirect")
        self.head = nn.Linear(96, 40)

    def forward(self, x):
        h = self.backbone(x)
        s = nn.functional.hardsigmoid(self.se_fc2(nn.functional.relu(self.se_fc1(nn.functional.adaptive_avg_pool2d(h, 1)))))
        h = self.pool(h * s)                     # [N, C, 1, W]
        h = paddle.transpose(paddle.squeeze(h, axis=2), [0, 2, 1])
        h, _ = self.lstm(h)
        return nn.functional.softmax(self.head(h), axis=-1)


def crnn() -> tuple[nn.Layer, list[int]]:
    return CRNN(), [1, 3, 32, 160]


MODELS = {"mobilenetv3": (mobilenetv3, 13), "resnet": (resnet, 13), "crnn": (crnn, 14)}


def _randomize_bn(model: nn.Layer) -> None:
    """BatchNorm statistics and every 1-D parameter (biases, scales) away from their initial 0 and 1."""
    rng = np.random.default_rng(14)
    for param in model.parameters():
        if len(param.shape) == 1:
            param.set_value(param.numpy() + (rng.standard_normal(param.shape) * 0.1).astype(np.float32))
    for layer in model.sublayers():
        if isinstance(layer, nn.BatchNorm2D):
            layer._mean.set_value((rng.standard_normal(layer._mean.shape) * 0.1).astype(np.float32))
            layer._variance.set_value((rng.random(layer._variance.shape) + 0.5).astype(np.float32))


def main(name: str, out_dir: str) -> None:
    paddle.seed(14)
    make, opset = MODELS[name]
    model, shape = make()
    _randomize_bn(model)
    model.eval()
    x = np.random.default_rng(14).standard_normal(shape).astype(np.float32)
    expected = model(paddle.to_tensor(x)).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "inference")
        paddle.jit.save(model, prefix, input_spec=[paddle.static.InputSpec(shape, "float32", "x")])
        program = prefix + (".json" if os.path.exists(prefix + ".json") else ".pdmodel")
        paddle2onnx.export(program, prefix + ".pdiparams", os.path.join(out_dir, "model.onnx"), opset_version=opset,
                           enable_onnx_checker=True)
    np.savez(os.path.join(out_dir, "inputs.npz"), x=x)
    np.savez(os.path.join(out_dir, "expected.npz"), expected)
    print(f"paddle2onnx {paddle2onnx.__version__} paddlepaddle {paddle.__version__} opset {opset}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
