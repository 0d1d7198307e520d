"""The regions the precision decisions keep in float32: the CNN region
(graphopt.passes.precision_decision; seeds: 2-D convolutions) and the recurrent region
(graphopt.passes.precision_recurrent; seeds: LSTM, GRU, RNN), and the ops that may stay float32
with their seeds. A module of its own because the conversion (graphopt.passes.precision) reads it too."""

from __future__ import annotations

import onnx_ir as ir

from graphopt.ops.registry import has_fact
from graphopt.passes._common import ONNX_DOMAINS
from graphopt.passes.precision_plan import _is_heavy

__all__ = ["region_seed", "recurrent_seed", "RECURRENT_OPS", "joins_region"]

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


#: The recurrent ops (standard domain) the recurrent precision decision is about.
RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})


def recurrent_seed(node: ir.Node) -> bool:
    """An LSTM, GRU or RNN (the ops the recurrent precision decision is about)."""
    return node.op_type in RECURRENT_OPS and node.domain in ONNX_DOMAINS


def joins_region(node: ir.Node, *, convs: bool = True) -> bool:
    """May this node stay float32 with the region's seeds (when every float value it reads is
    float32)? `convs`: the convolution family joins too (the CNN region is kept; a recurrent
    region alone does not keep convolutions that the CNN decision converts)."""
    key = (_domain(node), node.op_type)
    if key in _CONV_FAMILY:
        return convs
    if key in _HEADS:
        rank = _rank(node.inputs[0]) if node.inputs else None
        return rank is not None and rank <= 2
    # fused activations (QuickGelu, Gelu, FastGelu, BiasGelu) are no heavier than the ops they replace
    fused_activation = key[0] not in ONNX_DOMAINS and (has_fact(*key, "elementwise") or has_fact(*key, "same_shape"))
    return fused_activation or not _is_heavy(*key)
