"""Size-bounded constant folding.

A node folds when every input is a constant (an initializer that is not a graph
input, a Constant node, or a result folded earlier in the same pass). Where shape
arithmetic starts from a value's dims (Shape, Size, Gather/Slice of a partly
static shape), the rules in rules/shape_folding.pdll turn the known dims into
constants — declaratively, with near-misses saying which dim was symbolic — and
this pass folds the arithmetic on top of them in the next sweep.

Why our own pass: onnx-ir ships none (onnxscript's folder sits on a different
optimizer stack), and we need the growth rule, graph-output names, subgraphs and
functions handled exactly as below.

* Results become initializers in the main graph (`OnnxView.new_constant`) and
  Constant nodes in subgraphs and function bodies. A folded graph output keeps its
  name (a Constant node with that name takes its place).
* Size rule: a fold may grow the model by at most `size_limit_bytes`, where growth
  = bytes of the new constants - bytes of constant inputs that die with the node.
  Transpose/Cast of a weight used once costs nothing; ConstantOfShape/Expand/Tile of
  a big shape stay. Outputs are estimated *before* evaluating so a huge result is
  never even computed.
* Never folded: non-deterministic ops, ops with subgraphs, ops with attribute
  references (function bodies), non-ONNX domains, Quantize/DequantizeLinear (folding
  them would turn int8 weights into float ones and break QDQ fusion), dead nodes
  (DCE's job), and max/min-like reductions over a NaN (the registry's fact `nan_order_sensitive`: what
  they give there differs between numpy and onnxruntime).
* Evaluation: numpy fast paths for the small ops that shape arithmetic uses (checked
  against onnxruntime in tests); everything else through onnx.reference's op
  classes. A result whose dtype or static shape disagrees with what the graph
  declares is not used.

This module is the pass (which nodes fold, and the rewrite); the size bound is in
graphopt.passes.fold_size_bound, the evaluation in graphopt.passes.fold_evaluation and its
numpy fast paths in graphopt.passes.fold_numpy_paths.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphopt.ir.onnx_view import OnnxView
from graphopt.ops.registry import has_fact
from graphopt.passes._common import ONNX_DOMAINS, has_subgraphs, is_non_deterministic, record, subgraphs
from graphopt.passes.fold_evaluation import _evaluate, _infer_output_dtypes
from graphopt.passes.fold_numpy_paths import _contiguous, _NoFold
from graphopt.passes.fold_size_bound import _dead_input_bytes, _estimate_out_bytes

__all__ = ["fold_constants", "DEFAULT_SIZE_LIMIT_BYTES"]

logger = logging.getLogger(__name__)

#: Default bound on how much one fold may grow the model.
DEFAULT_SIZE_LIMIT_BYTES = 1 << 20



def fold_constants(
    view: OnnxView,
    *,
    size_limit_bytes: int = DEFAULT_SIZE_LIMIT_BYTES,
    stats: Any = None,
    only: Collection[ir.Node] | None = None,
) -> int:
    """Fold constant subexpressions in every scope of `view.model`; returns the nodes folded.

    `stats` is an optional `graphopt.report.model.PassStats` to record the run in; `only`: fold
    these nodes and no other (a pass's own constants, under a size bound of its own).
    """
    started = time.perf_counter()
    folder = _Folder(view, size_limit_bytes, only)
    model = view.model
    main_opset = model.opset_imports.get("", onnx.defs.onnx_opset_version())
    folder.fold_scope(model.graph, main_opset)
    for function in model.functions.values():
        folder.fold_scope(function, function.opset_imports.get("", main_opset))
    record(stats, folder.count, started)
    return folder.count


# --------------------------------------------------------------------- the pass


class _Folder:
    def __init__(self, view: OnnxView, limit: int, only: Collection[ir.Node] | None = None) -> None:
        self.view = view
        self.only = None if only is None else {id(node) for node in only}
        self.main = view.model.graph
        self.limit = limit
        self.count = 0
        # Constant contents by value (None: not a constant). Safe to cache for the pass:
        # a value never turns constant later, folding replaces it with a new value.
        self.consts: dict[ir.Value, np.ndarray | None] = {}

    def fold_scope(self, scope: ir.Graph | ir.Function, opset: int) -> None:
        # Topological order: a folded result is seen as constant by its users, and an
        # If/Loop body is visited after every outer value it can reference.
        for node in list(scope):
            if node.graph is None or (self.only is not None and id(node) not in self.only):
                continue
            if has_subgraphs(node):
                for graph in subgraphs(node):
                    self.fold_scope(graph, opset)
                continue
            try:
                self.try_fold(node, opset)
            except _NoFold:
                pass

    # ------------------------------------------------------------- one node
    def try_fold(self, node: ir.Node, opset: int) -> None:
        op = node.op_type
        if node.domain not in ONNX_DOMAINS or has_fact(node.domain, op, "never_folded") or is_non_deterministic(node):
            return
        if not any(out.uses() or out.is_graph_output() for out in node.outputs):
            return
        if any(attr.is_ref() for attr in node.attributes.values()):
            return
        version = node.version or opset

        # Every input constant? Check cheaply before loading any tensor.
        for value in node.inputs:
            if value is not None and not self.is_const(value):
                return
        xs: list[np.ndarray | None] = []
        for value in node.inputs:
            if value is None:
                xs.append(None)
                continue
            array = self.const(value)
            if array is None:
                return
            xs.append(array)
        if not xs:
            return  # zero-input ops besides Constant are the random ones

        if op == "Identity":
            self._alias(node)
            return
        dead = _dead_input_bytes(node, xs)
        estimate = _estimate_out_bytes(node, xs)
        if estimate is None or estimate - dead > self.limit:
            return

        with np.errstate(all="ignore"):
            results, fast = _evaluate(node, xs, version)
        if results is None or len(results) != len(node.outputs):
            return
        if not self._results_match(node, results, xs, version, fast):
            return
        self._replace(node, results, dead)

    # ------------------------------------------------------------- inputs
    def is_const(self, value: ir.Value) -> bool:
        if value in self.consts:
            return self.consts[value] is not None
        return self.view.is_const(value)

    def const(self, value: ir.Value) -> np.ndarray | None:
        try:
            return self.consts[value]
        except KeyError:
            pass
        array = self.view.const_array(value)
        if array is not None and array.dtype.kind in "OSUV":
            array = None  # strings and opaque data are not folded
        self.consts[value] = array
        return array

    # ------------------------------------------------------------- checks
    def _results_match(
        self, node: ir.Node, results: Sequence[np.ndarray], xs: Sequence[np.ndarray | None], version: int, fast: bool
    ) -> bool:
        expected: Sequence[ir.DataType | None] = [out.dtype for out in node.outputs]
        if not fast and any(e is None for e in expected):
            # onnx.reference sometimes returns a wider dtype than the spec: ask the schema.
            inferred = _infer_output_dtypes(node, xs, version)
            if inferred is None:
                return False
            expected = [e if e is not None else i for e, i in zip(expected, inferred, strict=False)]
        for out, result, dtype in zip(node.outputs, results, expected, strict=False):
            if not isinstance(result, np.ndarray) or result.dtype.kind in "OSUV":
                return False
            try:
                got = ir.DataType.from_numpy(result.dtype)
            except TypeError:
                return False
            if dtype is not None and got != dtype:
                logger.debug("not folding %s: result dtype %s, graph says %s", node.name, got, dtype)
                return False
            shape = out.shape
            if shape is not None and (
                len(shape) != result.ndim or any(isinstance(d, int) and d != n for d, n in zip(shape, result.shape, strict=False))
            ):
                logger.debug("not folding %s: result shape %s, graph says %s", node.name, result.shape, shape)
                return False
        return True

    # ------------------------------------------------------------- rewriting
    def _replace(self, node: ir.Node, results: Sequence[np.ndarray], dead_bytes: int) -> None:
        needed = [(out, r) for out, r in zip(node.outputs, results, strict=False) if out.uses() or out.is_graph_output()]
        if sum(r.nbytes for _, r in needed) - dead_bytes > self.limit:
            return
        graph = node.graph
        assert graph is not None
        in_main = graph is self.main
        new_nodes: list[ir.Node] = []
        for out, result in needed:
            result = _contiguous(result)
            if out.is_graph_output():
                # Keep the output's name: a Constant node named like it takes its place.
                name = out.name or self.view.fresh_name(node.op_type)
                out.name = self.view.fresh_name(name)
                const_node = self._constant_node(result, name)
                new_nodes.append(const_node)
                new = const_node.outputs[0]
            elif in_main:
                new = self.view.new_constant(graph, result, out.name or node.op_type)
            else:
                const_node = self._constant_node(result, self.view.fresh_name(out.name or node.op_type))
                new_nodes.append(const_node)
                new = const_node.outputs[0]
            self.consts[new] = result
            out.replace_all_uses_with(new, replace_graph_outputs=True)
        if new_nodes:
            graph.insert_before(node, new_nodes)
        self._remove(node)
        self.count += 1

    def _alias(self, node: ir.Node) -> None:
        """Identity of a constant: its users read the constant itself (no copy)."""
        out = node.outputs[0]
        if out.is_graph_output():
            return  # already as cheap as a Constant node would be
        source = node.inputs[0]
        assert source is not None
        out.replace_all_uses_with(source)
        self._remove(node)
        self.count += 1

    def _constant_node(self, array: np.ndarray, name: str) -> ir.Node:
        tensor = ir.tensor(array, name=name)
        node = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)], name=self.view.fresh_name("Constant"))
        out = node.outputs[0]
        out.name = name
        out.type = ir.TensorType(tensor.dtype)
        out.shape = ir.Shape(array.shape)
        return node

    def _remove(self, node: ir.Node) -> None:
        """Remove a folded node, and constant inputs only it used (keeps memory flat)."""
        inputs = {v for v in node.inputs if v is not None}
        graph = node.graph
        assert graph is not None
        graph.remove(node, safe=True)
        for value in inputs:
            if value.uses() or value.is_graph_output() or value.is_graph_input():
                continue
            producer = value.producer()
            if value.is_initializer() and value.graph is not None and value.name:
                value.graph.initializers.pop(value.name)
            elif producer is not None and producer.op_type == "Constant" and producer.graph is not None:
                producer.graph.remove(producer, safe=True)
            else:
                continue
            self.consts.pop(value, None)


