"""The graph view over an ONNX model held in onnx-ir.

onnx-ir gives us values with producers and uses, O(1) node insertion and removal,
lazily loaded (memory-mapped) external tensors, subgraphs and functions; this
module only adapts it to `graphopt.ir.view.GraphView` and implements the
mutations a rewrite needs while keeping untouched nodes exactly as they were.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.ir import provenance as provenance_keys
from graphopt.ops.registry import GRAPHOPT_DOMAIN, attribute_default, standard_attribute_default

__all__ = ["OnnxView", "DTYPE_NAMES", "dtype_name"]

DTYPE_NAMES: dict[ir.DataType, str] = {
    ir.DataType.FLOAT: "f32",
    ir.DataType.FLOAT16: "f16",
    ir.DataType.BFLOAT16: "bf16",
    ir.DataType.DOUBLE: "f64",
    ir.DataType.INT64: "i64",
    ir.DataType.INT32: "i32",
    ir.DataType.INT16: "i16",
    ir.DataType.INT8: "i8",
    ir.DataType.UINT64: "u64",
    ir.DataType.UINT32: "u32",
    ir.DataType.UINT16: "u16",
    ir.DataType.UINT8: "u8",
    ir.DataType.BOOL: "bool",
    ir.DataType.STRING: "str",
    ir.DataType.COMPLEX64: "c64",
    ir.DataType.COMPLEX128: "c128",
    ir.DataType.FLOAT8E4M3FN: "f8e4m3fn",
    ir.DataType.FLOAT8E5M2: "f8e5m2",
}


def dtype_name(dtype: ir.DataType | int | None) -> str | None:
    if dtype is None:
        return None
    return DTYPE_NAMES.get(ir.DataType(dtype), ir.DataType(dtype).name.lower())


def _attr_python_value(attr: ir.Attr) -> Any:
    value = attr.value
    if attr.type in (ir.AttributeType.TENSOR,):
        return value.numpy()
    if attr.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(value)
    return value


class OnnxView:
    """GraphView over an `ir.Model`; nodes, values and scopes are onnx-ir's own objects."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        # Before IR version 4 every initializer had to be listed among the inputs too;
        # such models mean them as weights, and onnxruntime treats them as constants.
        self.legacy_weight_inputs = (model.ir_version or 0) < 4
        self._names: set[str] = set()
        # Constant nodes made for a rewrite in a subgraph or function, inserted on commit.
        self._pending_constants: list[ir.Node] = []
        self._pending_nodes: list[ir.Node] = []  # built for the rewrite being planned
        self._pending_initializers: list[ir.Value] = []
        self._new_initializers: dict[int, ir.Value] = {}  # initializers this view created, by id
        self._scope_labels: dict[int, str] = {}
        self._scopes: list[ir.Graph] = []
        self._refresh_scopes()
        # Names made here (fresh_name): name -> the name it was made from, and the last suffix per base.
        self._derived_from: dict[str, str] = {}
        self._suffixes: dict[str, int] = {}
        self._input_ops: dict[str, tuple[str, str]] = {}  # the input's node names -> (domain, op)
        for scope in self._scopes:
            self._names.update(v.name for v in self._scope_values(scope) if v.name)
            for node in scope:
                if node.name:
                    self._names.add(node.name)
                    self._input_ops[node.name] = (node.domain, node.op_type)

    def _refresh_scopes(self) -> None:
        """Rewrites and passes can add or remove If/Loop nodes, so scopes are listed anew when asked."""
        self._scopes = []
        self._scope_labels = {}
        self._collect_scopes(self.model.graph, "main")
        for key, function in self.model.functions.items():
            # A function's nodes belong to its inner graph (node.graph), so that is the scope.
            self._collect_scopes(function.graph, f"function:{key[0]}.{key[1]}")

    # ------------------------------------------------------------ scopes
    def _collect_scopes(self, scope: ir.Graph, label: str) -> None:
        self._scopes.append(scope)
        self._scope_labels[id(scope)] = label
        for node in scope:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    self._collect_scopes(attr.value, f"{label}/{self.label(node)}.{attr.name}")
                elif attr.type == ir.AttributeType.GRAPHS:
                    for i, g in enumerate(attr.value):
                        self._collect_scopes(g, f"{label}/{self.label(node)}.{attr.name}[{i}]")

    @staticmethod
    def _scope_values(scope: ir.Graph | ir.Function) -> Iterator[ir.Value]:
        yield from scope.inputs
        if isinstance(scope, ir.Graph):
            yield from scope.initializers.values()
        for node in scope:
            yield from node.outputs

    def scopes(self) -> list[ir.Graph]:
        self._refresh_scopes()
        return list(self._scopes)

    def nodes(self, scope: ir.Graph | ir.Function) -> list[ir.Node]:
        return list(scope)

    def scope_of(self, node: ir.Node) -> ir.Graph | None:
        return node.graph  # None once the node is erased

    def scope_label(self, scope: Any) -> str:
        return self._scope_labels.get(id(scope), "?")

    def iter_all_nodes(self) -> Iterator[ir.Node]:
        for scope in self._scopes:
            yield from scope

    def opset(self, domain: str) -> int | None:
        return self.model.opset_imports.get(domain)

    # ------------------------------------------------------------ reading
    def op_key(self, node: ir.Node) -> tuple[str, str]:
        domain = node.domain
        return ("" if domain == "ai.onnx" else domain, node.op_type)

    def inputs(self, node: ir.Node) -> Sequence[ir.Value | None]:
        return node.inputs

    def outputs(self, node: ir.Node) -> Sequence[ir.Value]:
        return node.outputs

    def producer(self, value: ir.Value) -> ir.Node | None:
        return value.producer()

    def output_index(self, value: ir.Value) -> int:
        return value.index() or 0

    def users(self, value: ir.Value) -> list[ir.Node]:
        return [use.node for use in value.uses()]

    def is_graph_output(self, value: ir.Value) -> bool:
        return value.is_graph_output()

    def is_const(self, value: ir.Value) -> bool:
        if value.is_graph_input() and not (self.legacy_weight_inputs and value.const_value is not None):
            return False  # an initializer that is also an input can be overridden (IR version 4 on)
        if value.const_value is not None:
            return True
        producer = value.producer()
        if producer is None or producer.op_type != "Constant" or producer.domain not in ("", "ai.onnx"):
            return False
        # A Constant whose value is a function's attribute reference is unknown until the call.
        return not any(attr.is_ref() for attr in producer.attributes.values())

    def const_array(self, value: ir.Value) -> np.ndarray | None:
        if not self.is_const(value):
            return None
        try:
            tensor = ir.convenience.get_const_tensor(value)
        except ValueError:
            return None
        if tensor is None:
            return None
        return tensor.numpy()

    def dtype(self, value: ir.Value) -> str | None:
        dtype = value.dtype
        if dtype is None and value.const_value is not None:
            dtype = value.const_value.dtype
        return dtype_name(dtype)

    def shape(self, value: ir.Value) -> tuple[int | str | None, ...] | None:
        shape = value.shape
        if shape is not None and value.is_graph_input() and value.graph is not self.model.graph:
            # Loop/Scan body inputs may change shape from one iteration to the next: keep the rank only.
            return (None,) * len(shape)
        if shape is None:
            if value.const_value is not None:
                return tuple(int(d) for d in value.const_value.shape.numpy())
            return None
        return tuple(d if isinstance(d, int) else (d.value if d.value is not None else None) for d in shape)

    def attr(self, node: ir.Node, name: str) -> Any:
        attr = node.attributes.get(name)
        if attr is not None and not attr.is_ref():
            return _attr_python_value(attr)
        domain, op_type = self.op_key(node)
        opset = node.version or self.opset(domain) or (self.opset("") if domain == "" else 1) or 1
        if domain == GRAPHOPT_DOMAIN:
            return attribute_default(domain, op_type, name)
        return standard_attribute_default(op_type, name, opset, domain)

    def attrs(self, node: ir.Node) -> Mapping[str, Any]:
        return {k: _attr_python_value(a) for k, a in node.attributes.items() if not a.is_ref()}

    def raw_attrs(self, node: ir.Node) -> Mapping[str, ir.Attr]:
        return node.attributes

    def implicit_inputs(self, node: ir.Node) -> list[ir.Value]:
        """Values of enclosing scopes that the subgraphs of `node` (If/Loop/Scan bodies) read."""
        inner = _inner_nodes(node)
        if not inner:
            return []
        inner_graphs = {id(n.graph) for n in inner}
        found: list[ir.Value] = []
        for n in inner:
            for value in n.inputs:
                if value is None:
                    continue
                producer = value.producer()
                owner = producer.graph if producer is not None else value.graph
                if owner is not None and id(owner) not in inner_graphs:
                    found.append(value)
        return found

    def label(self, node: ir.Node) -> str:
        if node.name:
            return node.name
        first = next((o.name for o in node.outputs if o.name), None)
        return f"{node.op_type}({first})" if first else f"{node.op_type}@{id(node):x}"

    # ------------------------------------------------------------ mutating
    def fresh_name(self, hint: str) -> str:
        """A name no value or node of the model has: `hint` when free, else `hint_N`. A name made
        from a made name counts on from its base (conv_1 -> conv_2, never conv_1_1), so names stay
        short however many rewrites a node goes through."""
        base = self._derived_from.get(hint, hint)
        if base not in self._names:
            self._names.add(base)
            return base
        while True:
            count = self._suffixes[base] = self._suffixes.get(base, 0) + 1
            name = f"{base}_{count}"
            if name not in self._names:
                self._names.add(name)
                self._derived_from[name] = base
                return name

    def restore_node_names(self) -> int:
        """A node that survives a rewrite keeps its name: a node named `base_N` here gets `base` back
        when the input's node of that name had the same op and no node of the graph has the name
        any more (a Conv folded with its BatchNormalization stays `layer1.conv`; the Gemm made
        from an Add does not take the Add's name). Returns how many."""
        restored = 0
        for scope in self.scopes():
            taken = {node.name for node in scope if node.name}
            for node in scope:
                base = self._derived_from.get(node.name or "")
                if base is not None and base not in taken and self._input_ops.get(base) == (node.domain, node.op_type):
                    taken.discard(node.name)
                    taken.add(base)
                    node.name = base
                    restored += 1
        return restored

    def new_node(
        self,
        scope: Any,
        domain: str,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attrs: Mapping[str, Any],
        num_outputs: int,
        name_hint: str = "",
    ) -> ir.Node:
        attributes = []
        for key, value in attrs.items():
            if isinstance(value, ir.Attr):
                attributes.append(ir.Attr(key, value.type, value.value, ref_attr_name=value.ref_attr_name))
            else:
                attributes.append(_attribute(key, value))
        node_name = self.fresh_name(name_hint or op_type)
        node = ir.Node(domain, op_type, list(inputs), attributes, num_outputs=num_outputs, name=node_name)
        for i, out in enumerate(node.outputs):
            out.name = self.fresh_name(f"{node_name}_out{i}" if num_outputs > 1 else node_name)
        self._pending_nodes.append(node)
        return node

    def new_constant(self, scope: Any, array: np.ndarray, name_hint: str) -> ir.Value:
        name = self.fresh_name(name_hint or "const")
        tensor = ir.tensor(np.asarray(array), name=name)
        if isinstance(scope, ir.Graph) and scope is self.model.graph:
            value = ir.Value(name=name, const_value=tensor, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype))
            scope.register_initializer(value)
            self._new_initializers[id(value)] = value
            self._pending_initializers.append(value)
            return value
        # Subgraphs and functions: a Constant node keeps the value local to its scope.
        node = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)], name=name)
        node.outputs[0].name = name
        node.outputs[0].type = ir.TensorType(tensor.dtype)
        node.outputs[0].shape = ir.Shape(np.shape(array))
        self._pending_constants.append(node)
        return node.outputs[0]

    def discard_pending(self) -> None:
        """Forget a planned rewrite: its nodes stop being users of their inputs, and the
        initializers made for it go (a refused rewrite leaves no trace in the model)."""
        for node in self._pending_nodes:
            for i in range(len(node.inputs)):
                node.replace_input_with(i, None)
        for value in self._pending_initializers:
            if value.name and not value.uses() and not value.is_graph_output() and value.name in self.model.graph.initializers:
                self.model.graph.initializers.pop(value.name)
                self._new_initializers.pop(id(value), None)
        self._pending_constants = []
        self._pending_nodes = []
        self._pending_initializers = []

    def commit(
        self,
        root: ir.Node,
        new_nodes: Sequence[ir.Node],
        replacements: Sequence[tuple[ir.Value, ir.Value]],
        matched: Sequence[ir.Node],
        *,
        provenance: Mapping[str, str] | None = None,
    ) -> list[ir.Node]:
        graph = root.graph
        assert graph is not None, "the root of a rewrite is in the graph"
        # Named before the redirects below rename the replaced outputs (unnamed nodes are labelled by them).
        labels = {id(n): self.label(n) for n in matched} if provenance is not None else {}
        pending, self._pending_constants = self._pending_constants, []
        self._pending_nodes, self._pending_initializers = [], []
        to_insert = [*pending, *new_nodes]
        new_set = set(map(id, to_insert))
        matched_set = set(map(id, matched))
        for old, new in replacements:
            producer = new.producer()
            is_new = producer is not None and id(producer) in new_set and not new.is_graph_output()
            if old.is_graph_output() and not is_new and _only_used_by(new, matched_set) and producer is not None \
                    and not new.is_graph_input() and not new.is_initializer() and not new.is_graph_output():
                # An existing value read only by the nodes this rewrite removes can take the
                # output's name (no untouched node refers to it), instead of an Identity copy;
                # not when it is a graph output itself, whose name must stay too.
                is_new = True
            if old.is_graph_output() and not is_new:
                if id(new) in self._new_initializers and not new.uses() and new.name and new.const_value is not None:
                    # A constant made for this rewrite becomes a Constant node carrying the output's name.
                    self.model.graph.initializers.pop(new.name)
                    stand_in = ir.Node("", "Constant", [], [ir.AttrTensor("value", new.const_value)], name=self.fresh_name("Constant"))
                    stand_in.outputs[0].type, stand_in.outputs[0].shape = new.type, new.shape
                else:
                    # The output keeps its name, so an existing value cannot take its place: copy it.
                    stand_in = ir.Node("", "Identity", [new], name=self.fresh_name("Identity"))
                to_insert.append(stand_in)
                new = stand_in.outputs[0]
                is_new = True
            self.redirect(old, new, take_name=is_new)
        if to_insert:
            graph.insert_before(root, to_insert)
        root_outputs = set(map(id, root.outputs))
        if any(id(old) not in root_outputs for old, _ in replacements):
            # A rewrite that also replaced an interior value (e.g. the Add whose sum a
            # SkipLayerNormalization now returns) may have users before the new node.
            graph.sort()
        touched: list[ir.Node] = []
        for _, new in replacements:
            touched.extend(use.node for use in new.uses())
        erased: list[ir.Node] = []
        touched.extend(self._erase_unused(list(matched), erased))
        if provenance is not None:
            provenance_keys.record_rewrite(to_insert, erased, labels, provenance, [new for _, new in replacements])
        return touched

    def redirect(self, old: ir.Value, new: ir.Value, *, take_name: bool = True) -> None:
        """Every use of `old` (graph outputs included) now reads `new`.

        With `take_name`, `new` (a freshly made value) takes over old's name, so the
        consumers' serialized form and the graph's output names stay as they were."""
        if take_name and old.name:
            old_name = old.name
            old.name = self.fresh_name(old_name)
            new.name = old_name
        if new.type is None:
            new.type = old.type
        if new.shape is None and old.shape is not None:
            new.shape = old.shape
        old.replace_all_uses_with(new, replace_graph_outputs=True)

    def _erase_unused(self, candidates: list[ir.Node], erased: list[ir.Node] | None = None) -> list[ir.Node]:
        """Erase candidates without users, then producers left without users (appended to `erased`).

        Returns surviving producers whose use counts dropped (worth another look)."""
        survivors: list[ir.Node] = []
        seen: set[int] = set()
        while candidates:
            node = candidates.pop()
            if id(node) in seen or node.graph is None:
                continue
            if any(out.uses() or out.is_graph_output() for out in node.outputs):
                survivors.append(node)
                continue
            seen.add(id(node))
            producers = [v.producer() for v in node.inputs if v is not None]
            graph = node.graph
            for inner in _inner_nodes(node):
                # Nodes of an erased If/Loop body stop being users of outer values.
                producers.extend(v.producer() for v in inner.inputs if v is not None)
                for i in range(len(inner.inputs)):
                    inner.replace_input_with(i, None)
            for i in range(len(node.inputs)):
                node.replace_input_with(i, None)
            graph.remove(node)
            if erased is not None:
                erased.append(node)
            candidates.extend(p for p in producers if p is not None and p.graph is graph)
        return survivors


