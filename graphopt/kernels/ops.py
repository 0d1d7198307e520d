"""Registers graphopt's fused kernels as torch custom ops, ``torch.ops.graphopt.*``.

Each op is a ``torch.library.triton_op``: its implementation launches the Triton kernel
through ``wrap_triton`` on CUDA tensors (so that torch.compile sees the kernel itself),
and runs the plain-torch reference anywhere else. The reference is also registered as
the op's CPU kernel, and a fake kernel gives the output shapes for tracing (symbolic
shapes included).

Importing this module (``import graphopt.kernels``) registers the ops once per process;
it needs torch, not triton.
"""

import torch
from torch import Tensor
from torch.library import custom_op, triton_op

from graphopt.kernels._triton import use_triton
from graphopt.kernels.attention import attention_fake, attention_reference, attention_triton
from graphopt.kernels.conv import conv_relu_cudnn, conv_relu_fake, conv_relu_reference, uses_cudnn
from graphopt.kernels.decode_attention import decode_attention_fake, decode_attention_reference, decode_attention_triton
from graphopt.kernels.gates import gate_fake, geglu_reference, geglu_triton, swiglu_reference, swiglu_triton
from graphopt.kernels.gemv import gemv_linear_fake, gemv_linear_reference, gemv_linear_triton
from graphopt.kernels.matmul import linear_act_fake, linear_act_reference, linear_act_triton
from graphopt.kernels.norms import layer_norm_reference, layer_norm_triton, norm_fake, rms_norm_reference, rms_norm_triton
from graphopt.kernels.rotary import rotary_fake, rotary_reference, rotary_triton
from graphopt.kernels.wq_matmul import wq_linear_fake, wq_linear_reference, wq_linear_triton

__all__ = ["attention", "decode_attention", "linear_act", "layer_norm", "rms_norm", "swiglu", "geglu", "rotary", "conv_relu", "wq_linear",
           "gemv_linear"]


@triton_op("graphopt::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v, as SDPA with enable_gqa (see graphopt.kernels.attention)."""
    if use_triton(q, attn_mask):
        return attention_triton(q, k, v, attn_mask, is_causal, scale)
    return attention_reference(q, k, v, attn_mask, is_causal, scale)


@triton_op("graphopt::decode_attention", mutates_args=())
def decode_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, scale: float | None = None,
                     key_positions: Tensor | None = None, query_position: Tensor | None = None, window: int = -1) -> Tensor:
    """graphopt::attention for one query position over a KV cache, split-K, reading only the rows between
    key_positions / query_position / window where given (see graphopt.kernels.decode_attention)."""
    if use_triton(q, attn_mask):
        return decode_attention_triton(q, k, v, attn_mask, scale, key_positions, query_position, window)
    return decode_attention_reference(q, k, v, attn_mask, scale, key_positions, query_position, window)


@triton_op("graphopt::linear_act", mutates_args=())
def linear_act(x: Tensor, w: Tensor, bias: Tensor | None = None, activation: str = "none") -> Tensor:
    """activation(x @ w + bias), w [K, N] (see graphopt.kernels.matmul)."""
    if use_triton(x, bias):
        return linear_act_triton(x, w, bias, activation)
    return linear_act_reference(x, w, bias, activation)


@triton_op("graphopt::layer_norm", mutates_args=())
def layer_norm(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """(LayerNorm(x + residual), x + residual) (see graphopt.kernels.norms)."""
    if use_triton(x, weight, bias):
        return layer_norm_triton(x, residual, weight, bias, eps)
    return layer_norm_reference(x, residual, weight, bias, eps)


@triton_op("graphopt::rms_norm", mutates_args=())
def rms_norm(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + residual), x + residual) (see graphopt.kernels.norms)."""
    if use_triton(x, weight):
        return rms_norm_triton(x, residual, weight, eps)
    return rms_norm_reference(x, residual, weight, eps)


@triton_op("graphopt::swiglu", mutates_args=())
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up (see graphopt.kernels.gates)."""
    if use_triton(gate):
        return swiglu_triton(gate, up)
    return swiglu_reference(gate, up)


