"""NHWC layout for onnxruntime's CUDA provider (``--target ort-cuda``).

cuDNN's fastest convolutions (tensor cores, float16 and TF32) read and write NHWC;
an NCHW model makes them convert layouts inside every Conv. onnxruntime's CUDA
provider has NHWC kernels for what matters in a CNN: com.microsoft.NhwcConv
(float32/float16; X and Y NHWC, W stays [M, C/group, kH, kW]) and
com.microsoft.GroupNorm (which runs *only* in NHWC, ``channels_last = 1``).

The pass, on the main graph, after lowering:

1. **Decide** (forward, in topological order) which nodes run in NHWC:
   *anchors* that have an NHWC kernel (Conv -> NhwcConv; com.microsoft.FusedConv,
   whose CUDA kernel is NCHW only, split into NhwcConv + Add(Z) + activation, see
   `LayoutOptions.fused_conv`; com.microsoft.GroupNorm, always, since its kernel
   has no NCHW form), then every *layout-agnostic* node (elementwise ops, Clip,
   Reduce* with constant axes, Concat/Split, GlobalAverage/MaxPool as Reduce over
   H, W) whose 4-D inputs mostly already are NHWC: constants are permuted once,
   a remaining NCHW input gets a Transpose.
2. **Rewrite**: each chosen node is rebuilt on the NHWC values; where an NCHW
   consumer (or a graph output) still reads a value, a Transpose back is added.
3. **Clean up**: Transpose pairs that meet cancel (a chain folds into one
   permutation; the identity disappears), Transposes that only move size-1 axes
   become Reshapes, dead nodes go.

MaxPool / AveragePool have no public NHWC op: they stay NCHW between a Transpose
pair unless `LayoutOptions.internal_nhwc_pools` puts them in onnxruntime's internal
``com.ms.internal.nhwc`` domain (the kernels its own layout transformer uses;
registered by the CUDA provider when built with NHWC ops). That domain is not a
public contract, so it is off by default until checked on the GPU machine.

**NhwcConv or FusedConv, and where the bias goes: decisions, not rules.** onnxruntime's
CUDA Conv adds its bias with cudnnAddTensor, a separate kernel that took 1.25 ms of the
2.9 ms GPU time of ResNet-50 b32 in float16 (CUPTI kernel profile, H200,
onnxruntime-gpu 1.31.1); a bias-free NhwcConv followed by an ordinary Add of the bias ran
ResNet-50 b32 in 2.60 ms against 3.25 ms with the bias in the conv (float32: 4.05 ms
against 4.31 ms for the NCHW graph with FusedConv). But the same NHWC + Add form cost
6-21 % on MobileNetV3-style models (depthwise convolutions, decomposed HardSwish,
squeeze-excite; issue 14). So "auto" is a decision (graphopt.decisions): the candidates
"nchw" (the baseline), "nhwc-add" and "nhwc-kernel" are compared on the shipped cost
table by the shape class of every convolution (dense / depthwise / grouped, kernel size,
channels, batch, dtype) and NHWC is chosen only where the table predicts it faster for
all of them; a convolution class nobody measured keeps the model NCHW. "nchw" is the model
as it is: each convolution is read in the form it has (a Conv + activation the fused_conv
decision left is read from that decision's figures, `_layout_readings`), and NHWC needs at
least the measured blocks' convolutions per Transpose it adds. With `--tune`
and the CUDA provider present, the whole model is timed in each form instead.
`conv_bias="add"`/`"kernel"` and `layout="nhwc"` force the choice; `auto_dtypes` limits
the dtypes "auto" considers, and `fused_conv="keep"` keeps FusedConv inside an NHWC
graph, between Transposes.

`emulate_nhwc_ops` rewrites the NHWC-only ops into standard ops (Transpose +
NCHW op + Transpose) so the result can be checked on onnxruntime's CPU provider,
which has none of them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.ir.onnx_view import dtype_name
from graphopt.ops.targets import MS_DOMAIN, Target
from graphopt.report.model import LayoutSummary

__all__ = ["LayoutOptions", "convert_layout", "emulate_nhwc_ops", "NHWC_DOMAIN", "TO_NHWC", "TO_NCHW"]

NHWC_DOMAIN = "com.ms.internal.nhwc"
#: "auto" converts a model only when it has at least this many convolutions per Transpose the
#: NHWC layout adds at its boundaries: the cost table's NHWC figures were measured on blocks of
#: 6 convolutions with 2 boundary Transposes (benchmarks/decisions_bench.py), so a model with
#: more Transposes per convolution than that is outside what was measured (ResNet-50: 53 for 4;
#: MobileNetV2: 52 for 2; a ViT's patch embedding: 1 for 2, and a 3-convolution CRNN stem: 3
#: for 2, left NCHW). Transposes NCHW needs anyway (around a UNet's GroupNorms) do not count.
AUTO_CONVS_PER_TRANSPOSE = 3
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
_ONNX = ("", "ai.onnx")


@dataclass(frozen=True)
class LayoutOptions:
    #: "nhwc": convert; "nchw": keep NCHW (only ops that exist solely in NHWC, GroupNorm,
    #: get Transposes around them); "auto": a decision (graphopt.decisions) between NCHW
    #: and NHWC for the model's Convs of the `auto_dtypes`, from the cost table (or timed,
    #: with --tune); NHWC also needs more Convs than the Transposes the NHWC region adds at
    #: its boundaries (`AUTO_CONVS_PER_TRANSPOSE`).
    mode: str = "auto"
    #: The dtypes whose Convs "auto" considers for NHWC (the cost table decides which of
    #: them win). Set to {"f16", "bf16"} to keep float32 models NCHW with FusedConv.
    auto_dtypes: frozenset[str] = frozenset({"f32", "f16", "bf16"})
    #: What NHWC does with a com.microsoft.FusedConv (NCHW-only kernel): "unfuse" into
    #: NhwcConv + Add(Z) + activation, or "keep" it NCHW between Transposes.
    fused_conv: str = "unfuse"
    #: Run MaxPool/AveragePool/GlobalMaxPool in onnxruntime's internal NHWC domain.
    internal_nhwc_pools: bool = False
    #: Where NhwcConv's bias is added: "kernel" (its bias input: the CUDA kernel adds it
    #: with cudnnAddTensor, a separate kernel), "add" (a bias-free NhwcConv followed by an
    #: elementwise Add of the bias, onnxruntime's own broadcast kernel) or "auto" (a
    #: decision from the cost table; "kernel", which changes nothing, where it has no entry).
    conv_bias: str = "auto"


# ----------------------------------------------------------------------------- op classes

_UNARY = frozenset(
    {
        "Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "Gelu",
        "Erf", "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Softplus", "Softsign", "Mish", "Identity",
        "Cast", "Floor", "Ceil", "Round", "Sign", "Not", "IsNaN", "IsInf", "ThresholdedRelu", "Sin", "Cos",
        "Clip", "Dropout",
    }
)
_BROADCAST = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Where", "Mod",
        "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "BitShift",
    }
)
_MS_ELEMENTWISE = frozenset({"QuickGelu", "Gelu"})
_REDUCE = frozenset(
    {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
     "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
)
# Opset from which a Reduce op takes `axes` as an input instead of an attribute.
_AXES_INPUT_FROM = {"ReduceSum": 13}
_GLOBAL_POOL = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
_INTERNAL_POOLS = frozenset({"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"})
_FUSED_ACTIVATIONS = frozenset({"Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid"})


# ----------------------------------------------------------------------------- helpers


def _uses(value: ir.Value) -> list[Any]:
    """The uses of a value by nodes in a graph (a rewrite the driver built and then
    refused can leave a detached node registered as a user)."""
    return [u for u in value.uses() if u.node.graph is not None]


def _x(node: ir.Node, index: int = 0) -> ir.Value:
    """An input the op requires (present in any valid model)."""
    value = node.inputs[index]
    assert value is not None, f"{node.op_type} {node.name} has no input {index}"
    return value


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _dtype(value: ir.Value | None) -> str | None:
    if value is None or value.type is None:
        return None
    return dtype_name(value.type.dtype)


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in _ONNX and "value" in producer.attributes:
        return producer.attributes["value"].value.numpy()
    return None


def _is_scalar(value: ir.Value) -> bool:
    shape = value.shape
    return shape is not None and all(isinstance(d, int) and d == 1 for d in shape)


def _attr(node: ir.Node, name: str, default: Any = None) -> Any:
    attr = node.attributes.get(name)
    if attr is None or attr.is_ref():
        return default
    value = attr.value
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def _permute_shape(shape: ir.Shape | None, perm: Sequence[int]) -> ir.Shape | None:
    if shape is None or len(shape) != len(perm):
        return None
    return ir.Shape([shape[i] for i in perm])


def _nhwc_axis(axis: int, rank: int = 4) -> int:
    """Where NCHW axis `axis` is in NHWC."""
    return TO_NHWC.index(axis % rank)


class _Builder:
    """Makes uniquely named nodes, values and initializers in one graph."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.graph = model.graph
        self.names: set[str] = {v.name for v in self.graph.inputs if v.name}
        self.names.update(self.graph.initializers)
        for node in ir.traversal.RecursiveGraphIterator(self.graph):
            self.names.update(v.name for v in node.outputs if v.name)
            if node.name:
                self.names.add(node.name)
        self.counter = 0

    def fresh(self, hint: str) -> str:
        while True:
            self.counter += 1
            name = f"{hint}__nhwc{self.counter}"
            if name not in self.names:
                self.names.add(name)
                return name

    def node(self, domain: str, op_type: str, inputs: Sequence[ir.Value | None], attrs: dict[str, Any] | None = None,
             hint: str = "", num_outputs: int = 1) -> ir.Node:
        attributes = []
        for key, value in (attrs or {}).items():
            if isinstance(value, ir.Attr):
                attributes.append(ir.Attr(key, value.type, value.value, ref_attr_name=value.ref_attr_name))
            else:
                attributes.append(ir.convenience.convert_attribute(key, value))
        name = self.fresh(hint or op_type)
        node = ir.Node(domain, op_type, list(inputs), attributes, num_outputs=num_outputs, name=name)
        for i, out in enumerate(node.outputs):
            out.name = self.fresh(f"{name}_out{i}") if num_outputs > 1 else name
        return node

    def constant(self, array: np.ndarray, hint: str) -> ir.Value:
        name = self.fresh(hint)
        tensor = ir.tensor(np.ascontiguousarray(array), name=name)
        value = ir.Value(name=name, const_value=tensor, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype))
        self.graph.register_initializer(value)
        return value