def _inner_nodes(node: ir.Node) -> list[ir.Node]:
    """Every node in the subgraphs of `node`, recursively."""
    found: list[ir.Node] = []
    for attr in node.attributes.values():
        graphs = [attr.value] if attr.type == ir.AttributeType.GRAPH else list(attr.value) if attr.type == ir.AttributeType.GRAPHS else []
        for graph in graphs:
            for inner in graph:
                found.append(inner)
                found.extend(_inner_nodes(inner))
    return found


def _only_used_by(value: ir.Value, nodes: set[int]) -> bool:
    uses = value.uses()
    return bool(uses) and all(id(use.node) in nodes for use in uses)


#: The attribute classes of a non-empty list of ints, floats or strings, in the order onnx-ir tries them.
_LIST_ATTRIBUTES = ((int, ir.AttrInt64s), (float, ir.AttrFloat32s), (str, ir.AttrStrings))


def _attribute(key: str, value: Any) -> ir.Attr:
    """`ir.convenience.convert_attribute(key, value)`, with lists of numbers or strings (kernel
    shapes, pads, perms) typed here: onnx-ir first tries them against its runtime-checkable
    protocols (graph, tensor, type), each isinstance a walk over the protocol's members
    (~0.05 ms a list; most of the attributes the rewrites of a small model make)."""
    if type(value) in (list, tuple) and value:
        for kind, attribute in _LIST_ATTRIBUTES:
            if all(isinstance(x, kind) for x in value):
                return attribute(key, value)
    return ir.convenience.convert_attribute(key, value)
