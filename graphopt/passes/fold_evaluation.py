"""Computing a constant node's results: numpy fast paths first, then onnx.reference.

`_evaluate` runs one node on constant inputs for constant folding
(graphopt.passes.constant_folding): the numpy fast paths (graphopt.passes.fold_numpy_paths)
for the small ops of shape arithmetic, everything else through onnx.reference's op
classes; max/min-like ops over a NaN (the registry's fact `nan_order_sensitive`) are not evaluated, since
numpy and onnxruntime disagree there. `_infer_output_dtypes` asks the op schema for the
output types where onnx.reference may return a wider one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphopt.ops.registry import has_fact
from graphopt.passes.fold_numpy_paths import _FAST_OPS, _NoFold

__all__: list[str] = []

logger = logging.getLogger(__name__)


# Ops whose result over a NaN depends on the implementation (the registry's fact
# `nan_order_sensitive`) are left for the runtime when a NaN is among their inputs.


def _holds_nan(xs: list[Any]) -> bool:
    return any(isinstance(x, np.ndarray) and x.dtype.kind in "fc" and bool(np.isnan(x).any()) for x in xs)


def _evaluate(node: ir.Node, xs: list[Any], version: int) -> tuple[Any, bool]:
    """(results, computed_by_fast_path); results None when the node cannot be evaluated."""
    if has_fact(node.domain, node.op_type, "nan_order_sensitive") and _holds_nan(xs):
        return None, False
    fast = _FAST_OPS.get(node.op_type)
    if fast is not None:
        try:
            results = fast(node, xs, version)
        except _NoFold:
            return None, True
        except (ValueError, IndexError, TypeError, OverflowError) as e:
            logger.debug("fast path for %s failed: %s", node.op_type, e)
            return None, True
        if results is not None:
            return results, True
    if any(x is not None and x.dtype == object for x in xs):
        return None, False
    return _reference_eval(node, xs, version), False


@lru_cache(maxsize=512)
def _reference_op(op_type: str, version: int) -> Any:
    from onnx.reference.ops import load_op

    return load_op("", op_type, version)


def _nolog(*args: Any) -> None:
    pass


def _reference_eval(node: ir.Node, xs: list[np.ndarray | None], version: int) -> list[np.ndarray] | None:
    proto = ir.serde.serialize_node(node)
    try:
        op_class = _reference_op(node.op_type, version)
        impl = op_class(proto, {"log": _nolog, "opsets": {"": version}, "verbose": 0, "new_ops": None})
        results = impl.run(*xs)
    except Exception as e:  # noqa: BLE001 - any failure just means "not folded"
        logger.debug("onnx.reference could not evaluate %s: %s", node.op_type, e)
        return None
    return [np.asarray(r) if isinstance(r, np.ndarray) or np.isscalar(r) else r for r in results]


def _infer_output_dtypes(node: ir.Node, xs: Sequence[np.ndarray | None], version: int) -> list[ir.DataType] | None:
    try:
        proto = ir.serde.serialize_node(node)
        schema = onnx.defs.get_schema(node.op_type, version, "")
        types = {
            name: onnx.helper.make_tensor_type_proto(int(ir.DataType.from_numpy(x.dtype)), x.shape)
            for name, x in zip(proto.input, xs, strict=False)
            if name and x is not None
        }
        inferred = onnx.shape_inference.infer_node_outputs(schema, proto, types, opset_imports=[onnx.helper.make_opsetid("", version)])
        return [ir.DataType(inferred[name].tensor_type.elem_type) for name in proto.output]
    except Exception as e:  # noqa: BLE001
        logger.debug("no output types for %s: %s", node.op_type, e)
        return None
