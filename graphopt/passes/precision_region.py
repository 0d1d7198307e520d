"""The CNN region the precision decision keeps in float32 (graphopt.passes.precision_decision):
its seeds (2-D convolutions) and the ops that may stay float32 with them. A module of its own
because the conversion (graphopt.passes.precision) reads it too."""

from __future__ import annotations

import onnx_ir as ir

from graphopt.ops.registry import has_fact
from graphopt.passes._common import ONNX_DOMAINS
from graphopt.passes.precision_plan import _is_heavy

__all__ = ["region_seed", "joins_region"]

#: Heavy ops that belong to a CNN: they stay float32 with the convolutions that feed them.
_CONV_FAMILY = frozenset({
    ("", "Conv"), ("", "ConvTranspose"), ("", "BatchNormalization"), ("", "InstanceNormalization"),
    ("", "GroupNormalization"), ("graphopt", "FusedConv"), ("graphopt", "GroupNorm"),
    ("com.microsoft", "FusedConv"), ("com.microsoft", "GroupNorm"), ("com.microsoft", "NhwcConv"),
})
#: Heavy ops that are a CNN's classifier head when they read a rank-2 tensor.
_HEADS = frozenset({("", "MatMul"), ("", "Gemm"), ("graphopt", "GemmActivation"), ("com.microsoft", "FusedMatMul")})

def _domain(node: ir.Node) -> str:
    return "" if node.domain in ONNX_DOMAINS else node.domain


def _rank(value: ir.Value | None) -> int | None:
    return len(value.shape) if value is not None and value.shape is not None else None


def region_seed(node: ir.Node) -> bool:
    """A 2-D convolution (the ops the decision is about)."""
    return node.op_type == "Conv" and node.domain in ONNX_DOMAINS and bool(node.inputs) and _rank(node.inputs[0]) == 4


def joins_region(node: ir.Node) -> bool:
    """May this node stay float32 with the convolutions (when every float value it reads is float32)?"""
    key = (_domain(node), node.op_type)
    if key in _CONV_FAMILY:
        return True
    if key in _HEADS:
        rank = _rank(node.inputs[0]) if node.inputs else None
        return rank is not None and rank <= 2
    # fused activations (QuickGelu, Gelu, FastGelu, BiasGelu) are no heavier than the ops they replace
    fused_activation = key[0] not in ONNX_DOMAINS and (has_fact(*key, "elementwise") or has_fact(*key, "same_shape"))
    return fused_activation or not _is_heavy(*key)
