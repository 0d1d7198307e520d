"""The graph view over a torch.fx graph of ATen ops (what `torch.compile` hands graphopt).

The rules speak ONNX's vocabulary: this view reads each ATen node as the ONNX op
whose meaning it has, through graphopt.ir.fx_present (``aten.convolution`` is a
Conv, ``aten.addmm`` a Gemm, a Python number argument a constant input, ...). A
node with no presentation is *opaque*: its op key is ``("torch", "<aten op>")``,
which no pattern names, so rules never match it and it stays exactly as it is.

Values are the FX nodes themselves; an output of a node that returns a tuple
(``native_layer_norm``, ``split``, ...) is its ``operator.getitem`` node, or a
stand-in (`_Phantom`) while nobody reads it; a Python number or int list in an
argument is a `InlineConst`. Constants (frozen parameters, folded results) are
``get_attr`` nodes whose tensor `const_array` returns.

Mutation builds FX nodes at once: `new_node` lowers canonical ops back to ATen
calls (`graphopt.ops.torch_lowering`) and makes graphopt's own ops *neutral* nodes
(one call per op, lowered to ``torch.ops.graphopt.*`` after the rules ran, so that
later rules can still match them). New nodes wait at the end of the graph until
`commit` moves them before the rewritten root; `discard_pending` erases them.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from graphopt.ir.fx_present import InlineConsts, Presentation, is_projection, present, static_int, tensor_args
from graphopt.ir.fx_values import (
    InlineConst,
    NeutralOp,
    is_neutral,
    meta_val,
    neutral_op,
    numpy_to_tensor,
    tensor_to_numpy,
    torch_dtype_from_name,
    torch_dtype_name,
)
from graphopt.ops import torch_lowering
from graphopt.ops.registry import attribute_default, standard_attribute_default
from graphopt.pattern.ir import MISSING
from graphopt.pattern.native import RewriteDeclined

__all__ = [
    "FxView",
    "InlineConst",
    "meta_val",
    "FX_OPSET",
    "NeutralOp",
    "neutral_op",
    "is_neutral",
    "torch_dtype_name",
    "torch_dtype_from_name",
    "tensor_to_numpy",
    "numpy_to_tensor",
]

#: The ONNX opset whose op meanings the view presents (Gelu 20, Attention 23, Swish 24 ...).
FX_OPSET = 24


class _Phantom:
    """Output `index` of a tuple-returning node that nobody reads (no getitem node yet)."""

    __slots__ = ("node", "index", "name")

    def __init__(self, node: fx.Node, index: int) -> None:
        self.node, self.index = node, index
        self.name = f"{node.name}[{index}]"


# --------------------------------------------------------------------------- the view


class FxView:
    """GraphView over an FX GraphModule of ATen ops; one scope (the graph)."""

    def __init__(self, gm: fx.GraphModule, fake_mode: Any = None, device: torch.device | str | None = None,
                 inductor: bool = False, autotune: bool = False) -> None:
        self.gm = gm
        self.inductor = inductor  # inductor compiles the graph (FxBuilder.inductor)
        self.autotune = autotune  # inductor autotunes its GEMMs (FxBuilder.autotune)
        self.graph = gm.graph
        self.fake_mode = fake_mode if fake_mode is not None else _detect_fake_mode(gm)
        self.device = torch.device(device) if device is not None else _main_device(gm)
        self._presented: dict[fx.Node, Presentation | None] = {}
        self._consts = InlineConsts()
        self._phantoms: dict[tuple[fx.Node, int], _Phantom] = {}
        self._arrays: dict[fx.Node, np.ndarray] = {}
        self._pending: list[fx.Node] = []
        self._pending_attrs: list[str] = []
        self._counter = itertools.count()

    # ------------------------------------------------------------ bookkeeping
    def refresh(self) -> None:
        """Forget cached presentations (after a pass outside the view changed the graph)."""
        self._presented.clear()

    def present(self, node: fx.Node) -> Presentation | None:
        if node not in self._presented:
            self._presented[node] = present(node, self._consts)
        return self._presented[node]

    # ------------------------------------------------------------ scopes
    def scopes(self) -> list[fx.Graph]:
        return [self.graph]

    def nodes(self, scope: Any) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "call_function" and not is_projection(n)]

    def scope_of(self, node: Any) -> fx.Graph | None:
        if not isinstance(node, fx.Node) or getattr(node, "_erased", False) or node.graph is not self.graph:
            return None
        return self.graph

    def scope_label(self, scope: Any) -> str:
        return "main"

    def iter_all_nodes(self) -> Iterator[fx.Node]:
        yield from self.nodes(self.graph)

    def opset(self, domain: str) -> int | None:
        if domain in ("", "ai.onnx"):
            return FX_OPSET
        return 1 if domain == "graphopt" else None

    # ------------------------------------------------------------ reading
    def op_key(self, node: fx.Node) -> tuple[str, str]:
        if is_neutral(node):
            return ("graphopt", node.target.op_type)  # type: ignore[union-attr]
        p = self.present(node)
        if p is not None:
            return (p.domain, p.op_type)
        return ("torch", _target_name(node))

    def inputs(self, node: fx.Node) -> Sequence[Any]:
        if is_neutral(node):
            return list(node.args)
        p = self.present(node)
        if p is not None:
            return p.inputs
        return tensor_args(node)

    def outputs(self, node: fx.Node) -> list[Any]:
        val = meta_val(node)
        if not isinstance(val, (tuple, list)):
            return [node]
        found: dict[int, fx.Node] = {}
        for user in node.users:
            if user.target is operator.getitem and isinstance(user.args[1], int):
                found.setdefault(user.args[1], user)
        return [found.get(i) or self._phantom(node, i) for i in range(len(val))]

    def _phantom(self, node: fx.Node, index: int) -> _Phantom:
        key = (node, index)
        if key not in self._phantoms:
            self._phantoms[key] = _Phantom(node, index)
        return self._phantoms[key]

    def producer(self, value: Any) -> fx.Node | None:
        if isinstance(value, _Phantom):
            return value.node
        if not isinstance(value, fx.Node) or value.op != "call_function":
            return None
        return value.args[0] if is_projection(value) else value  # type: ignore[return-value]

    def output_index(self, value: Any) -> int:
        if isinstance(value, _Phantom):
            return value.index
        if isinstance(value, fx.Node) and is_projection(value):
            return int(value.args[1])  # type: ignore[arg-type]
        return 0

    def users(self, value: Any) -> list[fx.Node]:
        if not isinstance(value, fx.Node):
            return []
        found: list[fx.Node] = []
        for user in value.users:
            if user.op == "output" or getattr(user, "_erased", False):
                continue
            uses = sum(1 for x in tensor_args(user) if x is value)
            found.extend([user] * max(uses, 1))
        return found

    def is_graph_output(self, value: Any) -> bool:
        return isinstance(value, fx.Node) and any(u.op == "output" for u in value.users)

    def is_const(self, value: Any) -> bool:
        if isinstance(value, InlineConst):
            return value.array is not None
        return isinstance(value, fx.Node) and value.op == "get_attr" and isinstance(self._attr_tensor(value), torch.Tensor)

    def const_array(self, value: Any) -> np.ndarray | None:
        if isinstance(value, InlineConst):
            return value.array
        if not self.is_const(value):
            return None
        if value not in self._arrays:
            self._arrays[value] = tensor_to_numpy(self._attr_tensor(value))
        return self._arrays[value]

    def _attr_tensor(self, node: fx.Node) -> Any:
        obj: Any = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part, None)
        return obj

    def dtype(self, value: Any) -> str | None:
        if isinstance(value, InlineConst):
            return None if value.array is None else _numpy_dtype_name(value.array.dtype)
        val = self._value_meta(value)
        if isinstance(val, torch.Tensor):
            return torch_dtype_name(val.dtype)
        if isinstance(val, (int, torch.SymInt)):
            return "i64"
        return None

    def shape(self, value: Any) -> tuple[int | str | None, ...] | None:
        if isinstance(value, InlineConst):
            return None if value.array is None else tuple(value.array.shape)
        val = self._value_meta(value)
        if isinstance(val, torch.Tensor):
            return tuple(_dim(d) for d in val.shape)
        if isinstance(val, (int, torch.SymInt)):
            return ()
        return None

    def _value_meta(self, value: Any) -> Any:
        if isinstance(value, _Phantom):
            val = meta_val(value.node)
            return val[value.index] if isinstance(val, (tuple, list)) else None
        return meta_val(value)

    def attr(self, node: fx.Node, name: str) -> Any:
        attrs = self.attrs(node)
        if name in attrs:
            return attrs[name]
        domain, op_type = self.op_key(node)
        if domain == "graphopt":
            return attribute_default(domain, op_type, name)
        return standard_attribute_default(op_type, name, FX_OPSET) if domain == "" else MISSING

    def attrs(self, node: fx.Node) -> Mapping[str, Any]:
        if is_neutral(node):
            return node.meta.get("graphopt_attrs", {})
        p = self.present(node)
        return p.attrs if p is not None else {}

    def raw_attrs(self, node: fx.Node) -> Mapping[str, Any]:
        return dict(self.attrs(node))

    def label(self, node: fx.Node) -> str:
        return node.name

    # ------------------------------------------------------------ mutating
    def fresh_name(self, hint: str) -> str:
        hint = "".join(c if c.isalnum() else "_" for c in hint) or "v"
        while True:
            name = f"_go_{hint}_{next(self._counter)}"
            if not hasattr(self.gm, name):
                return name

    def new_node(
        self,
        scope: Any,
        domain: str,
        op_type: str,
        inputs: Sequence[Any],
        attrs: Mapping[str, Any],
        num_outputs: int,
        name_hint: str = "",
    ) -> fx.Node:
        output = self._output_node()
        with self.graph.inserting_before(output):
            builder = torch_lowering.FxBuilder(
                self.graph, self.fake_mode, created=self._pending, constant=self._new_tensor_constant, const_array=self.const_array,
                device=self.device, inductor=self.inductor, autotune=self.autotune, site=name_hint,
            )
            args = [self._as_fx(x) for x in inputs]
            if domain == "graphopt":
                return torch_lowering.neutral_node(builder, op_type, args, dict(attrs), num_outputs)
            if domain:
                raise RewriteDeclined(f"the torch graph cannot take {domain}.{op_type}")
            return torch_lowering.emit_canonical(builder, op_type, args, dict(attrs), num_outputs)

    def new_constant(self, scope: Any, array: np.ndarray, name_hint: str) -> fx.Node:
        return self._new_tensor_constant(numpy_to_tensor(np.asarray(array), self.device), name_hint)

    def add_constant(self, tensor: torch.Tensor, name_hint: str = "const") -> fx.Node:
        """A constant node for `tensor`, kept at once (for passes; rewrites use new_constant)."""
        node = self._new_tensor_constant(tensor, name_hint)
        self._pending.remove(node)
        self._pending_attrs.remove(str(node.target))
        return node

    def _new_tensor_constant(self, tensor: torch.Tensor, name_hint: str = "const") -> fx.Node:
        name = self.fresh_name(name_hint)
        self.gm.register_buffer(name, tensor)
        self._pending_attrs.append(name)
        first = next(n for n in self.graph.nodes if n.op != "placeholder")
        with self.graph.inserting_before(first):
            node = self.graph.get_attr(name)
        node.meta["val"] = self.fake_tensor(tensor)
        self._pending.append(node)
        return node

    def fake_tensor(self, tensor: torch.Tensor) -> Any:
        if self.fake_mode is None:
            return tensor
        return self.fake_mode.from_tensor(tensor, static_shapes=True)

    def _as_fx(self, value: Any) -> Any:
        """A value as an FX argument: nodes as they are, constants as Python values or get_attr nodes."""
        if value is None or isinstance(value, fx.Node):
            return value
        if isinstance(value, _Phantom):
            return self._projection(value)
        if isinstance(value, InlineConst):
            return value  # lowerings read its array, or `raw` for a symbolic int list
        raise TypeError(f"cannot use {value!r} as an FX argument")

    def _projection(self, phantom: _Phantom) -> fx.Node:
        for user in phantom.node.users:
            if user.target is operator.getitem and user.args[1] == phantom.index:
                return user
        with self.graph.inserting_after(phantom.node):
            node = self.graph.call_function(operator.getitem, (phantom.node, phantom.index))
        node.meta["val"] = meta_val(phantom.node)[phantom.index]
        self._pending.append(node)  # erased again if the rewrite is discarded
        return node

    def _output_node(self) -> fx.Node:
        return next(iter(reversed(self.graph.nodes)))

    def discard_pending(self) -> None:
        for node in reversed(self._pending):
            if not getattr(node, "_erased", False):
                for user in list(node.users):
                    if user.target is operator.getitem and not user.users:
                        self.graph.erase_node(user)
                self.graph.erase_node(node)
        for name in self._pending_attrs:
            if hasattr(self.gm, name):
                delattr(self.gm, name)
        self._pending, self._pending_attrs = [], []

    def commit(
        self,
        root: fx.Node,
        new_nodes: Sequence[fx.Node],
        replacements: Sequence[tuple[Any, Any]],
        matched: Sequence[fx.Node],
        *,
        provenance: Mapping[str, str] | None = None,
    ) -> list[fx.Node]:
        pending, self._pending, self._pending_attrs = self._pending, [], []
        pending_set = set(pending)
        replaced = [n.name for n in matched]
        for node in pending:  # constants stay at the top of the graph; computations move before the root
            if node.op == "call_function":
                root.prepend(node)
            if provenance is not None:  # graphopt.ir.provenance's keys, kept in the node's meta
                node.meta.update(provenance)
                node.meta["graphopt.replaced"] = ",".join(replaced)
        root_outputs = set(map(id, self.outputs(root)))
        needs_sort = False
        results: list[fx.Node] = []
        for old, new in replacements:
            if isinstance(old, _Phantom):
                continue  # an output nobody reads
            new_fx = self._replacement(new)
            results.append(new_fx)
            needs_sort = needs_sort or id(old) not in root_outputs
            old.replace_all_uses_with(new_fx, delete_user_cb=lambda user: user not in pending_set, propagate_meta=False)
        self._pending, self._pending_attrs = [], []  # what the replacements made is committed too
        if needs_sort:
            # The rewrite replaced an interior value, whose users may come before the new nodes.
            _topological_sort(self.graph)
        self._presented.clear()
        touched = [u for value in results for u in value.users if u.op == "call_function"]
        touched.extend(self._erase_unused(list(matched)))
        return [n for n in touched if not getattr(n, "_erased", False) and not is_projection(n)]

    def _replacement(self, new: Any) -> fx.Node:
        if isinstance(new, _Phantom):
            return self._projection(new)
        if isinstance(new, InlineConst):
            if new.array is None:
                raise AssertionError(f"{new.name} is a symbolic list, not a tensor")
            tensor = numpy_to_tensor(new.array, self.device)
            return self._new_tensor_constant(tensor, new.name)
        return new

    def _erase_unused(self, candidates: list[fx.Node]) -> list[fx.Node]:
        """Erase candidates left without users (and their dead getitems), then producers
        left without users. Returns the survivors whose use counts dropped."""
        survivors: list[fx.Node] = []
        while candidates:
            node = candidates.pop()
            if getattr(node, "_erased", False) or node.op != "call_function":
                continue
            for user in list(node.users):
                if is_projection(user) and not user.users:
                    self.graph.erase_node(user)
            if node.users or node.is_impure(impure_random=False):
                survivors.append(node)
                continue
            producers = [self.producer(x) for x in tensor_args(node)]
            self.graph.erase_node(node)
            candidates.extend(p for p in producers if p is not None)
        return survivors


# --------------------------------------------------------------------------- helpers


def _dim(d: Any) -> int | str:
    static = static_int(d)
    if static is not None:
        return static
    return str(d.node.expr) if isinstance(d, torch.SymInt) else str(d)


def _numpy_dtype_name(dtype: np.dtype) -> str | None:
    if dtype.name == "bfloat16":
        return "bf16"
    return {
        "float32": "f32", "float16": "f16", "float64": "f64", "int64": "i64", "int32": "i32", "int16": "i16",
        "int8": "i8", "uint8": "u8", "bool": "bool",
    }.get(dtype.name)


def _target_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def _detect_fake_mode(gm: fx.GraphModule) -> Any:
    from torch._guards import detect_fake_mode

    return detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if "val" in n.meta])


def _main_device(gm: fx.GraphModule) -> torch.device:
    """The device of the first tensor input or constant: where new constants go."""
    for node in gm.graph.nodes:
        val = meta_val(node)
        if isinstance(val, torch.Tensor) and node.op in ("placeholder", "get_attr"):
            return val.device
    return torch.device("cpu")


def _topological_sort(graph: fx.Graph) -> None:
    """Reorder the graph so that every node follows its inputs, keeping the existing
    order wherever it is already valid (Kahn's algorithm, smallest position first)."""
    import heapq

    nodes = list(graph.nodes)
    output = nodes[-1]
    order = {n: i for i, n in enumerate(nodes)}
    pending = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [(order[n], n) for n in nodes if pending[n] == 0 and n is not output]
    heapq.heapify(ready)
    result: list[fx.Node] = []
    while ready:
        _, node = heapq.heappop(ready)
        result.append(node)
        for user in node.users:
            pending[user] -= 1
            if pending[user] == 0 and user is not output:
                heapq.heappush(ready, (order[user], user))
    if len(result) != len(nodes) - 1:
        raise AssertionError("the rewritten graph has a cycle")
    if result == nodes[:-1]:
        return
    for node in result:
        output.prepend(node)