def _detach_and_remove(graph: ir.Graph, nodes: Iterable[ir.Node]) -> None:
    for node in nodes:
        if node.graph is None:
            continue
        for i in range(len(node.inputs)):
            node.replace_input_with(i, None)
        graph.remove(node)


# ----------------------------------------------------------------------------- the pass


class _Layout:
    def __init__(self, model: ir.Model, target: Target, options: LayoutOptions, summary: LayoutSummary) -> None:
        self.model = model
        self.graph = model.graph
        self.target = target
        self.options = options
        self.summary = summary
        self.b = _Builder(model)
        self.opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        self.nhwc_conv_dtypes = target.kernels.get((MS_DOMAIN, "NhwcConv"), frozenset())

    # ------------------------------------------------------------- what can run NHWC
    def anchor(self, node: ir.Node, nhwc: bool) -> bool:
        """Nodes that have an NHWC kernel of their own."""
        if node.domain == MS_DOMAIN and node.op_type == "GroupNorm":
            return _attr(node, "channels_last", 1) == 0 and _rank(node.inputs[0]) in (4, None)
        if not nhwc:
            return False
        if (node.domain in _ONNX and node.op_type == "Conv") or (
            node.domain == MS_DOMAIN and node.op_type == "FusedConv" and self.options.fused_conv == "unfuse"
        ):
            x = node.inputs[0]
            if _rank(x) != 4 or _dtype(x) not in self.nhwc_conv_dtypes:
                return False
            if node.op_type == "FusedConv":
                activation = _attr(node, "activation")
                return activation is None or activation in _FUSED_ACTIVATIONS
            return True
        return False

    def agnostic(self, node: ir.Node, nhwc_values: set[int]) -> bool:
        """Nodes that compute the same thing in either layout (given permuted constants),
        worth moving to NHWC: at least half of their 4-D inputs already are."""
        kind = self.kind(node)
        if kind is None:
            return False
        data = self.data_inputs(node)
        if not data or any(_rank(v) != 4 for v in data) or not any(id(v) in nhwc_values for v in data):
            return False
        if kind in ("pool", "internal_pool"):
            if len(node.outputs) > 1 and _uses(node.outputs[1]):
                return False  # MaxPool's Indices
            return _dtype(data[0]) in ("f32", "f16")
        if kind == "reduce" and self.reduce_axes(node) is None:
            return False
        if kind in ("broadcast", "concat"):
            for v in node.inputs:
                if v is None or any(v is d for d in data) or (kind == "broadcast" and _is_scalar(v)):
                    continue
                array = _const(v)
                if array is None or array.ndim > 4 or (kind == "concat" and array.ndim != 4):
                    return False
        if kind == "unary" and any(v is not None and _const(v) is None and not _is_scalar(v) for v in node.inputs[1:]):
            return False  # a unary op's other inputs are scalar parameters (Clip bounds, Dropout ratio)
        inside = sum(1 for v in data if id(v) in nhwc_values)
        return inside >= len(data) - inside

    def kind(self, node: ir.Node) -> str | None:
        op, domain = node.op_type, node.domain
        if domain in _ONNX:
            if self.options.internal_nhwc_pools and op in _INTERNAL_POOLS:
                return "internal_pool"
            if op in _GLOBAL_POOL:
                return "pool"
            if op in _UNARY:
                return "unary"
            if op in _BROADCAST:
                return "broadcast"
            if op in _REDUCE:
                return "reduce"
            if op == "Concat":
                return "concat"
            if op == "Split":
                return "split"
        elif domain == MS_DOMAIN and op in _MS_ELEMENTWISE and len(node.inputs) == 1:
            return "unary"
        return None

    def data_inputs(self, node: ir.Node) -> list[ir.Value]:
        """The inputs that carry the activation layout (non-constant, not scalar)."""
        if self.kind(node) in ("broadcast", "concat"):
            return [v for v in node.inputs if v is not None and _const(v) is None and not _is_scalar(v)]
        first = node.inputs[0] if node.inputs else None
        return [] if first is None or _const(first) is not None else [first]

    def reduce_axes(self, node: ir.Node) -> list[int] | None:
        axes: Any = _attr(node, "axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            array = _const(node.inputs[1])
            axes = None if array is None else [int(a) for a in array.reshape(-1)]
        if not axes:
            return None
        axes = sorted({int(a) % 4 for a in axes})
        if not _attr(node, "keepdims", 1):
            # Without keepdims the output is NHWC-free only if the kept axes keep their order.
            kept = [a for a in range(4) if a not in axes]
            if [_nhwc_axis(a) for a in kept] != sorted(_nhwc_axis(a) for a in kept):
                return None
        return axes

    def output_is_nhwc(self, node: ir.Node) -> bool:
        if node.op_type in _REDUCE and not _attr(node, "keepdims", 1):
            return False
        return True

    # ------------------------------------------------------------- run
    def plan(self, nhwc: bool) -> list[ir.Node]:
        """The nodes to run in NHWC, in graph order."""
        chosen: list[ir.Node] = []
        nhwc_values: set[int] = set()
        for node in self.graph:
            if self.anchor(node, nhwc) or self.agnostic(node, nhwc_values):
                chosen.append(node)
                if self.output_is_nhwc(node):
                    nhwc_values.update(id(o) for o in node.outputs)
        return chosen

    def boundary(self, chosen: list[ir.Node]) -> int:
        """How many Transposes the plan needs (before pairs cancel or become Reshapes)."""
        ids = set(map(id, chosen))
        made = {id(o) for n in chosen if self.output_is_nhwc(n) for o in n.outputs}
        into = {id(v) for n in chosen for v in self.data_inputs(n) if id(v) not in made}
        out = sum(
            1
            for n in chosen
            if self.output_is_nhwc(n)
            for o in n.outputs
            if o.is_graph_output() or any(id(u.node) not in ids for u in _uses(o))
        )
        return len(into) + out

    def run(self, chosen: list[ir.Node]) -> int:
        if not chosen:
            return 0
        self.nhwc_of: dict[int, ir.Value] = {}  # old 4-D value -> its NHWC replacement
        plain_of: dict[int, ir.Value] = {}  # old value -> a layout-free replacement (Reduce without keepdims)
        self.to_nhwc_cache: dict[int, ir.Value] = {}
        self.permuted_cache: dict[int, ir.Value] = {}
        made_by: dict[int, ir.Node] = {}  # NHWC value -> the node that makes it
        for node in chosen:
            new_nodes, outputs = self.rebuild(node)
            self.graph.insert_before(node, new_nodes)
            nhwc_out = self.output_is_nhwc(node)
            for old, new in zip(node.outputs, outputs):
                if new is None:
                    continue
                new.type = old.type
                new.shape = _permute_shape(old.shape, TO_NHWC) if nhwc_out else old.shape
                (self.nhwc_of if nhwc_out else plain_of)[id(old)] = new
                made_by[id(new)] = new.producer() or new_nodes[-1]
            key = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            self.summary.converted[key] = self.summary.converted.get(key, 0) + 1
        chosen_ids = set(map(id, chosen))
        for node in chosen:
            for old in node.outputs:
                new = self.nhwc_of.get(id(old)) or plain_of.get(id(old))
                if new is None:
                    continue
                outside = [u for u in _uses(old) if id(u.node) not in chosen_ids]
                if not outside and not old.is_graph_output():
                    continue
                if id(old) in self.nhwc_of:
                    t = self.b.node("", "Transpose", [new], {"perm": list(TO_NCHW)}, hint=f"{old.name or 'v'}_to_nchw")
                    self.graph.insert_after(made_by[id(new)], t)
                    self.summary.transposes_inserted += 1
                    replacement = t.outputs[0]
                else:
                    replacement = new
                replacement.type, replacement.shape = old.type, old.shape
                name = old.name
                old.name = self.b.fresh(name or "old")
                old.replace_all_uses_with(replacement, replace_graph_outputs=True)
                if name:
                    replacement.name = name
        _detach_and_remove(self.graph, reversed(chosen))
        return len(chosen)

    # ------------------------------------------------------------- building NHWC nodes
    def to_nhwc(self, value: ir.Value, before: list[ir.Node]) -> ir.Value:
        """The NHWC form of a 4-D value: made by a chosen node, or a Transpose of it."""
        if id(value) in self.nhwc_of:
            return self.nhwc_of[id(value)]
        cached = self.to_nhwc_cache.get(id(value))
        if cached is not None:
            return cached
        t = self.b.node("", "Transpose", [value], {"perm": list(TO_NHWC)}, hint=f"{value.name or 'v'}_to_nhwc")
        t.outputs[0].type = value.type
        t.outputs[0].shape = _permute_shape(value.shape, TO_NHWC)
        before.append(t)
        self.summary.transposes_inserted += 1
        self.to_nhwc_cache[id(value)] = t.outputs[0]
        return t.outputs[0]

    def permuted_constant(self, value: ir.Value) -> ir.Value:
        """A broadcasting constant laid out for NHWC data (rank raised to 4, then transposed)."""
        if _is_scalar(value):
            return value
        cached = self.permuted_cache.get(id(value))
        if cached is not None:
            return cached
        array = _const(value)
        assert array is not None
        if array.size == 1:
            return value
        full = array.reshape((1,) * (4 - array.ndim) + array.shape)
        result = self.b.constant(np.transpose(full, TO_NHWC), f"{value.name or 'const'}_nhwc")
        self.permuted_cache[id(value)] = result
        return result

    def operand(self, value: ir.Value | None, data: list[ir.Value], before: list[ir.Node], permute: bool) -> ir.Value | None:
        if value is None:
            return None
        if any(value is d for d in data):
            return self.to_nhwc(value, before)
        if permute and _const(value) is not None and not _is_scalar(value):
            return self.permuted_constant(value)
        return value

    def rebuild(self, node: ir.Node) -> tuple[list[ir.Node], list[ir.Value | None]]:
        """New nodes computing `node` on NHWC values, and the values standing for its outputs."""
        before: list[ir.Node] = []
        op, domain = node.op_type, node.domain
        if domain == MS_DOMAIN and op == "GroupNorm":
            x = self.to_nhwc(_x(node), before)
            gn_attrs: dict[str, Any] = {k: a for k, a in node.attributes.items() if k != "channels_last"}
            gn_attrs["channels_last"] = ir.AttrInt64("channels_last", 1)
            new = self.b.node(MS_DOMAIN, "GroupNorm", [x, *node.inputs[1:]], gn_attrs, hint=node.name or "GroupNorm")
            return [*before, new], [new.outputs[0]]
        if op in ("Conv", "FusedConv") and (domain in _ONNX or domain == MS_DOMAIN):
            return self.rebuild_conv(node, before)
        if self.kind(node) == "pool":
            x = self.to_nhwc(_x(node), before)
            reduce = _GLOBAL_POOL[op]
            if self.opset >= 18:
                axes = self.b.constant(np.array([1, 2], np.int64), "axes_hw")
                new = self.b.node("", reduce, [x, axes], {"keepdims": 1}, hint=node.name or reduce)
            else:
                new = self.b.node("", reduce, [x], {"axes": [1, 2], "keepdims": 1}, hint=node.name or reduce)
            return [*before, new], [new.outputs[0]]
        if self.kind(node) == "internal_pool":
            x = self.to_nhwc(_x(node), before)
            if NHWC_DOMAIN not in self.model.opset_imports:
                self.model.opset_imports[NHWC_DOMAIN] = self.opset
            new = self.b.node(NHWC_DOMAIN, op, [x], dict(node.attributes), hint=node.name or op, num_outputs=1)
            return [*before, new], [new.outputs[0]]
        data = self.data_inputs(node)
        permute = self.kind(node) in ("broadcast", "concat")  # constants broadcast against (or join) the data
        inputs = [self.operand(v, data, before, permute) for v in node.inputs]
        attrs: dict[str, Any] = dict(node.attributes)
        if op in _REDUCE:
            nhwc_axes = [_nhwc_axis(a) for a in self.reduce_axes(node) or []]
            if "axes" in attrs:
                attrs["axes"] = ir.AttrInt64s("axes", nhwc_axes)
            else:
                inputs[1] = self.b.constant(np.array(nhwc_axes, np.int64), "axes_nhwc")
        elif op in ("Concat", "Split"):
            attrs["axis"] = ir.AttrInt64("axis", _nhwc_axis(int(_attr(node, "axis", 0))))
        new = self.b.node(domain, op, inputs, attrs, hint=node.name or op, num_outputs=len(node.outputs))
        return [*before, new], list(new.outputs)

    def rebuild_conv(self, node: ir.Node, before: list[ir.Node]) -> tuple[list[ir.Node], list[ir.Value | None]]:
        """Conv -> NhwcConv; FusedConv -> NhwcConv, then Add(Z), then its activation."""
        x = self.to_nhwc(_x(node), before)
        conv_attrs = {k: a for k, a in node.attributes.items() if k not in ("activation", "activation_params")}
        w_shape = node.inputs[1].shape if node.inputs[1] is not None else None
        kernel = [d for d in w_shape[2:] if isinstance(d, int)] if w_shape is not None else []
        if "kernel_shape" not in conv_attrs and w_shape is not None and len(kernel) == len(w_shape) - 2:
            # onnxruntime's NhwcConv shape inference reads the kernel from W's last dims
            # (OIHW) unless kernel_shape says it: with our OHWI weights it got [kW, C] and
            # refused the model (Incompatible dimensions). The kernel checks it against OHWI.
            conv_attrs["kernel_shape"] = ir.AttrInt64s("kernel_shape", kernel)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        separate_bias = bias is not None and self.options.conv_bias == "add"
        conv_inputs = [x, self.ohwi_weights(node.inputs[1], before), *([] if separate_bias else [bias] if bias is not None else [])]
        conv = self.b.node(MS_DOMAIN, "NhwcConv", conv_inputs, conv_attrs, hint=node.name or "NhwcConv")
        out_type, out_shape = node.outputs[0].type, _permute_shape(node.outputs[0].shape, TO_NHWC)
        conv.outputs[0].type, conv.outputs[0].shape = out_type, out_shape
        made = [*before, conv]
        y = conv.outputs[0]
        if separate_bias:  # [M] broadcasts over NHWC's last axis as it is
            add = self.b.node("", "Add", [y, bias], hint=f"{conv.name}_bias")
            made.append(add)
            y = add.outputs[0]
            y.type, y.shape = out_type, out_shape
        if node.op_type == "FusedConv":
            self.summary.fused_convs_split += 1
            z = node.inputs[3] if len(node.inputs) > 3 else None
            if z is not None:
                add = self.b.node("", "Add", [y, self.to_nhwc(z, made)], hint=f"{conv.name}_add_z")
                made.append(add)
                y = add.outputs[0]
            activation = _attr(node, "activation")
            if activation is not None:
                act = self.activation_node(activation, _attr(node, "activation_params") or [], y, conv.name or "act", made)
                made.append(act)
                y = act.outputs[0]
            y.type, y.shape = out_type, out_shape
        return made, [y]

    def ohwi_weights(self, w: ir.Value | None, before: list[ir.Node]) -> ir.Value | None:
        """NhwcConv's CUDA kernel reads its weights as [M, kH, kW, C/group] (measured on
        onnxruntime-gpu 1.31.1: OIHW weights fail with "kernel channels" = kW)."""
        if w is None:
            return None
        const = w.const_value
        if const is not None:
            return self.b.constant(np.transpose(const.numpy(), (0, 2, 3, 1)), f"{w.name or 'w'}_ohwi")
        t = self.b.node("", "Transpose", [w], {"perm": [0, 2, 3, 1]}, hint=f"{w.name or 'w'}_ohwi")
        before.append(t)
        return t.outputs[0]

    def activation_node(self, name: str, params: list[float], x: ir.Value, hint: str, made: list[ir.Node]) -> ir.Node:
        if name == "LeakyRelu":
            return self.b.node("", "LeakyRelu", [x], {"alpha": float(params[0])}, hint=f"{hint}_act")
        if name == "HardSigmoid":
            return self.b.node("", "HardSigmoid", [x], {"alpha": float(params[0]), "beta": float(params[1])}, hint=f"{hint}_act")
        if name == "Clip":
            np_dtype = ir.DataType(x.type.dtype).numpy() if x.type is not None else np.float32
            if self.opset >= 11:
                lo = self.b.constant(np.array(params[0], np_dtype), "clip_min")
                hi = self.b.constant(np.array(params[1], np_dtype), "clip_max")
                return self.b.node("", "Clip", [x, lo, hi], hint=f"{hint}_act")
            return self.b.node("", "Clip", [x], {"min": float(params[0]), "max": float(params[1])}, hint=f"{hint}_act")
        return self.b.node("", name, [x], hint=f"{hint}_act")


# ----------------------------------------------------------------------------- cleanup


def _compose(inner: Sequence[int], outer: Sequence[int]) -> list[int]:
    """Transpose(Transpose(x, inner), outer) == Transpose(x, result)."""
    return [int(inner[p]) for p in outer]


def _cancel_transposes(model: ir.Model, b: _Builder) -> None:
    """Fold Transpose(Transpose(x)) into one Transpose of x, or into x when the permutations cancel."""
    graph = model.graph
    for node in list(graph):
        if node.graph is None or node.op_type != "Transpose" or node.domain not in _ONNX:
            continue
        src = node.inputs[0]
        inner = src.producer() if src is not None else None
        if inner is None or inner.op_type != "Transpose" or inner.domain not in _ONNX or inner.graph is not graph:
            continue
        outer_perm, inner_perm = _attr(node, "perm"), _attr(inner, "perm")
        if outer_perm is None or inner_perm is None:
            continue
        perm = _compose(inner_perm, outer_perm)
        base, out = _x(inner), node.outputs[0]
        if perm == list(range(len(perm))):
            if out.is_graph_output():
                if base.is_graph_input() or base.is_graph_output() or base.const_value is not None:
                    continue  # the output's name cannot move onto base: keep the pair
                name = out.name
                out.name = b.fresh(name or "out")
                out.replace_all_uses_with(base, replace_graph_outputs=True)
                base.name = name
            else:
                out.replace_all_uses_with(base)
            _detach_and_remove(graph, [node])
        else:
            node.replace_input_with(0, base)
            node.attributes["perm"] = ir.AttrInt64s("perm", perm)
        if src is not None and not _uses(src) and not src.is_graph_output():
            _detach_and_remove(graph, [inner])


def _transposes_to_reshapes(model: ir.Model, b: _Builder, summary: LayoutSummary) -> None:
    """A Transpose that keeps the order of the axes longer than 1 moves no data: a Reshape."""
    graph = model.graph
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain not in _ONNX:
            continue
        x, perm = node.inputs[0], _attr(node, "perm")
        if x is None or x.shape is None or perm is None:
            continue
        shape = list(x.shape)
        moving = [p for p in perm if not (isinstance(shape[p], int) and shape[p] == 1)]
        if moving != sorted(moving):
            continue
        target = []
        unknown = 0
        for i, p in enumerate(perm):
            dim = shape[p]
            if isinstance(dim, int):
                target.append(dim)
            elif i == p == 0:
                target.append(0)  # Reshape's 0 copies the input's dim 0
            else:
                target.append(-1)
                unknown += 1
        if unknown > 1:
            continue
        shape_value = b.constant(np.array(target, np.int64), "shape")
        reshape = b.node("", "Reshape", [x, shape_value], hint=(node.name or "Transpose") + "_as_reshape")
        out = node.outputs[0]
        reshape.outputs[0].type, reshape.outputs[0].shape = out.type, out.shape
        graph.insert_before(node, reshape)
        name = out.name
        out.name = b.fresh(name or "t")
        out.replace_all_uses_with(reshape.outputs[0], replace_graph_outputs=True)
        reshape.outputs[0].name = name
        _detach_and_remove(graph, [node])
        summary.transposes_as_reshape += 1


def _remove_dead(model: ir.Model) -> None:
    graph = model.graph
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph)):
            if any(_uses(o) or o.is_graph_output() for o in node.outputs):
                continue
            if node.domain in _ONNX and node.op_type in ("Transpose", "Reshape", "Constant"):
                _detach_and_remove(graph, [node])
                changed = True
    used = {v.name for n in ir.traversal.RecursiveGraphIterator(graph) for v in n.inputs if v is not None}
    inputs = {v.name for v in graph.inputs}
    for name, value in list(graph.initializers.items()):
        if name not in used and name not in inputs and not _uses(value) and not value.is_graph_output():
            graph.initializers.pop(name)


