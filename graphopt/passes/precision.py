"""Precision conversion: run a float32 model in float16 or bfloat16.

    graphopt optimize model.onnx -o model.fp16.onnx --precision fp16 [--keep-fp32 OP_OR_NODE]...

It runs after the fusion rules (which match the float32 graph) and before CSE, DCE
and lowering. What it does, on the main graph of an onnx-ir model:

* Every node that computes in float32 runs in the low type, unless it is kept in
  float32: ops on the block list (`DEFAULT_KEEP_FP32`, extended by the user's
  `keep_fp32` op types and node or output names), shape computations (float values
  derived only from Shape/Size and constants), nodes with subgraphs (If/Loop/Scan
  and their bodies stay wholly float32), ops whose output type an attribute sets,
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

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphopt.errors import GraphoptError
from graphopt.ops.targets import GRAPHOPT_DOMAIN, MS_DOMAIN, Target
from graphopt.passes._common import ONNX_DOMAINS, has_subgraphs, record
from graphopt.report.model import PrecisionSummary

__all__ = [
    "PRECISIONS",
    "DEFAULT_KEEP_FP32",
    "PrecisionPlan",
    "parse_precision",
    "convert_precision",
    "remove_cast_pairs",
    "range_checked_plan",
    "FP16_SAFE_MAX",
    "FP16_SMALLEST_NORMAL",
    "emulate_low_precision",
]

#: Accepted values of `--precision`; "fp32" (or None) leaves the model's precision alone.
PRECISIONS = ("fp32", "fp16", "bf16")

_LOW: dict[str, tuple[str, ir.DataType, str]] = {
    "fp16": ("f16", ir.DataType.FLOAT16, "tensor(float16)"),
    "bf16": ("bf16", ir.DataType.BFLOAT16, "tensor(bfloat16)"),
}

#: Op types (standard domain) kept in float32 unless the user says otherwise. Fused
#: kernels (LayerNormalization, SkipLayerNormalization, attention, graphopt's ops)
#: accumulate in float32 internally and are not listed; neither are Erf, Tanh and
#: Sigmoid (bounded outputs), nor ReduceMax/ReduceMin/ArgMax (exact in any type).
DEFAULT_KEEP_FP32: frozenset[str] = frozenset(
    {
        # reductions whose accumulation loses precision in 16 bits
        "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceProd",
        # range-expanding math
        "Pow", "Exp", "Log",
        # standalone softmax (not the fused attention kernels)
        "Softmax", "LogSoftmax",
        # normalization statistics without a fused kernel
        "MeanVarianceNormalization", "LpNormalization", "LRN", "LpPool", "GlobalLpPool",
        # running sums and generated sequences
        "CumSum", "Range",
        # random numbers (their dtype attribute sets the type)
        "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
        # coordinates and boxes
        "NonMaxSuppression", "RoiAlign",
        # signal processing
        "DFT", "STFT",
        # quantization: scales keep their type
        "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
    }
)

# Ops whose float output type an attribute sets (converting them would need the attribute changed).
_ATTRIBUTE_TYPED = frozenset(
    {"ConstantOfShape", "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)

# Elementwise and layout ops that stay float32 when every non-constant float input
# comes from a float32 node: converting them would only add a Cast.
_FOLLOW_INPUTS = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal", "Neg", "Abs", "Pow", "Exp", "Log",
        "Max", "Min", "Sum", "Mean", "Clip", "Where",
        "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand",
        "Slice", "Concat", "Split", "Gather", "Tile", "Cast",
    }
)

# Ops whose precision decides a fusion's worth (see PrecisionPlan.fusion_problem); ops
# outside the standard domain (fused ops) count as heavy too.
_HEAVY_OPS = frozenset(
    {
        "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "Attention",
        "LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization",
        "LSTM", "GRU", "RNN",
    }
)


def _is_heavy(domain: str, op_type: str) -> bool:
    return op_type in _HEAVY_OPS or domain not in ONNX_DOMAINS


# Outputs that stay float32 whatever the input type (statistics in the stash type),
# by the op type the target runs.
_STAT_OUTPUTS: dict[str, frozenset[int]] = {
    "LayerNormalization": frozenset({1, 2}),
    "SimplifiedLayerNormalization": frozenset({1}),
    "SkipLayerNormalization": frozenset({1, 2}),
    "SkipSimplifiedLayerNormalization": frozenset({1, 2}),
}

# Inputs a kernel reads as float32 whatever the type of the others, by the op the target
# runs: the CUDA GroupNorm reads gamma and beta with Data<float>() (contrib_ops/cuda/diffusion/
# group_norm.cc), so float16 ones fail at run time; onnxruntime's own float16 converter keeps
# the same inputs (transformers/float16.py, ALWAYS_FLOAT_INPUTS).
_FLOAT32_INPUTS: dict[tuple[str, str], frozenset[int]] = {
    (MS_DOMAIN, "GroupNorm"): frozenset({1, 2}),
    (MS_DOMAIN, "SkipGroupNorm"): frozenset({1, 2}),
}

_FLOAT = ir.DataType.FLOAT


def parse_precision(name: str | None) -> str | None:
    """"fp16" / "bf16" (case-insensitive), or None for "fp32" / None; else a GraphoptError."""
    if name is None:
        return None
    key = str(name).strip().lower()
    if key not in PRECISIONS:
        raise GraphoptError(f"unknown precision '{name}' (known: {', '.join(PRECISIONS)})")
    return None if key == "fp32" else key


@lru_cache(maxsize=2048)
def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


@lru_cache(maxsize=2048)
def _schema_takes(op_type: str, opset: int, low_type: str) -> bool:
    """Does the standard op take the low type for some type parameter that takes float32?"""
    schema = _schema(op_type, opset)
    if schema is None:
        return True  # not a standard op (e.g. SimplifiedLayerNormalization): the target table decides
    return any("tensor(float)" in c.allowed_type_strs and low_type in c.allowed_type_strs for c in schema.type_constraints)


@dataclass(frozen=True)
class PrecisionPlan:
    """The conversion asked for: the low type and what stays float32.

    The rewrite driver consults it while rules run (in float32) so that a rule does
    not emit a fused op the target cannot run in the type it will have afterwards."""

    precision: str  # "fp16" or "bf16"
    #: The user's additions to the block list: op types ("Gemm", "com.microsoft.Gelu"), node or output names.
    keep: frozenset[str] = frozenset()
    #: Node or output names the range check keeps in float32 (`range_checked_plan`).
    range_keep: frozenset[str] = frozenset()

    @classmethod
    def make(cls, precision: str | None, keep: Iterable[str] = ()) -> PrecisionPlan | None:
        parsed = parse_precision(precision)
        return None if parsed is None else cls(parsed, frozenset(k for k in keep if k))

    @property
    def low(self) -> str:
        """The low type's short name: f16 or bf16."""
        return _LOW[self.precision][0]

    @property
    def low_type(self) -> ir.DataType:
        return _LOW[self.precision][1]

    def blocks_op(self, domain: str, op_type: str, target: Target | None = None) -> bool:
        """Is the op on the block list (the default one, or the user's, by any of its names)?"""
        if domain in ONNX_DOMAINS and op_type in DEFAULT_KEEP_FP32:
            return True
        return bool(self.keep and _op_names(domain, op_type, target) & self.keep)

    def cannot_run_low(self, target: Target, domain: str, op_type: str, opset: int | None) -> str | None:
        """Why the target cannot run this op in the low type (None if it can)."""
        if op_type in _ATTRIBUTE_TYPED and domain in ONNX_DOMAINS:
            return f"{op_type}'s output type is set by an attribute"
        reason = target.why_not(domain, op_type, self.low, opset)
        if reason is not None:
            return reason
        lowered_domain, lowered_op = target.lowered(domain, op_type)
        if lowered_domain in ONNX_DOMAINS and not _schema_takes(lowered_op, opset or onnx.defs.onnx_opset_version(), _LOW[self.precision][2]):
            return f"{lowered_op} does not take {self.low} at opset {opset}"
        return None

    def runs_low(self, target: Target, domain: str, op_type: str, dtype: str | None, opset: int | None) -> bool:
        """Would a node of this op, reading `dtype`, run in the low type after conversion?"""
        return dtype == "f32" and not self.blocks_op(domain, op_type, target) and self.cannot_run_low(target, domain, op_type, opset) is None

    def fusion_problem(
        self,
        target: Target,
        domain: str,
        op_type: str,
        dtype: str | None,
        opset: int | None,
        matched: Sequence[tuple[str, str, str | None]],
    ) -> str | None:
        """The driver's capability check for a node a rewrite would emit, in the type it
        will run in after conversion. `matched` lists (domain, op, dtype) of the nodes the
        rewrite replaces: a fused op the target has only in float32 is refused when it
        would pull the heavy ops it replaces (`_HEAVY_OPS`: Conv, MatMul, normalizations,
        fused ops), which could run in the low type, back to float32. Activations,
        elementwise and layout ops do not count: Conv+BatchNormalization folded into a
        Conv that stays float32 is still a gain."""
        if self.runs_low(target, domain, op_type, dtype, opset):
            return None  # its low-type kernel exists (checked by runs_low)
        if dtype == "f32" and not self.blocks_op(domain, op_type, target):
            why = self.cannot_run_low(target, domain, op_type, opset)
            if any(_is_heavy(d, o) and self.runs_low(target, d, o, t, opset) for d, o, t in matched):
                return f"{why}: with --precision {self.precision} it would keep in f32 ops that run in {self.low}"
        return target.why_not(domain, op_type, dtype, opset)


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
        if domain in ONNX_DOMAINS and node.op_type in DEFAULT_KEEP_FP32:
            return "block_list", None
        if any(v.dtype is None for v in node.outputs) or any(v is not None and self.dtype(v) is None for v in node.inputs):
            return "unknown_type", None
        if self.plan.cannot_run_low(self.target, domain, node.op_type, self.opset) is not None:
            return ("attribute_type" if node.op_type in _ATTRIBUTE_TYPED else "no_kernel"), None
        ins, outs = self._positions(node, domain, f32_in, f32_out)
        if not ins and not outs:
            return "no_kernel", None
        readers = [node.inputs[i] for i in ins if not self.is_const(node.inputs[i])]  # type: ignore[arg-type]
        if not outs:
            # It only reads floats (Shape, IsNaN, Cast to int, comparisons): it takes its inputs' type.
            if readers and all(id(v) in self.low_values for v in readers):
                return None, _Decision(ins, outs)
            return "follows_fp32", None
        if node.op_type in _FOLLOW_INPUTS and domain in ONNX_DOMAINS and readers and all(id(v) in self.fp32_values for v in readers):
            return "follows_fp32", None
        return None, _Decision(ins, outs)

    def _positions(self, node: ir.Node, domain: str, f32_in: tuple[int, ...], f32_out: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        lowered_domain, lowered_op = self.target.lowered(domain, node.op_type)
        fixed = _STAT_OUTPUTS.get(lowered_op, frozenset())
        f32_in = tuple(i for i in f32_in if i not in _FLOAT32_INPUTS.get((lowered_domain, lowered_op), frozenset()))
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
        if index in _STAT_OUTPUTS.get(target.lowered(domain, node.op_type)[1], frozenset()):
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


def _formal(formals: Sequence[Any], i: int) -> Any:
    if i < len(formals):
        return formals[i]
    if formals and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return formals[-1]
    return None


def _op_names(domain: str, op_type: str, target: Target | None) -> set[str]:
    """The names a user may give an op by: "Gelu", "graphopt.Gelu", "com.microsoft.Gelu"."""
    domain = "" if domain == "ai.onnx" else domain
    names = {op_type, f"{domain}.{op_type}" if domain else op_type}
    if target is not None and domain:
        lowered_domain, lowered_op = target.lowered(domain, op_type)
        names |= {lowered_op, f"{lowered_domain}.{lowered_op}" if lowered_domain else lowered_op}
    return names


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


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in ONNX_DOMAINS else f"{node.domain}.{node.op_type}"


# ---------------------------------------------------------------- range check (fp16)

#: A value whose magnitude exceeds this (half of float16's largest, 65504) keeps the nodes
#: that read or write it in float32: headroom for inputs larger than the calibration's.
FP16_SAFE_MAX = 0.5 * 65504.0
#: A tensor whose every non-zero value is below float16's smallest normal number would be
#: held in subnormals (a few bits of precision) or flushed to zero.
FP16_SMALLEST_NORMAL = 2.0**-14
#: The range check runs the model (twice, on copies) on the CPU: not for models with more weights than this.
RANGE_CHECK_MAX_BYTES = 4 << 30
#: Rounds of "convert, run, keep the nodes that made a finite value non-finite".
MAX_RANGE_ROUNDS = 6


def _node_key(node: ir.Node) -> str:
    """The name a plan keeps a node by: its own, else its first output's."""
    return node.name or next((v.name for v in node.outputs if v.name), "")


def _copy_with_origins(model: ir.Model) -> tuple[ir.Model, dict[int, ir.Node]]:
    """A deep copy of `model`, and for each main-graph node of the copy the original node."""
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    return copy, {id(c): o for c, o in zip(copy.graph, model.graph)}


def _run_exposed(model: ir.Model, feeds: dict[str, np.ndarray], dtypes: frozenset[ir.DataType]) -> dict[str, np.ndarray]:
    """Run `model` on onnxruntime's CPU provider with every main-graph node output of one of
    `dtypes` exposed as a graph output; returns every value by name."""
    import onnxruntime as ort

    outputs = list(model.graph.outputs)
    names = {v.name for v in outputs}
    for node in model.graph:
        for value in node.outputs:
            if value.name and value.name not in names and value.dtype in dtypes:
                model.graph.outputs.append(value)
                names.add(value.name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    session = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    arrays = session.run(None, {k: v for k, v in feeds.items() if k in wanted})
    result = dict(zip([o.name for o in session.get_outputs()], arrays))
    result.update({k: v for k, v in feeds.items()})
    return result


def _calibration_feeds(model: ir.Model, path: Any) -> tuple[dict[str, np.ndarray], str]:
    from graphopt.inputs import _inputs, _resolve_shapes, make_inputs

    if path is None:
        return make_inputs(model, _resolve_shapes(model.graph, {}), seed=0), "random inputs from the input specs"
    try:
        with np.load(path, allow_pickle=False) as data:
            feeds = {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError) as error:
        raise GraphoptError(f"--calibration-data {path}: cannot read it as an .npz of input arrays: {error}") from None
    expected = {name for name, _ in _inputs(model.graph)}
    if set(feeds) != expected:
        raise GraphoptError(
            f"--calibration-data {path}: it holds {', '.join(sorted(feeds)) or 'no arrays'}; the model's inputs are {', '.join(sorted(expected))}"
        )
    return feeds, f"calibration inputs from {path}"


#: Values this large stand for infinity (an attention mask filled with float32's lowest,
#: -3.4e38): not a range the computation reaches. In float16 they become +-65504 (a constant
#: is clamped) or +-inf, which a softmax or a Max treats the same; the float16 run checks it.
MASK_FILL = 1e30


def _max_abs(array: np.ndarray) -> float:
    """The largest finite magnitude below MASK_FILL."""
    magnitude = np.abs(np.asarray(array, dtype=np.float64))
    return float(magnitude[np.isfinite(magnitude) & (magnitude < MASK_FILL)].max(initial=0.0))


def range_checked_plan(
    model: ir.Model, target: Target, plan: PrecisionPlan, calibration: Any = None, *, say: Callable[[str], None] | None = None
) -> tuple[PrecisionPlan, list[Any], str]:
    """The plan with `range_keep` set: the nodes whose float32 values, measured on the
    calibration inputs, do not fit float16 (above `FP16_SAFE_MAX`, or wholly below its
    smallest normal number), and then, converting a copy and running it, every node that
    turned a finite value non-finite, until the model's outputs are finite wherever the
    float32 model's are. Returns (plan, the kept nodes as RangeKeep records, a note on the
    inputs used, or why the check could not run)."""
    from graphopt.ops.lowering import lower_fused_ops
    from graphopt.report.model import RangeKeep

    say = say or (lambda message: None)
    weights = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    if weights > RANGE_CHECK_MAX_BYTES:
        return plan, [], f"range check skipped: the model's {weights / 2**30:.1f} GiB of weights are more than it runs on the CPU ({RANGE_CHECK_MAX_BYTES / 2**30:.0f} GiB)"
    say("precision: range check (float32 run)")
    try:
        feeds, note = _calibration_feeds(model, calibration)
    except GraphoptError:
        raise
    except Exception as error:  # noqa: BLE001 - e.g. an input whose shape cannot be resolved
        return plan, [], f"range check skipped: no inputs to run the model on ({str(error).splitlines()[0][:200]})"
    reference, _ = _copy_with_origins(model)
    lower_fused_ops(reference, target)
    try:
        values = _run_exposed(reference, feeds, frozenset({_FLOAT}))
    except Exception as error:  # noqa: BLE001 - onnxruntime raises its own types
        return plan, [], f"range check skipped: the float32 model does not run on onnxruntime's CPU provider ({str(error).splitlines()[0][:200]})"
    peak = {name: _max_abs(a) for name, a in values.items() if np.asarray(a).dtype.kind == "f"}
    kept: dict[str, RangeKeep] = {}
    for node in model.graph:
        floats = [v for v in (*node.inputs, *node.outputs) if v is not None and v.name in peak and not _Converter.is_const(v)]
        if not floats:
            continue
        biggest = max(peak[v.name or ""] for v in floats)
        tiny = [v for v in node.outputs if v.name in peak and 0.0 < peak[v.name or ""] < FP16_SMALLEST_NORMAL]
        if biggest > FP16_SAFE_MAX:
            kept[_node_key(node)] = RangeKeep(_node_key(node), _op_name(node), "overflow", biggest)
        elif tiny:
            kept[_node_key(node)] = RangeKeep(_node_key(node), _op_name(node), "underflow", max(peak[v.name or ""] for v in tiny))
    outputs_finite = {v.name: np.isfinite(values[v.name or ""]) for v in model.graph.outputs if v.name in values}
    for round_ in range(MAX_RANGE_ROUNDS):
        say(f"precision: range check ({plan.precision} run {round_ + 1})")
        trial_plan = dataclasses.replace(plan, range_keep=frozenset(kept))
        copy, origin = _copy_with_origins(model)
        convert_precision(copy, target, trial_plan)
        lower_fused_ops(copy, target)
        _emulate_low(copy, plan.low_type, origin)
        try:
            low_values = _run_exposed(copy, feeds, frozenset({_FLOAT}))
        except Exception as error:  # noqa: BLE001
            return trial_plan, list(kept.values()), f"{note}; the {plan.precision} check did not run on onnxruntime's CPU provider ({str(error).splitlines()[0][:200]})"
        broken = [
            name for name, finite in outputs_finite.items()
            if name in low_values and bool(np.any(finite & ~np.isfinite(np.asarray(low_values[name or ""], dtype=np.float64))))
        ]
        if not broken:
            return trial_plan, list(kept.values()), note
        culprits = _culprits(copy, origin, low_values, values)
        new = [n for n in culprits if _node_key(n) not in kept]
        if not new:
            return trial_plan, list(kept.values()), f"{note}; outputs {', '.join(map(str, broken))} are still not finite in {plan.precision} (no node left to keep)"
        for node in new:
            read = [_max_abs(values[v.name]) for v in node.inputs if v is not None and v.name in values and np.asarray(values[v.name]).dtype.kind == "f"]
            kept[_node_key(node)] = RangeKeep(_node_key(node), _op_name(node), "non_finite", max(read, default=None))
    return dataclasses.replace(plan, range_keep=frozenset(kept)), list(kept.values()), f"{note}; gave up after {MAX_RANGE_ROUNDS} rounds"


def _emulate_low(model: ir.Model, low: ir.DataType, origin: dict[int, ir.Node]) -> None:
    """Make the converted model run its low-type arithmetic on onnxruntime's CPU provider
    faithfully: every node computes in float32 and each value it writes in the low type is
    rounded through Cast(low) -> Cast(float) (the CPU provider would otherwise run whole
    regions in float32 without rounding in between, hiding overflows). The rounded value
    keeps the name; `origin` maps the rounding Casts to the node they round for."""
    graph = model.graph
    made = 0
    for value in list(graph.initializers.values()):
        if value.dtype == low and value.const_value is not None:
            value.const_value = ir.tensor(value.const_value.numpy().astype(np.float32), name=value.name)
            value.type = ir.TensorType(_FLOAT)
    for value in graph.inputs:
        if value.dtype == low:
            return  # a model whose inputs are low-type already: nothing to emulate against
    for node in list(graph):
        if node.op_type == "Constant" and "value" in node.attributes:
            tensor = node.attributes["value"].value
            if isinstance(tensor, ir.TensorProtocol) and tensor.dtype == low:
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(tensor.numpy().astype(np.float32)))
        if node.op_type == "Cast" and node.domain in ONNX_DOMAINS and node.attributes.get_int("to") == int(low):
            node.attributes["to"] = ir.AttrInt64("to", int(_FLOAT))
        for out in node.outputs:
            if out.dtype != low or not out.name:  # an unnamed output is not produced
                continue
            out.type = ir.TensorType(_FLOAT)
            made += 1  # node names must be unique: a node may write several low-type outputs
            down = ir.Node("", "Cast", [out], [ir.AttrInt64("to", int(low))], name=f"__graphopt_round_low{made}")
            up = ir.Node("", "Cast", [down.outputs[0]], [ir.AttrInt64("to", int(_FLOAT))], name=f"__graphopt_round_up{made}")
            down.outputs[0].type = ir.TensorType(low)
            up.outputs[0].type = ir.TensorType(_FLOAT)
            name = out.name
            out.name = f"{name}__unrounded"
            out.replace_all_uses_with(up.outputs[0], replace_graph_outputs=True)
            down.replace_input_with(0, out)
            up.outputs[0].name = name
            down.outputs[0].name = f"{name}__low"
            graph.insert_after(node, [down, up])
            if id(node) in origin:
                origin[id(down)] = origin[id(up)] = origin[id(node)]


def emulate_low_precision(model: ir.Model, low: ir.DataType = ir.DataType.FLOAT16) -> ir.Model:
    """A copy of a converted model that onnxruntime's CPU provider runs with the low type's
    rounding and range after every node (see `_emulate_low`): what a GPU computing in the
    low type would store. The CPU provider's own float16 support computes regions of ops
    in float32 without rounding in between, so it does not show float16 overflow."""
    copy, _ = _copy_with_origins(model)
    if any(v.dtype is None for n in copy.graph for v in n.outputs):
        from graphopt.passes.shapes import infer_shapes

        try:
            infer_shapes(copy)  # only values of a known type can be rounded
        except Exception:  # noqa: BLE001, S110 - what stays untyped is run as it is
            pass
    _emulate_low(copy, low, {})
    return copy


def _culprits(copy: ir.Model, origin: dict[int, ir.Node], low: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> list[ir.Node]:
    """Original nodes where a value became non-finite in the low type though its float32
    value is finite and the node's own float inputs are finite. A Cast the conversion
    made (a value too large for the low type) points at the nodes reading it."""

    def finite(value: ir.Value | None) -> bool:
        return value is None or value.name not in low or bool(np.isfinite(np.asarray(low[value.name or ""], dtype=np.float64)).all())

    def readers(value: ir.Value) -> list[ir.Node]:
        """The first nodes with an origin downstream of `value`, through nodes that have none."""
        found, stack, seen = [], [value], set()
        while stack:
            for use in stack.pop().uses():
                if id(use.node) in seen:
                    continue
                seen.add(id(use.node))
                if id(use.node) in origin:
                    found.append(origin[id(use.node)])
                else:
                    stack.extend(use.node.outputs)
        return found

    found: list[ir.Node] = []
    for node in copy.graph:
        turned = [
            v for v in node.outputs
            if v.name in low and not finite(v) and (v.name not in reference or np.isfinite(np.asarray(reference[v.name or ""], dtype=np.float64)).all())
        ]
        if not turned or not all(finite(v) for v in node.inputs):
            continue
        candidates = [origin[id(node)]] if id(node) in origin else [r for v in turned for r in readers(v)]
        found.extend(c for c in candidates if c not in found)
    return found
