"""The NHWC rewrite: which nodes run in NHWC, and each one rebuilt on NHWC values.

`_Layout.plan` decides, forward in topological order, which nodes run in NHWC: anchors
with an NHWC kernel (Conv -> com.microsoft.NhwcConv, FusedConv unfused, GroupNorm always)
and then the layout-agnostic nodes (elementwise, Clip, Reduce* with constant axes,
Concat/Split, global pools) whose 4-D inputs mostly are NHWC already. `_Layout.run`
rebuilds each chosen node on the NHWC values, permutes constants once, and adds a
Transpose where an NCHW reader (or a graph output) still needs the old layout. When to
run it and with which options is graphopt.passes.layout's job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from graphopt.ops.fused_ops import FUSED_CONV_ACTIVATIONS
from graphopt.ops.registry import has_fact
from graphopt.ops.targets import MS_DOMAIN, Target
from graphopt.passes._common import in_qdq_unit
from graphopt.passes.nhwc_graph import (
    _ONNX,
    NHWC_DOMAIN,
    TO_NCHW,
    TO_NHWC,
    _attr,
    _Builder,
    _const,
    _detach_and_remove,
    _dtype,
    _is_scalar,
    _nhwc_axis,
    _permute_shape,
    _rank,
    _uses,
    _x,
)
from graphopt.report.sections import LayoutSummary

if TYPE_CHECKING:
    from graphopt.passes.layout import LayoutOptions

# ----------------------------------------------------------------------------- op classes

# Which ops are elementwise (computed the same in either layout), broadcasting, reductions
# or have an NHWC pool kernel: the registry's facts (graphopt/ops/standard_ops.py).
_GLOBAL_POOL = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}


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
            if _rank(x) != 4 or _dtype(x) not in self.nhwc_conv_dtypes or in_qdq_unit(node):
                return False  # a QDQ unit's Conv stays as it is (Transposes would hide the unit)
            if node.op_type == "FusedConv":
                activation = _attr(node, "activation")
                return activation is None or activation in FUSED_CONV_ACTIVATIONS
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
            if self.options.internal_nhwc_pools and has_fact(domain, op, "nhwc_internal_pool"):
                return "internal_pool"
            if op in _GLOBAL_POOL:
                return "pool"
            if has_fact(domain, op, "elementwise"):
                return "unary"
            if has_fact(domain, op, "broadcasting"):
                return "broadcast"
            if has_fact(domain, op, "reduce"):
                return "reduce"
            if op == "Concat":
                return "concat"
            if op == "Split":
                return "split"
        elif domain == MS_DOMAIN and has_fact(domain, op, "elementwise") and len(node.inputs) == 1:
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
        if has_fact(node.domain, node.op_type, "reduce") and not _attr(node, "keepdims", 1):
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
        if has_fact(domain, op, "reduce"):
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