# ----------------------------------------------------------------------------- entry points


def _count_transposes(model: ir.Model) -> int:
    return sum(1 for n in model.graph if n.op_type == "Transpose" and n.domain in _ONNX)


#: The layout decision's candidates: NCHW as the model is (the baseline), or NHWC with each
#: convolution's bias added by an elementwise Add or inside NhwcConv.
LAYOUT_CANDIDATES = ("nchw", "nhwc-add", "nhwc-kernel")


def _conv_sites(model: ir.Model, target: Target, options: LayoutOptions) -> tuple[list[tuple[str, list[Any], list[Any], int]], list[str]]:
    """(dtype, input shape, weight shape, group) of every 2-D convolution the target could run in
    NHWC, and the form each has now ("FusedConv" or "Conv")."""
    kernels = target.kernels.get((MS_DOMAIN, "NhwcConv"), frozenset())
    sites = []
    forms = []
    for node in model.graph:
        if node.op_type not in ("Conv", "FusedConv") or node.domain not in (*_ONNX, MS_DOMAIN) or _rank(node.inputs[0]) != 4:
            continue
        x, w = _x(node), node.inputs[1]
        dtype = _dtype(x)
        if dtype not in kernels or dtype not in options.auto_dtypes:
            continue
        w_shape = w.const_value.shape if w is not None and w.const_value is not None else (w.shape if w is not None else None)
        sites.append((dtype, list(x.shape or []), list(w_shape) if w_shape is not None else [], int(_attr(node, "group", 1))))
        forms.append(node.op_type)
    return sites, forms


