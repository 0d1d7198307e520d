"""The cache rows a decode step's boolean mask can show, proven from the FX graph (graphopt::decode_attention's key range).

transformers builds a static cache's decode mask from positions: ``kv_pos <= q_pos`` (causal) And-ed with
``kv_pos > q_pos - w`` (a sliding window of w keys: Mistral, Gemma-2's local layers) and whatever else (padding),
where kv_pos is ``arange(T) + offset`` (offset 0 for a full cache; a StaticSlidingWindowLayer's rolled rows start
at max(position - w + 1, 0)) moved onto the last axis, and q_pos one position. Where the mask is such an And
(through expand), the rows outside [q_pos - w + 1, q_pos] are hidden whatever the other terms say, so the
split-K kernel may skip them: it is handed kv_pos's tensor (row r at its first element + r), q_pos and w. Nothing is
read from the model's config: a mask of another form gives no range (and a reason), and the kernel reads every row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx as fx

__all__ = ["KeyRange", "key_range"]

aten = torch.ops.aten
_AND = (aten.bitwise_and.Tensor, aten.logical_and.default)
_MAX_DEPTH = 16


@dataclass(frozen=True)
class KeyRange:
    key_positions: fx.Node  # T integers (any shape of 1s but the last): arange(T) + offset, row r's position
    query_position: fx.Node  # one integer: the query's position
    window: int  # w > 0: rows at or before query - w hidden too; -1: the causal bound alone


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _and_terms(node: Any, depth: int = 0) -> list[Any]:
    if isinstance(node, fx.Node) and node.op == "call_function" and depth < _MAX_DEPTH:
        if node.target in _AND:
            return [t for arg in node.args[:2] for t in _and_terms(arg, depth + 1)]
        if node.target is aten.expand.default:
            return _and_terms(node.args[0], depth + 1)
    return [node]


def _strip_unsqueezes(node: Any) -> Any:
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in (aten.unsqueeze.default, aten.view.default,
                                                                                        aten.reshape.default):
        node = node.args[0]
    return node


def _is_arange(b: Any, node: Any, length: int) -> bool:
    array = b.const_array(node)
    if array is None or array.dtype.kind not in "iu" or array.size != length:
        return False
    flat = array.reshape(-1)
    return bool(np.array_equal(flat, flat[0] + np.arange(length)))


def _scalar(node: Any) -> bool:
    """An offset added to every row alike: a Python / symbolic int, or a one-element integer tensor."""
    if isinstance(node, (int, torch.SymInt)):
        return True
    val = _val(node)
    return isinstance(val, (int, torch.SymInt)) or (isinstance(val, torch.Tensor) and val.numel() == 1 and not val.dtype.is_floating_point)


def _key_positions(b: Any, node: Any, length: int) -> fx.Node | None:
    """The [T] tensor under a (broadcast) kv_pos on the last axis, when it is arange(T) + a scalar offset."""
    val = _val(node)
    if not isinstance(val, torch.Tensor) or val.dim() == 0 or val.shape[-1] != length or any(d != 1 for d in val.shape[:-1]):
        return None
    if isinstance(node, fx.Node) and _is_arange(b, node, length):  # folded (a full cache's: offset 0), kept in its shape
        return node
    base = _strip_unsqueezes(node)
    base_val = _val(base)
    if not isinstance(base, fx.Node) or not isinstance(base_val, torch.Tensor) or base_val.dim() != 1:
        return None
    if _is_arange(b, base, length):
        return base
    if base.op == "call_function" and base.target is aten.add.Tensor and len(base.args) == 2:
        for rows, offset in (base.args, base.args[::-1]):
            if _is_arange(b, rows, length) and _scalar(offset):
                return base
    return None


def _query_position(node: Any) -> fx.Node | None:
    val = _val(node)
    if not isinstance(node, fx.Node) or not isinstance(val, torch.Tensor) or val.numel() != 1 or val.dtype.is_floating_point:
        return None
    return node


def _bound(b: Any, term: Any, length: int) -> tuple[str, fx.Node, fx.Node, int] | None:
    """("causal", kv, q, -1) for kv_pos <= q_pos, ("window", kv, q, w) for kv_pos > q_pos - w (w a positive int)."""
    if not isinstance(term, fx.Node) or term.op != "call_function" or len(term.args) != 2:
        return None
    lhs, rhs = term.args
    if term.target in (aten.le.Tensor, aten.ge.Tensor):
        kv, q = (lhs, rhs) if term.target is aten.le.Tensor else (rhs, lhs)
        kind, width = "causal", -1
    elif term.target in (aten.gt.Tensor, aten.lt.Tensor):
        kv, bound = (lhs, rhs) if term.target is aten.gt.Tensor else (rhs, lhs)
        if not isinstance(bound, fx.Node) or bound.target not in (aten.sub.Tensor, aten.sub.Scalar) or len(bound.args) != 2:
            return None
        q, w = bound.args
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            return None
        kind, width = "window", w
    else:
        return None
    positions, query = _key_positions(b, kv, length), _query_position(q)
    if positions is None or query is None:
        return None
    return kind, positions, query, width


def key_range(b: Any, mask: Any, length: int) -> tuple[KeyRange | None, str]:
    """The key range a boolean decode mask over `length` cache rows proves, or (None, why not)."""
    if type(length) is not int:  # a cache that grows (symbolic length): no guard is added on it here
        return None, f"the cache length {length} is not static"
    if not isinstance(mask, fx.Node) or not isinstance(_val(mask), torch.Tensor) or _val(mask).dtype != torch.bool:
        return None, "the mask is not a boolean tensor computed in the graph"
    found = [bound for term in _and_terms(mask) if (bound := _bound(b, term, length)) is not None]
    causal = [(kv, q) for kind, kv, q, _ in found if kind == "causal"]
    if not causal:
        return None, "no kv_pos <= q_pos term (arange(T) + offset against one position) is And-ed into the mask"
    kv, q = causal[0]
    windows = [w for kind, kv2, q2, w in found if kind == "window" and kv2 is kv and q2 is q]
    return KeyRange(kv, q, min(windows) if windows else -1), ""
