"""Random inputs for a model: what --verify, the fp16 range check and --tune feed it.

Floats are standard normal; integers are small non-negative values that stay below the
size of any table they index (found by following the input to a Gather); inputs named
like masks are all ones; symbolic dimensions get one size per name (1 for batch-like
dimensions, 16 otherwise) unless pinned. Its own module so that the passes that need
inputs (precision, layout) and the verifier (which runs those passes' emulations) do
not import each other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from graphopt.errors import VerificationError
from graphopt.ops.registry import has_fact

__all__ = ["DEFAULT_DIM", "BATCH_DIM", "MAX_INT_VALUE", "MAX_INPUT_BYTES", "make_inputs", "resolve_shapes"]

#: Size given to a symbolic dimension that is not batch-like and not pinned.
DEFAULT_DIM = 16
#: Size given to batch-like symbolic dimensions.
BATCH_DIM = 1
#: Integer inputs stay below this (and below the size of any table they index).
MAX_INT_VALUE = 8
#: --verify refuses random inputs larger than this in all (before allocating them).
MAX_INPUT_BYTES = 4 << 30

_BATCH_NAMES = re.compile(r"^(n|b|bs|batch.*|.*_batch|batch_size|num_batches)$", re.IGNORECASE)


def _np_dtype(dtype: ir.DataType) -> np.dtype:
    try:
        return np.dtype(dtype.numpy())
    except Exception:  # noqa: BLE001 - onnx-ir raises assorted errors for types numpy lacks
        raise VerificationError(f"cannot make random inputs of type {dtype.name}") from None


def _gather_limits(graph: ir.Graph) -> dict[str, int]:
    """For each graph input: the smallest table size it indexes through a Gather (if any)."""
    limits: dict[str, int] = {}
    for name, graph_input in _inputs(graph):
        stack, seen, smallest = [graph_input], set(), None
        while stack:
            value = stack.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            for node, index in value.uses():
                if node.op_type in ("Gather", "GatherElements") and index == 1 and node.inputs[0] is not None:
                    shape = node.inputs[0].shape
                    axis = node.attributes.get_int("axis", 0)
                    if shape is not None and len(shape) > 0:
                        dim = shape[axis % len(shape)]
                        if isinstance(dim, int) and dim > 0:
                            smallest = dim if smallest is None else min(smallest, dim)
                elif node.op_type == "Cast" or has_fact(node.domain, node.op_type, "moves_data"):
                    # integer values pass through unchanged: a Gather behind still indexes with them
                    stack.extend(node.outputs)
        if smallest is not None:
            limits[name] = smallest
    return limits


def _is_batch_like(name: str | None, position: int) -> bool:
    return bool(name and _BATCH_NAMES.match(name)) or (name is None and position == 0)


def _inputs(graph: ir.Graph) -> list[tuple[str, ir.Value]]:
    """The graph inputs a caller feeds (not overridable initializers), with their names."""
    return [(v.name or "", v) for v in graph.inputs if v.name not in graph.initializers]


def _resolve_shapes(graph: ir.Graph, pinned: Mapping[str, list[int]]) -> dict[str, list[int]]:
    inputs = _inputs(graph)
    by_name = dict(inputs)
    for name in pinned:
        if name not in by_name:
            known = ", ".join(by_name) or "none"
            raise VerificationError(f"--input-shape names '{name}', which is not a model input (inputs: {known})")
    symbols: dict[str, int] = {}
    resolved: dict[str, list[int]] = {}
    # Pinned inputs first: they also fix the size of every symbolic name they use.
    for name, value in sorted(inputs, key=lambda item: item[0] not in pinned):
        shape = value.shape
        if name in pinned:
            dims = list(pinned[name])
            if shape is not None and len(shape) != len(dims):
                raise VerificationError(f"--input-shape {name}: the input has rank {len(shape)}, not {len(dims)}")
            for i, (want, have) in enumerate(zip(dims, shape or [], strict=False)):
                if isinstance(have, int) and have != want:
                    raise VerificationError(f"--input-shape {name}: dimension {i} is fixed at {have}, not {want}")
                if isinstance(have, ir.SymbolicDim) and have.value is not None:
                    symbols.setdefault(have.value, want)
            resolved[name] = dims
            continue
        if shape is None:
            raise VerificationError(f"input '{name}' has no known rank; pin it with --input-shape {name}=D1,D2,...")
        dims = []
        for position, dim in enumerate(shape):
            if isinstance(dim, int):
                dims.append(dim)
                continue
            symbol = dim.value if isinstance(dim, ir.SymbolicDim) else None
            size = BATCH_DIM if _is_batch_like(symbol, position) else DEFAULT_DIM
            if symbol is not None:
                size = symbols.setdefault(symbol, size)
            dims.append(size)
        resolved[name] = dims
    return resolved


def make_inputs(model: ir.Model, shapes: Mapping[str, list[int]], seed: int) -> dict[str, np.ndarray]:
    """Random inputs for `model` with the given (resolved) shapes."""
    rng = np.random.default_rng(seed)
    limits = _gather_limits(model.graph)
    feeds: dict[str, np.ndarray] = {}
    total = 0
    for name, value in _inputs(model.graph):  # an overridable initializer keeps its value
        if value.dtype is None:
            raise VerificationError(f"input '{name}' has no element type")
        dtype = _np_dtype(value.dtype)
        shape = tuple(shapes[name])
        if any(d < 0 for d in shape):
            raise VerificationError(f"input '{name}' has a negative dimension {list(shape)}; pin its shape with --input-shape {name}=D1,D2,...")
        total += math.prod(shape) * max(dtype.itemsize, 1)
        if total > MAX_INPUT_BYTES:  # checked before allocating: a declared or pinned size is not memory we have
            raise VerificationError(
                f"--verify's random inputs would take {total / 2**30:.1f} GiB (input '{name}' is {list(shape)}); "
                f"the limit is {MAX_INPUT_BYTES >> 30} GiB: pin smaller shapes with --input-shape"
            )
        if value.dtype == ir.DataType.BOOL:
            array = rng.random(shape) < 0.5
        elif value.dtype.is_floating_point():
            array = rng.standard_normal(shape).astype(dtype)
        elif value.dtype.is_integer():
            if "mask" in name.lower():
                array = np.ones(shape, dtype)  # attend everywhere: an all-masked row is NaN in any model
            else:
                high = max(1, min(MAX_INT_VALUE, limits.get(name, MAX_INT_VALUE)))
                array = rng.integers(0, high, shape).astype(dtype)
        elif value.dtype == ir.DataType.STRING:
            array = np.full(shape, "a", dtype=object)
        else:
            raise VerificationError(f"cannot make random inputs of type {value.dtype.name} (input '{name}')")
        feeds[name] = np.asarray(array)  # numpy gives a scalar, not an array, for shape (); onnxruntime wants arrays
    return feeds


# ------------------------------------------------------------------ running


resolve_shapes = _resolve_shapes