def _with_forms(worlds: list[list[Any]] | None, forms: list[str]) -> list[list[Any]] | None:
    """Each convolution's class, told the form it has now (a feature no entry restricts)."""
    from graphopt.decisions import OpClass

    if worlds is None:
        return None
    return [[OpClass(c.op, c.dtype, (*c.features, ("form", form))) for c, form in zip(world, forms)] for world in worlds]


def _layout_readings(cls: Any, candidate: str) -> list[tuple[str, str]]:
    """Where the table's time of one convolution in a layout candidate is read. The layout
    entries' "nchw" is graphopt's NCHW output as benchmarks/decisions_bench.py wrote it:
    FusedConv in float32. The baseline is the model as it is now, so an NCHW convolution
    the fused_conv decision left as Conv + activation (the input's form) is read from that
    decision's "Conv+activation" figure, measured on the same block; where there is none
    (float16: FusedConv is float32 only) the layout entry's "nchw" is that form already."""
    if candidate != "nchw":
        return [("layout", candidate)]
    fused = cls.feature("form") == "FusedConv"
    return [("fused_conv", "FusedConv" if fused else "Conv+activation"), ("layout", "nchw")]


def _decide_layout(model: ir.Model, target: Target, options: LayoutOptions, decider: Any) -> tuple[str, str, Any]:
    """(mode, conv_bias, the decision's record or None) for this model: "auto" and
    conv_bias="auto" are decisions (graphopt.decisions); explicit options are taken as they are."""
    from graphopt.decisions import conv_worlds

    if options.mode not in ("auto", "nchw", "nhwc"):
        raise ValueError(f"layout must be 'auto', 'nchw' or 'nhwc', not {options.mode!r}")
    if options.conv_bias not in ("auto", "add", "kernel"):
        raise ValueError(f"conv_bias must be 'auto', 'add' or 'kernel', not {options.conv_bias!r}")
    if options.mode == "nchw":
        return "nchw", "kernel", None
    sites, forms = _conv_sites(model, target, options)
    worlds = _with_forms(conv_worlds(sites), forms) if sites else None
    if options.mode == "nhwc":
        if options.conv_bias != "auto":
            return "nhwc", options.conv_bias, None
        if not sites:
            return "nhwc", "kernel", None
        chosen = decider.choose("layout", "model (--layout nhwc)", ["nhwc-kernel", "nhwc-add"], "nhwc-kernel", worlds)
        return "nhwc", chosen.chosen.split("-", 1)[1], chosen
    if not sites:
        return "nchw", "kernel", None  # nothing to decide: no convolution NHWC could speed up
    candidates = ["nchw", *(c for c in LAYOUT_CANDIDATES[1:] if options.conv_bias in ("auto", c.split("-", 1)[1]))]
    build, signature = None, ""
    if decider.can_tune:
        build, signature = _tune_builder(model, target, options)
    chosen = decider.choose("layout", "model", candidates, "nchw", worlds, build=build, signature=signature, readings=_layout_readings)
    if chosen.chosen == "nchw":
        return "nchw", "kernel", chosen
    return "nhwc", chosen.chosen.split("-", 1)[1], chosen


