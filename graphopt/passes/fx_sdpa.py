"""Attention inputs with a dense last axis, as the fused SDPA kernels on a GPU need them.

On CUDA every fused scaled_dot_product_attention kernel (flash, memory-efficient, cuDNN)
requires query, key, value *and attn_mask* to have stride 1 on their last axis; otherwise
SDPA falls back to its math form: a float32 upcast of half-precision inputs, two batched
matmuls and a softmax, each attention a handful of kernels instead of one (torch's
sdp_utils_cpp.h, check_last_dim_stride_equals_1_dense: "GPU backends require attn_mask's
last dimension to have stride 1 while the CPU does not"). The CPU kernels do not care, so
nothing on a CPU shows it.

graphopt can hand SDPA such a mask where dynamo's graph had a dense one: drop_clones removes
the `.contiguous()` a model wrote, and constant folding then freezes the permuted view into
a constant with the view's strides (T5's relative position bias: embedding, permute to
[1, heads, q, k], `.contiguous()`: last-axis stride = heads after folding, 12 T5-base
attentions in the math form on an H100, issue 15). This pass, run last, makes each such
input dense again: a constant is replaced by a contiguous copy (made once, at compile time),
any other value gets a `clone(memory_format=contiguous_format)`, which is what the model's
own `.contiguous()` was.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from graphopt.passes.fx_passes import NewConstant, _fake_call, attr_tensor

__all__ = ["dense_attention_inputs", "last_axis_dense"]

aten = torch.ops.aten

#: SDPA's tensor inputs a fused GPU kernel reads with a dense last axis: (position, keyword).
_DENSE_INPUTS = ((0, "query"), (1, "key"), (2, "value"), (3, "attn_mask"))


def last_axis_dense(val: Any) -> bool:
    """Whether a tensor (a node's meta["val"]) has stride 1 on its last axis, or is no tensor
    this pass can do anything for (0-d, or a stride not known at compile time)."""
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return True
    stride = val.stride(-1)
    if not isinstance(stride, int):  # symbolic: leave it (no guard on a stride)
        return True
    return stride == 1


def _input(node: fx.Node, position: int, name: str) -> Any:
    return node.args[position] if position < len(node.args) else node.kwargs.get(name)


def _set_input(node: fx.Node, position: int, name: str, value: fx.Node) -> None:
    if position < len(node.args):
        args = list(node.args)
        args[position] = value
        node.args = tuple(args)
    else:
        node.kwargs = {**node.kwargs, name: value}


def _dense(gm: fx.GraphModule, value: fx.Node, new_constant: NewConstant, fake_mode: Any) -> fx.Node:
    graph = gm.graph
    if value.op == "get_attr":
        tensor = attr_tensor(gm, str(value.target))
        if isinstance(tensor, torch.Tensor):
            with graph.inserting_before(value):
                return new_constant(tensor.contiguous(), f"{value.name.removeprefix('_go_')}_dense")
    with graph.inserting_after(value):
        copy = graph.call_function(aten.clone.default, (value,), {"memory_format": torch.contiguous_format})
    copy.meta["val"] = _fake_call(fake_mode, aten.clone.default, (value.meta["val"],), {"memory_format": torch.contiguous_format})
    return copy


def dense_attention_inputs(gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any) -> int:
    """Give every SDPA input whose last axis is strided a dense copy (one per value, shared by
    the attentions that read it); returns how many values were made dense."""
    made: dict[fx.Node, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default:
            continue
        for position, name in _DENSE_INPUTS:
            value = _input(node, position, name)
            if not isinstance(value, fx.Node) or last_axis_dense(value.meta.get("val")):
                continue
            if value not in made:
                made[value] = _dense(gm, value, new_constant, fake_mode)
            _set_input(node, position, name, made[value])
    return len(made)
