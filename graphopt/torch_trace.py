"""Tracing dynamo's graph to ATen ops for the rules, and freezing module state into constants.

`trace_to_aten` traces with make_fx (functionalized) while keeping the composite ops the
rules fuse whole (`PRESERVED_OPS`: aten.matmul and scaled_dot_product_attention, whose
decompositions would hide the MatMul and the attention the patterns look for).
`_freeze_module_state` turns the parameters and buffers of an inference graph into
constants (so Conv+BatchNorm folds, projections' transposes fold, rotary caches fold),
leaving alone the state the graph mutates.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx

__all__ = ["PRESERVED_OPS", "trace_to_aten"]

aten = torch.ops.aten

#: Composite ops kept whole when tracing to ATen: the rules match them as MatMul and Attention.
PRESERVED_OPS = (aten.matmul.default, aten.scaled_dot_product_attention.default)


def _fake_inputs(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[Any, list[Any]]:
    """Fake versions of the inputs in dynamo's fake mode (same symbolic dims), or static fakes
    in a fresh mode when called outside torch.compile."""
    from torch._guards import TracingContext
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    context = TracingContext.try_get()
    fake_mode = context.fake_mode if context is not None and context.fake_mode is not None else FakeTensorMode(allow_non_fake_inputs=True)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes: list[Any] = []
    for value, node in zip(example_inputs, placeholders):
        if isinstance(value, FakeTensor):
            fakes.append(value if value.fake_mode is fake_mode else fake_mode.from_tensor(value))
        elif isinstance(value, torch.Tensor):
            symbolic = context.tensor_to_context.get(value) if context is not None else None
            source = symbolic.tensor_source if symbolic is not None else None
            fakes.append(fake_mode.from_tensor(value, symbolic_context=symbolic, source=source, static_shapes=context is None))
        else:
            fakes.append(node.meta.get("example_value", value))
    return fake_mode, fakes


@contextlib.contextmanager
def _preserving(ops: Sequence[Any]) -> Iterator[None]:
    """Keep composite ops whole while tracing (torch.export's mechanism for the same)."""
    try:
        from torch._export.utils import _special_op_to_preserve_cia
        from torch.export.exported_program import _override_composite_implicit_decomp
    except ImportError:  # an older or newer torch without it: the ops decompose, the rules see less
        yield
        return
    with _override_composite_implicit_decomp({op: _special_op_to_preserve_cia for op in ops}):
        yield


def trace_to_aten(gm: Callable[..., Any], fake_inputs: Sequence[Any], fake_mode: Any) -> fx.GraphModule:
    """dynamo's graph (or any function of tensors) as a functional graph of ATen ops, every
    node with meta["val"]."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx

    # Traced without autograd: the graph is the forward computation either way, and it stays
    # differentiable (every ATen op in it has a derivative; inductor and eager autograd derive
    # the backward from it). With grad mode on, preserved ops would come out detached.
    def trace(preserved: Sequence[Any]) -> fx.GraphModule:
        with fake_mode, torch.no_grad(), enable_python_dispatcher(), _preserving(preserved):
            # Dispatch-level functionalization, as aot_autograd and torch.export use: torch.func's
            # functionalize reads sizes through aten.size, which specializes every symbolic dim
            # (one recompilation per input shape).
            return make_fx(_functionalized(gm), decomposition_table={})(*fake_inputs)

    try:
        return trace(PRESERVED_OPS)
    except Exception:  # torch.export's private preservation misbehaving: trace fully decomposed
        return trace(())


def _functionalized(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn without mutations: FunctionalTensorMode (dispatch-level functionalization, as in
    aot_autograd), then a copy_ back into each input fn wrote to (a training BatchNorm's
    running stats), so the traced graph keeps that write at its end."""
    from torch._functorch._aot_autograd.functional_utils import has_data_mutation
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
    from torch.utils import _pytree as pytree

    def unwrap(t: Any) -> Any:
        torch._sync(t)
        return torch._from_functional_tensor(t.elem)

    def inner(*args: Any) -> Any:
        exclude = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))
        with exclude, FunctionalTensorMode():
            wrapped = [FunctionalTensor.to_functional(a) if isinstance(a, torch.Tensor) else a for a in args]
            outputs = pytree.tree_map_only(FunctionalTensor, unwrap, fn(*wrapped))
            for original, functional in zip(args, wrapped):
                if isinstance(functional, FunctionalTensor) and has_data_mutation(functional):
                    original.copy_(unwrap(functional))
        return outputs

    return inner


