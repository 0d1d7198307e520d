"""Grouped-query attention without the copies: repeat_kv removed in front of an attention
that reads key/value heads in groups itself.

LLaMA-style models (transformers' `repeat_kv`) repeat each key/value head n times before
SDPA: ``k[:, :, None].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)``, a copy of k and v
per layer. SDPA with ``enable_gqa=True`` (and graphopt::attention, always) reads query
head h against key/value head h // n, the same meaning, without the copies: flash
attention takes grouped heads natively on CUDA.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

__all__ = ["unrepeat_kv", "repeated_kv_source"]

aten = torch.ops.aten


def _graphopt_attention() -> Any:
    try:
        return torch.ops.graphopt.attention.default
    except (AttributeError, RuntimeError):
        return None


def _shape(node: Any) -> list[Any] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return list(val.shape) if isinstance(val, torch.Tensor) else None


def _same(a: Any, b: Any) -> bool:
    """Dims known equal: equal ints, or the same symbolic expression."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return not isinstance(a, int) and not isinstance(b, int) and str(a) == str(b)


def _skip_full_slices(node: Any) -> Any:
    """Through aten.slice nodes that keep the whole axis (x[:, :, None] traces to them)."""
    while isinstance(node, fx.Node) and node.target is aten.slice.Tensor:
        src = node.args[0]
        dim, start, end, step = (list(node.args[1:]) + [0, None, None, 1][len(node.args) - 1:])[:4]
        if _shape(src) != _shape(node) or start not in (0, None) or step != 1:
            break
        node = src
    return node


def repeated_kv_source(node: Any) -> tuple[fx.Node, int] | None:
    """(k, n) where `node` is reshape(expand(unsqueeze(k, 2), [b, kv, n, s, d]), [b, kv * n, s, d]); else None."""
    if not isinstance(node, fx.Node) or node.target not in (aten.reshape.default, aten.view.default, aten._unsafe_view.default):
        return None
    expanded = _skip_full_slices(node.args[0])
    if not isinstance(expanded, fx.Node) or expanded.target is not aten.expand.default:
        return None
    unsqueezed = _skip_full_slices(expanded.args[0])
    if not isinstance(unsqueezed, fx.Node) or unsqueezed.target is not aten.unsqueeze.default or unsqueezed.args[1] not in (2, -3):
        return None
    source = _skip_full_slices(unsqueezed.args[0])
    k, e, out = _shape(source), _shape(expanded), _shape(node)
    if k is None or e is None or out is None or len(k) != 4 or len(e) != 5 or len(out) != 4:
        return None
    b, kv, s, d = k
    n = e[2]
    if not (isinstance(kv, int) and isinstance(n, int) and isinstance(out[1], int) and out[1] == kv * n):
        return None
    if not all(_same(x, y) for x, y in ((e[0], b), (e[1], kv), (e[3], s), (e[4], d), (out[0], b), (out[2], s), (out[3], d))):
        return None
    return source, n


def unrepeat_kv(gm: fx.GraphModule) -> int:
    """SDPA / graphopt::attention on repeat_kv'd keys and values -> on the key/value heads
    themselves (SDPA with enable_gqa=True). Returns how many attentions changed."""
    changed = 0
    custom = _graphopt_attention()
    for node in list(gm.graph.nodes):
        is_sdpa = node.target is aten.scaled_dot_product_attention.default
        if node.op != "call_function" or not (is_sdpa or (custom is not None and node.target is custom)):
            continue
        if len(node.args) < 3:
            continue
        k, v = repeated_kv_source(node.args[1]), repeated_kv_source(node.args[2])
        if k is None or v is None or k[1] != v[1] or k[1] == 1:
            continue
        node.args = (node.args[0], k[0], v[0], *node.args[3:])
        if is_sdpa:
            node.kwargs = {**node.kwargs, "enable_gqa": True}
        changed += 1
    return changed
