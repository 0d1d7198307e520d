"""graphopt's fused kernels as torch custom ops: ``torch.ops.graphopt.*``.

Importing this package registers the ops (it needs torch; triton is optional):

    import graphopt.kernels
    out = torch.ops.graphopt.attention(q, k, v, mask, is_causal=False)

| op | computes | module |
|---|---|---|
| ``attention(q, k, v, attn_mask=None, is_causal=False, scale=None)`` | SDPA, MHA/GQA/MQA | ``attention`` |
| ``linear_act(x, w, bias=None, activation="none")`` | act(x @ w + bias) | ``matmul`` |
| ``layer_norm(x, residual, weight, bias, eps)`` | (LayerNorm(s), s), s = x + residual | ``norms`` |
| ``rms_norm(x, residual, weight, eps)`` | (RMSNorm(s), s) | ``norms`` |
| ``swiglu(gate, up)`` / ``geglu(gate, up, approximate=False)`` | act(gate) * up | ``gates`` |
| ``rotary(x, cos, sin, interleaved=False)`` | HF rotary embedding | ``rotary`` |
| ``wq_linear(x, packed, scales, zeros, bias, bits, block_size, k)`` | x @ dequant(W) + bias, int4/int8 weights | ``wq_matmul`` |
| ``gemv_linear(x, weight, bias=None)`` | x @ weight^T + bias, few rows of x (decode GEMV) | ``gemv`` |
| ``conv_relu(x, w, bias, z, stride, padding, dilation, groups)`` | relu(conv2d(x, w, bias) + z) | ``conv`` |

CUDA tensors run the Triton kernels (conv_relu: cuDNN's fused convolution); other devices
run the plain-torch reference.
"""

from graphopt.kernels import ops
from graphopt.kernels._triton import HAS_TRITON
from graphopt.kernels.matmul import ACTIVATIONS

__all__ = ["ops", "HAS_TRITON", "ACTIVATIONS"]
