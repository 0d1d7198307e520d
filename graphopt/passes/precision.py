"""Precision conversion: run a float32 model in float16 or bfloat16.

    graphopt optimize model.onnx -o model.fp16.onnx --precision fp16 [--keep-fp32 OP_OR_NODE]...

This module is the conversion itself; what stays float32 is decided by the plan
(graphopt.passes.precision_plan), and the fp16 range check that extends the plan from
measured values lives in graphopt.passes.precision_range.

It runs after the fusion rules (which match the float32 graph) and before CSE, DCE
and lowering. What it does, on the main graph of an onnx-ir model:

* Every node that computes in float32 runs in the low type, unless it is kept in
  float32: ops on the block list (`DEFAULT_KEEP_FP32`, extended by the user's
  `keep_fp32` op types and node or output names), shape computations (float values
  derived only from Shape/Size and constants), nodes with subgraphs (If/Loop/Scan
  and their bodies stay wholly float32), ops whose output type an attribute sets,
  the op of a QDQ node unit (it reads a dequantized activation or is quantized after:
  onnxruntime fuses DQ -> op -> Q only without Casts in between),
  ops the target has no kernel for in the low type (the target's capability table;
  for standard ops also the op schema), and elementwise or layout ops whose
  non-constant inputs all come from float32 nodes (so the statistics of a
  decomposed normalization stay float32 after its reduction, and no Cast pair is
  put around a Reshape).
* Nodes that only read floats (Shape, IsNaN, Cast to an integer, comparisons) take
  whatever precision their inputs have, and never get a Cast of their own.
* Graph inputs and outputs keep their types: a Cast down after an input, a Cast up
  before an output. A value crossing between a converted and a float32 node gets
  one Cast, shared by all its consumers on the other side (also consumers inside
  If/Loop bodies). A Cast made from a Cast's output reads the first Cast's source
  instead, so no Cast pairs are made; a Cast(to=float) inside the converted region
  is retargeted to the low type.
* Float32 constants (initializers and Constant nodes) read by converted nodes are
  converted once, clamped to the low type's finite range; a constant also read in
  float32 is kept and a converted copy added. Values clamped (overflow) or flushed to
  zero (underflow) are counted in the summary.
* Integer, bool and float64 tensors are never touched. Function bodies are left as
  they are (a call is kept float32, with Casts around it). Outputs the rewrites left
  untyped first get their element type where the op schema (or, for graphopt's fused
  ops, their input type) says it; a node reading or writing a value whose type is
  still unknown is kept as it is.

Afterwards `remove_cast_pairs` collapses what is left: the built-in cast rules
(rules/cast.pdll: no-op casts, lossless chains) and round trips through the low
type that conversion itself made.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphopt.ops.registry import fp32_inputs, fp32_outputs, has_fact
from graphopt.ops.targets import GRAPHOPT_DOMAIN, Target
from graphopt.passes._common import ONNX_DOMAINS, has_subgraphs, in_qdq_unit, record
from graphopt.passes.precision_plan import (
    _LOW,
    PrecisionPlan,
    _formal,
    _op_names,
    _schema,
    default_blocked,
)
from graphopt.passes.precision_region import joins_region, recurrent_seed, region_seed, tail_heads
from graphopt.report.sections import PrecisionSummary, RangeKeep

__all__ = ["convert_precision", "remove_cast_pairs"]

_FLOAT = ir.DataType.FLOAT


# ---------------------------------------------------------------- the pass


def _to_low(array: np.ndarray, low: ir.DataType) -> tuple[np.ndarray, int, int]:
    """`array` in the low type, clamped to its finite range: (converted, clamped, flushed)."""
    if low == ir.DataType.BFLOAT16:
        import ml_dtypes

        np_low: Any = ml_dtypes.bfloat16
        biggest = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    else:
        np_low = np.float16
        biggest = float(np.finfo(np.float16).max)
    a = np.asarray(array, dtype=np.float32)
    over = np.isfinite(a) & (np.abs(a) > biggest)
    clamped = int(np.count_nonzero(over))
    if clamped:
        a = np.where(over, np.copysign(np.float32(biggest), a), a).astype(np.float32)
    converted = a.astype(np_low)
    flushed = int(np.count_nonzero((converted == 0) & (a != 0)))
    return converted, clamped, flushed


@dataclass
class _Decision:
    inputs: tuple[int, ...]  # input positions read in the low type
    outputs: tuple[int, ...]  # output positions written in the low type


@dataclass
class _Converter:
    model: ir.Model
    target: Target
    plan: PrecisionPlan
    summary: PrecisionSummary
    graph: ir.Graph = field(init=False)
    opset: int = field(init=False)
    names: set[str] = field(default_factory=set)
    low: dict[int, _Decision] = field(default_factory=dict)  # id(node) -> decision
    low_values: set[int] = field(default_factory=set)  # ids of values produced in the low type
    fp32_values: set[int] = field(default_factory=set)  # float32 outputs of kept nodes
    shape_values: set[int] = field(default_factory=set)
    casts: set[int] = field(default_factory=set)  # ids of Cast nodes made here
    _up: dict[int, ir.Value] = field(default_factory=dict)
    _down: dict[int, ir.Value] = field(default_factory=dict)
    _consts: dict[int, ir.Value] = field(default_factory=dict)
    _front: list[ir.Node] = field(default_factory=list)
    _kept_reasons: Counter[str] = field(default_factory=Counter)
    _kept_ops: Counter[str] = field(default_factory=Counter)
    _matched_keep: set[str] = field(default_factory=set)
    _no_kernel: dict[int, str] = field(default_factory=dict)  # id(node) -> the target's reason it has no low-type kernel
    _tails: frozenset[int] | None = None  # ids of the tail heads (precision_region.tail_heads), found when first needed

    def __post_init__(self) -> None:
        self.graph = self.model.graph
        self.opset = self.model.opset_imports.get("", onnx.defs.onnx_opset_version())
        for node in ir.traversal.RecursiveGraphIterator(self.graph):
            self.names.update(v.name for v in node.outputs if v.name)
            if node.name:
                self.names.add(node.name)
        self.names.update(v.name for v in self.graph.inputs if v.name)
        self.names.update(self.graph.initializers)

    # ------------------------------------------------------------ helpers
    def fresh(self, hint: str) -> str:
        name, i = hint, 1
        while name in self.names:
            name = f"{hint}_{i}"
            i += 1
        self.names.add(name)
        return name

    @staticmethod
    def is_const(value: ir.Value) -> bool:
        if value.is_graph_input():
            return False  # an initializer that is also an input can be overridden
        if value.const_value is not None:
            return True
        producer = value.producer()
        return (
            producer is not None
            and producer.op_type == "Constant"
            and producer.domain in ONNX_DOMAINS
            and not any(a.is_ref() for a in producer.attributes.values())
        )

    @staticmethod
    def dtype(value: ir.Value) -> ir.DataType | None:
        if value.dtype is not None:
            return value.dtype
        return value.const_value.dtype if value.const_value is not None else None

    # ------------------------------------------------------------ deciding
    def infer_missing_dtypes(self) -> None:
        """Give outputs the rewrites left untyped their element type where it is certain:
        from the op schema (an output sharing a type parameter with a typed input, or of a
        fixed type, or Cast's `to`), and for graphopt's fused ops the type of their first
        float input (float32 for statistics outputs)."""
        for node in self.graph:
            for i, out in enumerate(node.outputs):
                if out.dtype is None:
                    dtype = _output_dtype(node, i, self.opset, self.target)
                    if dtype is not None:
                        out.type = ir.TensorType(dtype)
                        self.summary._typed += 1

    def decide(self) -> None:
        self.infer_missing_dtypes()
        for node in self.graph:
            f32_in = tuple(i for i, v in enumerate(node.inputs) if v is not None and self.dtype(v) == _FLOAT)
            f32_out = tuple(i for i, v in enumerate(node.outputs) if self.dtype(v) == _FLOAT)
            shape_derived = self._shape_derived(node)
            if shape_derived:
                self.shape_values.update(id(v) for v in node.outputs)
            if not f32_in and not f32_out:
                continue
            if node.op_type == "Constant" and node.domain in ONNX_DOMAINS:
                continue  # constants are converted for their readers
            reason, decision = self._decide(node, f32_in, f32_out, shape_derived)
            if decision is not None:
                self.low[id(node)] = decision
                self.low_values.update(id(node.outputs[i]) for i in decision.outputs)
                self.summary.nodes_converted += 1
                continue
            self.fp32_values.update(id(node.outputs[i]) for i in f32_out)
            if reason is not None and f32_out:  # nodes that only read floats are not "kept"
                self._kept_reasons[reason] += 1
                self._kept_ops[_op_name(node)] += 1
                if reason == "speed_decision":
                    self.summary.kept_for_speed.append(node.name or next((v.name for v in node.outputs if v.name), ""))
                if id(node) in self._no_kernel:
                    self.summary.kept_for_kernel.append(RangeKeep(_node_key(node), _op_name(node), "no_kernel", None, self._no_kernel[id(node)]))

    def _shape_derived(self, node: ir.Node) -> bool:
        """Shape arithmetic: Shape/Size, and nodes computing only from their results and
        scalar constants. A lookup of a float table by a shape-derived index (a position
        embedding) is not: it converts like any other node."""
        if node.domain in ONNX_DOMAINS and node.op_type in ("Shape", "Size"):
            return True
        inputs = [v for v in node.inputs if v is not None]
        if not inputs or not any(id(v) in self.shape_values for v in inputs):
            return False
        for v in inputs:
            if id(v) in self.shape_values:
                continue
            if not self.is_const(v):
                return False
            if self.dtype(v) == _FLOAT and not _is_scalar(v):
                return False
        return True

    def _user_keeps(self, node: ir.Node) -> bool:
        if not self.plan.keep:
            return False
        names = _op_names(node.domain, node.op_type, self.target) | {node.name or "", *(v.name or "" for v in node.outputs)}
        hits = names & self.plan.keep
        self._matched_keep.update(hits)
        return bool(hits)

    def _decide(self, node: ir.Node, f32_in: tuple[int, ...], f32_out: tuple[int, ...], shape_derived: bool) -> tuple[str | None, _Decision | None]:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if has_subgraphs(node):
            return "subgraph", None
        if self.plan.range_keep and ({node.name or "", *(v.name or "" for v in node.outputs)} & self.plan.range_keep):
            return "range", None
        if self._user_keeps(node):
            return "keep_fp32", None
        if shape_derived and f32_out:
            return "shape", None
        if default_blocked(domain, node.op_type, self.target):
            return "block_list", None
        if in_qdq_unit(node):   # a Cast between the op and its Q/DQ would hide the unit
            return "qdq_unit", None
        if any(v.dtype is None for v in node.outputs) or any(v is not None and self.dtype(v) is None for v in node.inputs):
            return "unknown_type", None
        why = self.plan.cannot_run_low(self.target, domain, node.op_type, self.opset)
        if why is not None:
            if has_fact(domain, node.op_type, "attribute_typed"):
                return "attribute_type", None
            self._no_kernel[id(node)] = why  # listed in the report, node by node
            return "no_kernel", None
        if (self.plan.fp32_convs or self.plan.fp32_recurrent) and self._stays_for_speed(node):
            return "speed_decision", None
        ins, outs = self._positions(node, domain, f32_in, f32_out)
        if not ins and not outs:
            return "no_kernel", None
        readers = [node.inputs[i] for i in ins if not self.is_const(node.inputs[i])]  # type: ignore[arg-type]
        if not outs:
            # It only reads floats (Shape, IsNaN, Cast to int, comparisons): it takes its inputs' type.
            if readers and all(id(v) in self.low_values for v in readers):
                return None, _Decision(ins, outs)
            return "follows_fp32", None
        if has_fact(domain, node.op_type, "follows_inputs") and readers and all(id(v) in self.fp32_values for v in readers):
            return "follows_fp32", None
        return None, _Decision(ins, outs)

    def _stays_for_speed(self, node: ir.Node) -> bool:
        """In a region a precision decision keeps in float32 (the CNN region of
        graphopt.passes.precision_decision, the recurrent one of graphopt.passes.precision_recurrent):
        a seed (2-D convolution, recurrent op), or a node of the region's ops reading only float32 values."""
        if (self.plan.fp32_convs and region_seed(node)) or (self.plan.fp32_recurrent and recurrent_seed(node)):
            return True
        if self._tails is None:
            self._tails = tail_heads(self.graph)
        if not joins_region(node, convs=self.plan.fp32_convs, tails=self._tails):
            return False
        readers = [v for v in node.inputs if v is not None and self.dtype(v) == _FLOAT and not self.is_const(v)]
        return bool(readers) and all(id(v) in self.fp32_values or v.is_graph_input() for v in readers)

    def _positions(self, node: ir.Node, domain: str, f32_in: tuple[int, ...], f32_out: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        lowered_domain, lowered_op = self.target.lowered(domain, node.op_type)
        fixed = fp32_outputs(lowered_domain, lowered_op)
        f32_in = tuple(i for i in f32_in if i not in fp32_inputs(lowered_domain, lowered_op))
        # graphopt's fused ops read and write one float type (their lowering may move inputs,
        # so the lowered op's schema positions do not apply to them).
        schema = _schema(lowered_op, self.opset) if lowered_domain in ONNX_DOMAINS and domain != GRAPHOPT_DOMAIN else None
        if schema is None:
            return f32_in, tuple(i for i in f32_out if i not in fixed)
        low_str = _LOW[self.plan.precision][2]
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

        def converts(formals: Sequence[Any], i: int) -> bool:
            formal = _formal(formals, i)
            return formal is not None and low_str in allowed.get(formal.type_str, ())

        return (
            tuple(i for i in f32_in if converts(schema.inputs, i)),
            tuple(i for i in f32_out if i not in fixed and converts(schema.outputs, i)),
        )

    # ------------------------------------------------------------ applying
    def apply(self) -> None:
        low = self.plan.low_type
        decided = [(node, self.low[id(node)]) for node in self.graph if id(node) in self.low]
        converted_outputs: list[ir.Value] = []
        for node, decision in decided:
            for i in decision.outputs:
                value = node.outputs[i]
                value.type = ir.TensorType(low)
                converted_outputs.append(value)
            if node.op_type == "Cast" and node.domain in ONNX_DOMAINS and decision.outputs:
                node.attributes["to"] = ir.AttrInt64("to", int(low))
                self.summary.casts_retargeted += 1
        # Readers: converted nodes read the low type ...
        for node, decision in decided:
            for i in decision.inputs:
                read = node.inputs[i]
                if read is None or id(read) in self.low_values:
                    continue
                node.replace_input_with(i, self._low_constant(read) if self.is_const(read) else self._cast_down(read))
        # ... everything else reads float32, graph outputs included.
        for value in converted_outputs:
            uses = _live_uses(value)  # before any Cast of our own reads it
            if value.is_graph_output():
                self._output_cast(value)
            for use in uses:
                reader = self.low.get(id(use.node))
                if reader is None or use.idx not in reader.inputs:
                    use.node.replace_input_with(use.idx, self._cast_up(value))
        if self._front:
            nodes = list(self.graph)
            if nodes:
                self.graph.insert_before(nodes[0], self._front)
            else:
                self.graph.extend(self._front)
        self.summary.kept = dict(self._kept_reasons.most_common())
        self.summary.kept_ops = dict(sorted(self._kept_ops.items(), key=lambda kv: (-kv[1], kv[0])))
        self.summary.nodes_kept = sum(self._kept_reasons.values())

    def _new_cast(self, source: ir.Value, to: ir.DataType, after: ir.Node | None, hint: str) -> ir.Value:
        suffix = "fp32" if to == _FLOAT else self.plan.precision
        node = ir.Node("", "Cast", [source], [ir.AttrInt64("to", int(to))], name=self.fresh(f"{hint}_cast_{suffix}"))
        out = node.outputs[0]
        out.name = self.fresh(f"{hint}_{suffix}")
        out.type = ir.TensorType(to)
        if source.shape is not None:
            out.shape = source.shape.copy()
        if after is not None and after.graph is self.graph:
            self.graph.insert_after(after, node)
        else:
            self._front.append(node)
        self.casts.add(id(node))
        self.summary.casts_inserted += 1
        return out

    def _cast_source(self, value: ir.Value) -> tuple[ir.Value, ir.Node | None]:
        """What to cast from: a Cast's own source when `value` is that Cast's output and
        the source is not float32 (so no Cast pair is made), else `value` itself."""
        producer = value.producer()
        if producer is not None and producer.op_type == "Cast" and producer.domain in ONNX_DOMAINS:
            source = producer.inputs[0]
            if source is not None and self.dtype(source) not in (_FLOAT, None) and id(source) not in self.low_values:
                return source, producer
        return value, producer

    def _cast_down(self, value: ir.Value) -> ir.Value:
        cached = self._down.get(id(value))
        if cached is None:
            source, after = self._cast_source(value)
            cached = self._down[id(value)] = self._new_cast(source, self.plan.low_type, after, value.name or "value")
        return cached

    def _cast_up(self, value: ir.Value) -> ir.Value:
        cached = self._up.get(id(value))
        if cached is None:
            source, after = self._cast_source(value)
            cached = self._up[id(value)] = self._new_cast(source, _FLOAT, after, value.name or "value")
        return cached

    def _output_cast(self, value: ir.Value) -> None:
        """A graph output keeps its name and float32 type: the low value is renamed and a
        Cast up takes its place among the outputs."""
        name = value.name
        value.name = self.fresh(f"{name}_{self.plan.precision}")
        self.names.discard(name or "")
        up = self._cast_up(value)
        up.name = name
        for i, out in enumerate(self.graph.outputs):
            if out is value:
                self.graph.outputs[i] = up

    def _low_constant(self, value: ir.Value) -> ir.Value:
        cached = self._consts.get(id(value))
        if cached is not None:
            return cached
        tensor = ir.convenience.get_const_tensor(value)
        assert tensor is not None
        array, clamped, flushed = _to_low(tensor.numpy(), self.plan.low_type)
        self.summary.values_clamped += clamped
        self.summary.values_flushed += flushed
        only_low = not value.is_graph_output() and all(
            (d := self.low.get(id(use.node))) is not None and use.idx in d.inputs for use in _live_uses(value)
        )
        producer = value.producer()
        if only_low and value.const_value is not None and producer is None:
            value.const_value = ir.Tensor(array, name=value.name)
            value.type = ir.TensorType(self.plan.low_type)
            self.summary.constants_converted += 1
            result = value
        elif only_low and producer is not None and "value" in producer.attributes:
            producer.attributes["value"] = ir.AttrTensor("value", ir.Tensor(array, name=value.name))
            value.type = ir.TensorType(self.plan.low_type)
            if value.const_value is not None:
                value.const_value = ir.Tensor(array, name=value.name)
            self.summary.constants_converted += 1
            result = value
        else:
            name = self.fresh(f"{value.name or 'const'}_{self.plan.precision}")
            result = ir.Value(name=name, const_value=ir.Tensor(array, name=name), type=ir.TensorType(self.plan.low_type), shape=ir.Shape(array.shape))
            self.graph.register_initializer(result)
            self.summary.constants_copied += 1
        self.low_values.add(id(result))
        self._consts[id(value)] = result
        return result


def convert_precision(model: ir.Model, target: Target, plan: PrecisionPlan, *, stats: Any = None) -> PrecisionSummary:
    """Convert the main graph of `model` in place; returns what was done (see the module doc)."""
    started = time.perf_counter()
    summary = PrecisionSummary(precision=plan.precision)
    converter = _Converter(model, target, plan, summary)
    converter.decide()
    converter.apply()
    summary._unmatched_keep = sorted(plan.keep - converter._matched_keep)
    summary._casts = converter.casts
    record(stats, summary.nodes_converted + summary.casts_inserted, started)
    return summary


# ---------------------------------------------------------------- cleanup


def _is_cast(node: ir.Node | None) -> bool:
    return node is not None and node.op_type == "Cast" and node.domain in ONNX_DOMAINS


def remove_cast_pairs(model: ir.Model, made: set[int], cast_rules: Callable[[ir.Model], int] | None = None, *, stats: Any = None) -> int:
    """Collapse Cast pairs left after conversion; returns the Casts removed.

    A round trip through the low type that conversion made (Cast(Cast(x, f16), f32)
    where x is f32, one of the two made by `convert_precision`, whose Cast ids are
    `made`) reads x directly; `cast_rules` then applies the built-in cast rules
    (rules/cast.pdll: no-op casts and lossless chains). Pairs that were in the
    model before are left to those rules: a lossy pair someone wrote is theirs."""
    started = time.perf_counter()
    removed = 0
    graph = model.graph
    for node in list(graph):
        if not _is_cast(node) or node.graph is None:
            continue
        inner = node.inputs[0].producer() if node.inputs[0] is not None else None
        if not _is_cast(inner) or (id(node) not in made and id(inner) not in made):
            continue
        assert inner is not None
        source = inner.inputs[0]
        to = node.attributes.get_int("to")
        if source is None or source.dtype is None or to is None:
            continue
        if int(source.dtype) == to and source.dtype == _FLOAT:
            out = node.outputs[0]
            if out.is_graph_output():
                continue
            out.replace_all_uses_with(source)
        elif id(inner) in made:
            node.replace_input_with(0, source)  # Cast(Cast(x, a), b) -> Cast(x, b)
        else:
            continue
        for candidate in (node, inner):
            if candidate.graph is not None and not any(_live_uses(o) or o.is_graph_output() for o in candidate.outputs):
                for i in range(len(candidate.inputs)):
                    candidate.replace_input_with(i, None)
                graph.remove(candidate)
                removed += 1
    if cast_rules is not None:
        removed += cast_rules(model)
    record(stats, removed, started)
    return removed


def _output_dtype(node: ir.Node, index: int, opset: int, target: Target) -> ir.DataType | None:
    """The element type of output `index` of `node` where its inputs and op say it for sure."""
    inputs = [v for v in node.inputs if v is not None]
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain == GRAPHOPT_DOMAIN:
        if index in fp32_outputs(*target.lowered(domain, node.op_type)):
            return _FLOAT
        floats = [v.dtype for v in inputs if v.dtype is not None and v.dtype.is_floating_point()]
        return floats[0] if floats else None
    if domain not in ONNX_DOMAINS:
        return None
    if node.op_type == "Cast":
        to = node.attributes.get_int("to")
        return ir.DataType(to) if to is not None else None
    schema = _schema(node.op_type, opset)
    if schema is None:
        return None
    formal = _formal(schema.outputs, index)
    if formal is None:
        return None
    if formal.type_str.startswith("tensor("):
        return _from_type_str(formal.type_str)
    allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == formal.type_str), [])
    if len(allowed) == 1:  # IsNaN's T2 is bool, for example
        return _from_type_str(allowed[0])
    for i, value in enumerate(node.inputs):
        formal_in = _formal(schema.inputs, i)
        if value is not None and value.dtype is not None and formal_in is not None and formal_in.type_str == formal.type_str:
            return value.dtype
    return None


def _from_type_str(text: str) -> ir.DataType | None:
    """"tensor(float16)" -> FLOAT16 (None for sequences and optionals)."""
    if not (text.startswith("tensor(") and text.endswith(")")):
        return None
    try:
        return ir.DataType[text[len("tensor(") : -1].upper()]
    except KeyError:
        return None


def _is_scalar(value: ir.Value) -> bool:
    shape: Any = value.shape
    if shape is None:
        tensor = value.const_value if value.const_value is not None else ir.convenience.get_const_tensor(value)
        shape = tensor.shape if tensor is not None else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return False
    return math.prod(int(d) for d in shape) <= 1


def _live_uses(value: ir.Value) -> list[Any]:
    """Uses by nodes that are in a graph (a rewrite the driver planned and dropped leaves
    nodes that still read their inputs but belong to no graph)."""
    return [use for use in value.uses() if use.node.graph is not None]


def _node_key(node: ir.Node) -> str:
    """The name a plan keeps a node by: its own, else its first output's."""
    return node.name or next((v.name for v in node.outputs if v.name), "")


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in ONNX_DOMAINS else f"{node.domain}.{node.op_type}"

