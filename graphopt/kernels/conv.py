"""conv_relu: ReLU(conv2d(x, w, bias) + z), one kernel on CUDA through cuDNN's fused
convolution-bias-(add-)activation (``aten.cudnn_convolution_relu`` / ``_add_relu``).

Not a Triton kernel: cuDNN's fused conv beats a convolution followed by even a fused
pointwise kernel (what inductor emits) on every convolution of ResNet-50 followed by a
ReLU, in fp16 channels-last on an H200: 1.12 ms against 1.82 ms of GPU time for those 49
convolutions (benchmarks/torch_op_choices.py, "conv"). It is wrapped as a custom op, not
called as the aten op itself, because those aten ops have no CPU or meta kernel: the
wrapper gives tracing a fake kernel and other devices the plain-torch reference.

The output's memory format is decided by the input's (channels-last in, channels-last
out) in the fake kernel and enforced on the real one, so tracing and running agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

aten = torch.ops.aten


def output_format(x: Tensor) -> torch.memory_format:
    """channels-last when x is a 4-D tensor stored channels-last (and not also plain contiguous)."""
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def conv_relu_reference(x: Tensor, w: Tensor, bias: Tensor | None, z: Tensor | None, stride: list[int], padding: list[int],
                        dilation: list[int], groups: int) -> Tensor:
    y = F.conv2d(x, w, bias, stride, padding, dilation, groups)
    if z is not None:
        y = y + z
    return torch.relu(y).contiguous(memory_format=output_format(x))


def conv_relu_cudnn(x: Tensor, w: Tensor, bias: Tensor | None, z: Tensor | None, stride: list[int], padding: list[int],
                    dilation: list[int], groups: int) -> Tensor:
    if z is None:
        out = aten.cudnn_convolution_relu(x, w, bias, stride, padding, dilation, groups)
    else:
        out = aten.cudnn_convolution_add_relu(x, w, z, 1.0, bias, stride, padding, dilation, groups)
    wanted = output_format(x)
    return out if out.is_contiguous(memory_format=wanted) else out.contiguous(memory_format=wanted)


def conv_relu_fake(x: Tensor, w: Tensor, bias: Tensor | None, z: Tensor | None, stride: list[int], padding: list[int],
                   dilation: list[int], groups: int) -> Tensor:
    shape = [x.shape[0], w.shape[0]]
    for i in range(2):
        extent = dilation[i] * (w.shape[2 + i] - 1) + 1
        shape.append((x.shape[2 + i] + 2 * padding[i] - extent) // stride[i] + 1)
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=output_format(x))


def uses_cudnn(x: Tensor) -> bool:
    return x.is_cuda and torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