def _tune_builder(model: ir.Model, target: Target, options: LayoutOptions) -> tuple[Any, str]:
    """For --tune: each layout candidate as the whole model in that layout, with random inputs."""
    import dataclasses

    from graphopt.decisions import DecisionPoint, signature_of
    from graphopt.inputs import _resolve_shapes, make_inputs

    proto = ir.serde.serialize_model(model)
    data = proto.SerializeToString()
    feeds = make_inputs(model, _resolve_shapes(model.graph, {}), seed=0)

    def build(candidate: str) -> tuple[bytes, dict[str, np.ndarray]]:
        copy = ir.serde.deserialize_model(onnx_proto_copy(data))
        mode, bias = ("nchw", "kernel") if candidate == "nchw" else ("nhwc", candidate.split("-", 1)[1])
        convert_layout(copy, target, dataclasses.replace(options, mode=mode, conv_bias=bias), decider=DecisionPoint(target.name))
        return ir.serde.serialize_model(copy).SerializeToString(), feeds

    return build, signature_of("layout", data, options)


def onnx_proto_copy(data: bytes) -> Any:
    import onnx

    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    return proto


def convert_layout(
    model: ir.Model, target: Target, options: LayoutOptions | str | None = None, *, stats: Any = None, decider: Any = None
) -> LayoutSummary:
    """Run the layout pass on the main graph for `target` (a no-op for targets without
    NhwcConv and GroupNorm kernels); returns what it did, transposes left included.
    `decider` (a graphopt.decisions.DecisionPoint; by default one on the shipped cost
    table) makes the "auto" choices and keeps their records."""
    from graphopt.decisions import DecisionPoint

    started = time.perf_counter()
    if options is None or isinstance(options, str):
        options = LayoutOptions(mode=options or "auto")
    decider = decider if decider is not None else DecisionPoint(target.name)
    nhwc_capable = (MS_DOMAIN, "NhwcConv") in target.kernels
    mode, conv_bias, decision = _decide_layout(model, target, options, decider) if nhwc_capable else ("nchw", "kernel", None)
    options = dataclasses.replace(options, conv_bias=conv_bias)
    summary = LayoutSummary(mode=mode)
    if (MS_DOMAIN, "NhwcConv") in target.kernels or (MS_DOMAIN, "GroupNorm") in target.kernels:
        layout = _Layout(model, target, options, summary)
        chosen = layout.plan(nhwc=mode == "nhwc")
        measured = decision is not None and decision.basis == "measured"
        if mode == "nhwc" and options.mode == "auto" and not measured:
            # The table's NHWC figures hold where the model has at least the measured blocks'
            # convolutions per Transpose NHWC adds (over those NCHW needs anyway, around GroupNorm).
            convs = sum(1 for n in chosen if n.op_type in ("Conv", "FusedConv"))
            nchw = layout.plan(nhwc=False)
            added = layout.boundary(chosen) - layout.boundary(nchw)
            if convs < AUTO_CONVS_PER_TRANSPOSE * added:
                summary.mode = "nchw"
                chosen = nchw
                if decision is not None:
                    decision.chosen = "nchw"
                    decision.reason += (
                        f"; but NHWC would add {added} Transposes for {convs} convolutions (the table's figures hold from"
                        f" {AUTO_CONVS_PER_TRANSPOSE} per Transpose): kept NCHW"
                    )
        changed = layout.run(chosen)
        if changed:
            before = _count_transposes(model)
            _cancel_transposes(model, layout.b)
            _remove_dead(model)
            summary.transposes_cancelled = max(0, before - _count_transposes(model))
            _transposes_to_reshapes(model, layout.b, summary)
            _remove_dead(model)
    summary.transposes = _count_transposes(model)
    if stats is not None:
        stats.runs += 1
        stats.changes += sum(summary.converted.values())
        stats.time_s += time.perf_counter() - started
    return summary