def _is_module_state(node: fx.Node, value: Any) -> bool:
    """A parameter or buffer of the compiled module (not a user input), or a number attribute
    of one of its modules (an RMSNorm's eps, a rotary scaling) that dynamo passes as a 0-d
    tensor input with dynamic=True (unspecialized floats): the rules need it as a constant."""
    if isinstance(value, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    name = getattr(source, "name", "")
    name = name() if callable(name) else str(name)
    if getattr(grapharg, "pass_arg_as_tensor", False):
        return "._modules[" in name or name.startswith("L['self'].")
    return "._buffers[" in name or "._parameters[" in name


def _mutated_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes some op writes to (copy_ back into an input, a training BatchNorm's running stats)."""
    written: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        arguments = node.target._schema.arguments
        for i, argument in enumerate(arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            if isinstance(value, fx.Node):
                written.add(value)
    return written


#: Arithmetic whose Tensor operand may be a Python number (a wrapped number: the same type
#: promotion as the 0-d tensor dynamo passes for an unspecialized float).
_NUMBER_OPERAND_OPS = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)


def _inline_number(node: fx.Node, number: float | int) -> None:
    """Uses of `node` (a 0-d tensor standing for a Python number) as an arithmetic operand,
    and of its value read back (aten._local_scalar_dense, a SymFloat), take the number itself."""
    for user in list(node.users):
        if user.op != "call_function":
            continue
        if user.target is aten._local_scalar_dense.default:
            for reader in list(user.users):
                reader.args, reader.kwargs = fx.node.map_arg(  # type: ignore[assignment]
                    (reader.args, reader.kwargs), lambda a, read=user: number if a is read else a)  # type: ignore[misc]
            if not user.users:
                user.graph.erase_node(user)
        elif user.target in _NUMBER_OPERAND_OPS and not user.kwargs:
            user.args = tuple(number if a is node else a for a in user.args)


def _state_name(source_node: fx.Node) -> str | None:
    """The dotted name of a parameter or buffer ("model.layers.0.mlp.up_proj.weight") from
    dynamo's source ("L['self']._modules['model']..._parameters['weight']"), or None."""
    source = getattr(source_node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", "")
    name = name() if callable(name) else str(name)
    parts = re.findall(r"\._(?:modules|parameters|buffers)\['([^']*)'\]", name)
    return ".".join(parts) or None


def _freeze_module_state(aten_gm: fx.GraphModule, dynamo_gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[int]:
    """Parameters and buffers the graph does not mutate become constants (get_attr of the
    tensor itself, no copy). Returns the input positions that went."""
    graph = aten_gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    dynamo_placeholders = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    mutated = _mutated_nodes(graph)
    first = next(n for n in graph.nodes if n.op != "placeholder")
    frozen = []
    for i, (node, source, value) in enumerate(zip(placeholders, dynamo_placeholders, example_inputs)):
        if not isinstance(value, torch.Tensor) or node in mutated or not _is_module_state(source, value):
            continue
        if getattr(source.meta.get("grapharg"), "pass_arg_as_tensor", False) and value.dim() == 0:
            _inline_number(node, value.item())  # the rules read `var + eps` with eps a number, as ONNX shows it
            if not node.users:
                graph.erase_node(node)
                frozen.append(i)
                continue
        name = f"_frozen_{i}"
        state_name = _state_name(source)
        if state_name and value.numel():  # by storage: folded transposes and slices are views of it
            aten_gm.meta.setdefault("graphopt_state_names", {})[value.untyped_storage().data_ptr()] = state_name
        aten_gm.register_buffer(name, value.detach())
        if first._erased:  # a value read back from a number inlined above
            first = next(n for n in graph.nodes if n.op != "placeholder")
        with graph.inserting_before(first):
            constant = graph.get_attr(name)
        constant.meta["val"] = node.meta.get("val")
        constant.meta["graphopt_source"] = state_name or ""  # the parameter's name ("lm_head.weight"), for reports and keep lists
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
        frozen.append(i)
    return frozen
