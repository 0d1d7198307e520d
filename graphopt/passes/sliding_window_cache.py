"""A sliding-window cache cropped inside the graph, proven idle: Mistral as transformers exports it by default.

transformers' DynamicSlidingWindowLayer keeps window - 1 tokens. A dynamo export of a sliding-window decoder
with its cache as inputs therefore (1) crops each past input, Slice(past, -(w - 1) :, axis 2), before the
Concat with the new k / v, (2) builds the mask's key positions as Range(0, past + seq) + Max(0, past - (w - 1))
(the layer's kv_offset) over past + seq columns, and (3) crops each present, Slice(Concat, -(w - 1) :). The
attention's scores, [.., seq, min(past, w - 1) + seq], meet the mask's [.., seq, past + seq] in one
broadcasting Add: the two lengths are equal only where past <= w - 1 (neither is 1 unless both are), so the
export runs only on such a past, and there the crop of the past keeps every token and the offset is 0.

This pass proves that from the graph (the symbolic dims of one broadcasting node's inputs differ by exactly
Max(0, past - (w - 1)), the crops' start and the symbol `past` the same) and then writes what the export
computes on every input it accepts: the past uncropped and the offset 0. The mask becomes the
full-cache form that FuseGroupQueryAttention turns into local_window_size = w; the present crops stay
(Slice of GroupQueryAttention's present), so the model keeps the export's inputs, outputs and values: its own
presents (w - 1 tokens) fed back as the next past give the same outputs step after step, also past the window.
A past longer than w - 1, which the export refuses, now runs (attention over the whole past, the window in
the op).

Not a shared buffer: the export counts the query's rotary position from the past input's length, which its
own cropped presents keep at w - 1, while a buffer of every token would rotate at absolute positions
(graphopt.passes.kv_buffer refuses: the present outputs are Slices, not GroupQueryAttention's).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt._lazy_sympy import sympy
from graphopt.ir.symbolic import SymbolicShapes, static_int
from graphopt.ops import registry
from graphopt.passes._common import record

__all__ = ["uncrop_sliding_window_cache"]

_BIG = 2**31 - 1  # an end at or beyond this is "to the end"


def _crop(view: Any, node: ir.Node, graph_inputs: set[int]) -> int | None:
    """c where node is Slice(past, [-c], [end], [2 or -2], [1]) of a 4-D graph input read only by one Concat on the
    sequence axis (the crop of transformers' sliding-window layer), else None."""
    if view.op_key(node) != ("", "Slice"):
        return None
    ins = view.inputs(node)
    if len(ins) < 4 or ins[0] is None or id(ins[0]) not in graph_inputs or view.shape(ins[0]) is None or len(view.shape(ins[0])) != 4:
        return None
    arrays = [view.const_array(x) if x is not None else None for x in ins[1:4]]
    arrays.append(view.const_array(ins[4]) if len(ins) > 4 and ins[4] is not None else np.array([1]))
    if any(a is None or a.size != 1 for a in arrays):
        return None
    start, end, axis, step = (int(a.reshape(-1)[0]) for a in arrays if a is not None)
    if axis not in (2, -2) or step != 1 or end < _BIG:
        return None
    users = view.users(view.outputs(node)[0])
    if start >= 0 or len(users) != 1 or view.op_key(users[0]) != ("", "Concat") or view.attr(users[0], "axis") not in (2, -2):
        return None
    return -start


def _kept_past(sym: SymbolicShapes, crops: list[ir.Node], view: Any) -> tuple[Any, int] | None:
    """(past, c): every crop keeps the last c of a past of one symbolic length `past`."""
    found = set()
    for node in crops:
        dims = sym.dims(view.inputs(node)[0])
        if dims is None:
            return None
        found.add(dims[2])
    return (found.pop(), _crop_width(view, crops[0])) if len(found) == 1 and static_int(next(iter(found))) is None else None


def _crop_width(view: Any, node: ir.Node) -> int:
    return -int(view.const_array(view.inputs(node)[1]).reshape(-1)[0])


def _refusing_node(view: Any, sym: SymbolicShapes, past: Any, width: int) -> ir.Node | None:
    """A broadcasting node whose inputs' dims differ on one axis by exactly Max(0, past - width), the larger one
    past + r with r a positive expression (seq): the cropped length min(past, width) + r against the full past + r.
    Either is 1 only where past = 0 (then they are equal), so the node runs only where past <= width."""
    excess = sympy.Max(0, past - width)
    broadcasting = registry.names_with("broadcasting")  # an unequal pair of dims, neither 1, fails at run time
    for node in view.iter_all_nodes():
        if node.domain not in ("", "ai.onnx") or node.op_type not in broadcasting:
            continue
        dims = [sym.dims(x) if x is not None else None for x in view.inputs(node)]
        for i, a in enumerate(dims):
            for b in dims[i + 1:]:
                if a is None or b is None or len(a) != len(b):
                    continue
                for x, y in zip(a, b, strict=True):
                    if x == y or static_int(x) is not None or static_int(y) is not None:
                        continue
                    diff = sympy.simplify(x - y)
                    larger = x if sympy.simplify(diff - excess) == 0 else y if sympy.simplify(diff + excess) == 0 else None
                    if larger is not None and sympy.simplify(larger - past).is_positive:
                        return node
    return None


def _offsets(view: Any, sym: SymbolicShapes, past: Any, width: int) -> list[ir.Value]:
    """The values that hold Max(0, past - width) (the sliding-window layer's kv_offset), computed by a Max node."""
    excess = sympy.Max(0, past - width)
    found = []
    for node in view.iter_all_nodes():
        if view.op_key(node) != ("", "Max"):
            continue
        value = view.outputs(node)[0]
        contents = sym.tensor(value)
        if contents is not None and len(contents) == 1 and sympy.simplify(contents[0] - excess) == 0:
            found.append(value)
    return found


SHARED_BUFFER_REFUSAL = (
    "not uncropped for a shared KV buffer: the export rotates the new tokens at the past input's length, which its own "
    "presents (the last {w} tokens, Slices of the cache) keep at {w}, while a buffer of every token would rotate them at "
    "their absolute positions and be no Slice of window - 1 tokens; --kv-buffer growing lowers it (GroupQueryAttention "
    "with local_window_size {w1}), or export with a cache of every token")


def uncrop_sliding_window_cache(view: Any, notes: list[str] | None = None, stats: Any = None, shared: bool = False) -> int:
    """Remove the in-graph crop of a sliding-window cache where the graph proves it keeps every token (see the
    module docstring); returns the number of crops and offsets replaced. `notes` gets why not, where crops are
    found but not proven idle, or `shared` (a shared KV buffer asked for: never equal, see SHARED_BUFFER_REFUSAL)."""
    started = time.perf_counter()
    model: ir.Model = view.model
    graph_inputs = set(map(id, model.graph.inputs))
    crops = [n for n in model.graph if _crop(view, n, graph_inputs) is not None]
    if not crops:
        record(stats, 0, started)
        return 0
    sym = SymbolicShapes(view)
    kept = _kept_past(sym, crops, view)
    widths = {_crop_width(view, n) for n in crops}
    problem = None
    if kept is None or len(widths) != 1:
        problem = f"the cropped pasts have no one symbolic length, or differ in the tokens kept ({sorted(widths)})"
    else:
        past, width = kept
        refusing = _refusing_node(view, sym, past, width)
        offsets = _offsets(view, sym, past, width)
        if refusing is None:
            problem = (f"no broadcasting node meets the cropped length min({past}, {width}) + seq with the full {past} + seq: "
                       f"the crop of the past to its last {width} tokens is not proven idle")
        elif shared:
            problem = SHARED_BUFFER_REFUSAL.format(w=width, w1=width + 1)
    if problem is not None:
        if notes is not None:
            notes.append(f"sliding-window cache crop ({len(crops)} Slices of the past inputs) kept: {problem}")
        record(stats, 0, started)
        return 0
    zero = {}
    replaced = 0
    for value in offsets:  # the kv_offset is 0 wherever the export runs (left where its shape is not known: still 0 then)
        dims = sym.dims(value)
        if dims is None or any(static_int(d) is None for d in dims):
            continue
        dtype = value.dtype.numpy() if value.dtype is not None else np.int64
        shape = tuple(int(d) for d in dims)
        key = (np.dtype(dtype).str, shape)
        if key not in zero:
            zero[key] = ir.Value(name=view.fresh_name("sliding_window_offset_zero"), const_value=ir.tensor(np.zeros(shape, dtype)),
                                 shape=ir.Shape(shape), type=ir.TensorType(ir.DataType.from_numpy(np.dtype(dtype))))
            model.graph.register_initializer(zero[key])
        value.replace_all_uses_with(zero[key])
        replaced += 1
    for node in crops:  # the crop of the past keeps every token wherever the export runs
        view.outputs(node)[0].replace_all_uses_with(view.inputs(node)[0])
    outputs = set(map(id, model.graph.outputs))
    for node in model.graph:  # the dims recorded for the cropped lengths (Min / Max of past) are re-derived
        for out in node.outputs:
            if id(out) not in outputs and out.shape is not None and any(not isinstance(d, int) and d.value is not None and ("Max" in d.value or "Min" in d.value)
                                             for d in out.shape):
                out.shape = None
    changes = len(crops) + replaced
    record(stats, changes, started)
    return changes