# ----------------------------------------------------------------------------- CPU emulation (tests)


def _emulate_group_norm(b: _Builder, node: ir.Node, x_nchw: ir.Value, made: list[ir.Node]) -> ir.Value:
    """com.microsoft.GroupNorm on NCHW data in standard ops: Reshape [N, G, -1] /
    InstanceNormalization / Reshape / Mul gamma / Add beta (/ SiLU)."""
    groups = int(_attr(node, "groups"))
    eps = float(_attr(node, "epsilon", 1e-5))
    gamma, beta = _const(node.inputs[1]), _const(node.inputs[2])
    # X's type (gamma and beta may be float32 under float16 X: the CUDA kernel reads them so).
    x = node.inputs[0]
    typed = x if x is not None and x.type is not None else x_nchw
    dtype = ir.DataType(typed.type.dtype).numpy() if typed.type is not None else np.float32
    shape1 = b.constant(np.array([0, groups, -1], np.int64), "gn_shape")
    r1 = b.node("", "Reshape", [x_nchw, shape1], hint="gn_group")
    ones = b.constant(np.ones(groups, dtype), "gn_one")
    zeros = b.constant(np.zeros(groups, dtype), "gn_zero")
    norm = b.node("", "InstanceNormalization", [r1.outputs[0], ones, zeros], {"epsilon": eps}, hint="gn_norm")
    shape = b.node("", "Shape", [x_nchw], hint="gn_shape_of")
    r2 = b.node("", "Reshape", [norm.outputs[0], shape.outputs[0]], hint="gn_back")
    g = b.constant(np.asarray(gamma, dtype).reshape(-1, 1, 1), "gn_gamma")
    bb = b.constant(np.asarray(beta, dtype).reshape(-1, 1, 1), "gn_beta")
    mul = b.node("", "Mul", [r2.outputs[0], g], hint="gn_scale")
    add = b.node("", "Add", [mul.outputs[0], bb], hint="gn_shift")
    made += [r1, norm, shape, r2, mul, add]
    y = add.outputs[0]
    if _attr(node, "activation", 0) == 1:
        sig = b.node("", "Sigmoid", [y], hint="gn_sigmoid")
        silu = b.node("", "Mul", [y, sig.outputs[0]], hint="gn_silu")
        made += [sig, silu]
        y = silu.outputs[0]
    return y