@triton_op("graphopt::geglu", mutates_args=())
def geglu(gate: Tensor, up: Tensor, approximate: bool = False) -> Tensor:
    """gelu(gate) * up, tanh form when approximate (see graphopt.kernels.gates)."""
    if use_triton(gate):
        return geglu_triton(gate, up, approximate)
    return geglu_reference(gate, up, approximate)


@triton_op("graphopt::rotary", mutates_args=())
def rotary(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """x * cos + rotate(x) * sin on the first cos.shape[-1] dims (see graphopt.kernels.rotary)."""
    if use_triton(x, cos, sin):
        return rotary_triton(x, cos, sin, interleaved)
    return rotary_reference(x, cos, sin, interleaved)


@triton_op("graphopt::wq_linear", mutates_args=())
def wq_linear(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, block_size: int,
              k: int) -> Tensor:
    """x @ dequant(W) + bias, W int4/int8 in blocks of K (see graphopt.kernels.wq_matmul)."""
    if use_triton(x, scales, bias):
        return wq_linear_triton(x, packed, scales, zeros, bias, bits, block_size, k)
    return wq_linear_reference(x, packed, scales, zeros, bias, bits, block_size, k)


@triton_op("graphopt::gemv_linear", mutates_args=())
def gemv_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight^T + bias for few rows of x (decode), weight [N, K] as nn.Linear's (see graphopt.kernels.gemv)."""
    if x.dtype in (torch.float16, torch.bfloat16) and use_triton(x, weight, bias):
        return gemv_linear_triton(x, weight, bias)
    return gemv_linear_reference(x, weight, bias)


@custom_op("graphopt::conv_relu", mutates_args=())
def conv_relu(x: Tensor, w: Tensor, bias: Tensor | None, z: Tensor | None, stride: list[int], padding: list[int],
              dilation: list[int], groups: int) -> Tensor:
    """relu(conv2d(x, w, bias) + z): cuDNN's fused kernel on CUDA (see graphopt.kernels.conv)."""
    if uses_cudnn(x):
        return conv_relu_cudnn(x, w, bias, z, stride, padding, dilation, groups)
    return conv_relu_reference(x, w, bias, z, stride, padding, dilation, groups)


conv_relu.register_fake(conv_relu_fake)


# CPU: the reference, without the dispatch above.
attention.register_kernel("cpu")(attention_reference)
decode_attention.register_kernel("cpu")(decode_attention_reference)
linear_act.register_kernel("cpu")(linear_act_reference)
layer_norm.register_kernel("cpu")(layer_norm_reference)
rms_norm.register_kernel("cpu")(rms_norm_reference)
swiglu.register_kernel("cpu")(swiglu_reference)
geglu.register_kernel("cpu")(geglu_reference)
rotary.register_kernel("cpu")(rotary_reference)
wq_linear.register_kernel("cpu")(wq_linear_reference)
gemv_linear.register_kernel("cpu")(gemv_linear_reference)


# Fake kernels: output shapes only; triton_op would otherwise trace the implementation.
attention.register_fake(attention_fake)
decode_attention.register_fake(decode_attention_fake)
linear_act.register_fake(linear_act_fake)
swiglu.register_fake(lambda gate, up: gate_fake("swiglu", gate, up))
geglu.register_fake(lambda gate, up, approximate=False: gate_fake("geglu", gate, up))
rotary.register_fake(rotary_fake)
wq_linear.register_fake(wq_linear_fake)
gemv_linear.register_fake(gemv_linear_fake)


@layer_norm.register_fake
def _layer_norm_fake(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    return norm_fake("layer_norm", x, residual, weight, bias)


@rms_norm.register_fake
def _rms_norm_fake(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return norm_fake("rms_norm", x, residual, weight, None)
