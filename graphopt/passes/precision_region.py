"""The regions the precision decisions keep in float32: the CNN region
(graphopt.passes.precision_decision; seeds: 2-D convolutions) and the recurrent region
(graphopt.passes.precision_recurrent; seeds: LSTM, GRU, RNN), and the ops that may stay float32
with their seeds. A module of its own because the conversion (graphopt.passes.precision) reads it too."""

from __future__ import annotations

import onnx_ir as ir

from graphopt.ops.registry import has_fact
from graphopt.passes._common import ONNX_DOMAINS
from graphopt.passes.precision_plan import _is_heavy

__all__ = ["region_seed", "recurrent_seed", "joins_region", "tail_heads"]

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


def recurrent_seed(node: ir.Node) -> bool:
    """An LSTM, GRU or RNN (registry fact `recurrent`: the ops the recurrent precision decision is about)."""
    return node.domain in ONNX_DOMAINS and has_fact("", node.op_type, "recurrent")


def joins_region(node: ir.Node, *, convs: bool = True, tails: frozenset[int] = frozenset()) -> bool:
    """May this node stay float32 with the region's seeds (when every float value it reads is
    float32)? `convs`: the convolution family joins too (the CNN region is kept; a recurrent
    region alone does not keep convolutions that the CNN decision converts). `tails`: the ids
    of the graph's tail heads (`tail_heads`), which join whatever their rank."""
    key = (_domain(node), node.op_type)
    if key in _CONV_FAMILY:
        return convs
    if key in _HEADS:
        rank = _rank(node.inputs[0]) if node.inputs else None
        return (rank is not None and rank <= 2) or id(node) in tails
    return _fused_activation(key) or not _is_heavy(*key)


def _fused_activation(key: tuple[str, str]) -> bool:
    # fused activations (QuickGelu, Gelu, FastGelu, BiasGelu) are no heavier than the ops they replace
    return key[0] not in ONNX_DOMAINS and (has_fact(*key, "elementwise") or has_fact(*key, "same_shape"))


def tail_heads(graph: ir.Graph) -> frozenset[int]:
    """The ids of the graph's tail heads: MatMul/Gemm with a constant weight after which no heavy
    op runs (only light ops up to the graph's outputs), whatever the rank they read: a CRNN's
    per-step classifier. Converted alone it would cost two Casts around one small product."""
    heavy_after: dict[int, bool] = {}
    tails: set[int] = set()
    for node in reversed(list(graph)):
        after = False
        for value in node.outputs:
            for use in value.uses():
                reader = use.node
                if reader.graph is not graph:
                    after = after or reader.graph is not None  # read inside a subgraph: assume the worst
                    continue
                key = (_domain(reader), reader.op_type)
                after = after or (_is_heavy(*key) and not _fused_activation(key)) or heavy_after.get(id(reader), True)
        heavy_after[id(node)] = after
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        if (_domain(node), node.op_type) in _HEADS and not after and weight is not None and _constant(weight):
            tails.add(id(node))
    return frozenset(tails)


def _constant(value: ir.Value) -> bool:
    if value.const_value is not None and not value.is_graph_input():
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ONNX_DOMAINS