def emulate_nhwc_ops(model: ir.Model) -> int:
    """Replace NhwcConv, channels-last GroupNorm and internal-domain NHWC pools with
    Transpose + their NCHW standard-op equivalent + Transpose, so onnxruntime's CPU
    provider can run the model (for tests of the layout pass); returns how many."""
    b = _Builder(model)
    graph = model.graph
    replaced = 0
    for node in list(graph):
        is_conv = node.domain == MS_DOMAIN and node.op_type == "NhwcConv"
        is_gn = node.domain == MS_DOMAIN and node.op_type == "GroupNorm"
        is_pool = node.domain == NHWC_DOMAIN
        if not (is_conv or is_gn or is_pool):
            continue
        made: list[ir.Node] = []
        x = _x(node)
        channels_last = not is_gn or _attr(node, "channels_last", 1) == 1
        if channels_last:
            t_in = b.node("", "Transpose", [x], {"perm": list(TO_NCHW)}, hint="emu_to_nchw")
            made.append(t_in)
            x = t_in.outputs[0]
        if is_conv:  # NhwcConv's weights are [M, kH, kW, C/group]: back to Conv's [M, C/group, kH, kW]
            w_t = b.node("", "Transpose", [node.inputs[1]], {"perm": [0, 3, 1, 2]}, hint="emu_w")
            made.append(w_t)
            core = b.node("", "Conv", [x, w_t.outputs[0], *node.inputs[2:]], dict(node.attributes), hint="emu_conv")
            made.append(core)
            y = core.outputs[0]
        elif is_gn:
            y = _emulate_group_norm(b, node, x, made)
        else:
            core = b.node("", node.op_type, [x], dict(node.attributes), hint="emu_pool")
            made.append(core)
            y = core.outputs[0]
        if channels_last:
            t_out = b.node("", "Transpose", [y], {"perm": list(TO_NHWC)}, hint="emu_to_nhwc")
            made.append(t_out)
            y = t_out.outputs[0]
        old = node.outputs[0]
        y.type, y.shape = old.type, old.shape
        graph.insert_before(node, made)
        name = old.name
        old.name = b.fresh(name or "old")
        old.replace_all_uses_with(y, replace_graph_outputs=True)
        y.name = name
        _detach_and_remove(graph, [node])
        replaced += 1
    if NHWC_DOMAIN in model.opset_imports and not any(n.domain == NHWC_DOMAIN for n in graph):
        del model.opset_imports[NHWC_DOMAIN]
    return replaced
