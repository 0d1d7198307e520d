"""Low-precision weights: block-wise quantization shared by the ONNX and torch paths."""
