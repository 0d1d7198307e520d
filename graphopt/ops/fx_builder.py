"""FxBuilder: emits ATen calls as FX nodes, each with its fake-tensor value, and reads the
operands a rewrite hands over (inline constants, constant nodes, static shape arithmetic).

Shared by the two lowering tables (graphopt.ops.torch_canonical, graphopt.ops.torch_fused)
and the lowering driver (graphopt.ops.torch_lowering).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from graphopt.ir.fx_values import InlineConst, meta_val, numpy_to_tensor
from graphopt.pattern.native import RewriteDeclined

__all__ = ["FxBuilder", "number", "ints", "arg", "first_line", "ALL_DTYPES", "FLOATS"]

ALL_DTYPES = frozenset({"f32", "f16", "bf16", "f64", "i64", "i32", "i16", "i8", "u8", "bool"})
FLOATS = frozenset({"f32", "f16", "bf16"})

aten = torch.ops.aten


class FxBuilder:
    """Emits ATen calls as FX nodes at the graph's current insertion point, each with its
    ``meta["val"]`` computed on fake tensors; or, with ``evaluate=True``, just runs them
    on fake tensors (to learn what a lowering would produce before emitting it)."""

    def __init__(
        self,
        graph: fx.Graph | None,
        fake_mode: Any,
        *,
        created: list[fx.Node] | None = None,
        constant: Callable[[torch.Tensor, str], Any] | None = None,
        const_array: Callable[[Any], Any] | None = None,
        evaluate: bool = False,
        device: torch.device | str = "cpu",
        cuda_graphs: bool = False,
        inductor: bool = False,
        autotune: bool = False,
        site: str = "",
    ) -> None:
        self.graph = graph
        self.device = device  # where constants made from inline numbers go
        #: the graph will replay as a CUDA graph: lowerings may pick kernels whose extra
        #: launches and buffers cost only there nothing (graphopt::decode_attention)
        self.cuda_graphs = cuda_graphs
        #: inductor compiles the graph: an ATen op it cannot look into must earn its place
        #: against what inductor fuses on its own (aten._addmm_activation on the CPU)
        self.inductor = inductor
        #: inductor will autotune the GEMMs: a lowering may write graphopt's GEMM kernel where it beats
        #: inductor's own compiled code for the site, timed when the rewrite is planned (graphopt.inductor_choices)
        self.autotune = autotune
        #: the node the rewrite stands in for (its name), for the report's per-site decisions
        self.site = site
        self.fake_mode = fake_mode
        self.created = created if created is not None else []
        self._constant = constant
        self._const_array = const_array
        self.evaluate = evaluate

    def const_array(self, x: Any) -> Any:
        """The contents of a constant node (a numpy array), or None."""
        return self._const_array(x) if self._const_array is not None and isinstance(x, fx.Node) else None

    def meta(self, x: Any) -> Any:
        return meta_val(x) if isinstance(x, fx.Node) else x

    def call(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        if self.evaluate:
            return self._run(target, args, kwargs)
        fake_args, fake_kwargs = fx.node.map_arg((args, kwargs), self.meta)
        try:
            val = self._run(target, fake_args, fake_kwargs)
        except RewriteDeclined:
            raise
        except Exception as error:  # the op refuses these inputs: the rewrite is not valid here
            raise RewriteDeclined(f"{target} refuses the rewrite's inputs: {first_line(error)}") from None
        assert self.graph is not None
        node = self.graph.call_function(target, tuple(args), dict(kwargs))
        node.meta["val"] = val
        self.created.append(node)
        return node

    def value_of(self, x: Any, depth: int = 0) -> torch.Tensor | None:
        """x's value where it follows from constants and static shapes alone (the shape
        arithmetic rewrites build: Shape, Slice, Concat, Squeeze, ...), computed on real
        tensors; None where it depends on the graph's inputs."""
        if isinstance(x, InlineConst):
            return None if x.array is None else numpy_to_tensor(x.array)
        if not isinstance(x, fx.Node) or depth > 16:
            return None
        array = self.const_array(x)
        if array is not None:
            return numpy_to_tensor(array)
        if x.op != "call_function" or not isinstance(x.target, torch._ops.OpOverload):
            return None
        if x.target is aten._shape_as_tensor.default:
            dims = self.shape(x.args[0])
            return torch.tensor(dims, dtype=torch.int64) if all(isinstance(d, int) for d in dims) else None
        missing = []

        def value(node: fx.Node) -> Any:
            found = self.value_of(node, depth + 1)
            if found is None:
                missing.append(node)
            return found

        args, kwargs = fx.node.map_arg((x.args, x.kwargs), value)
        if missing:
            return None
        try:
            result = x.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not computable here: treated as a run-time value
            return None
        return result if isinstance(result, torch.Tensor) else None

    def call_with_value(self, target: Any, value: torch.Tensor, *args: Any) -> Any:
        """A call whose result is known (`value`) and is not to be computed on fake tensors."""
        fake = self.fake_mode.from_tensor(value, static_shapes=True) if self.fake_mode is not None else value
        if self.evaluate:
            return fake
        assert self.graph is not None
        node = self.graph.call_function(target, tuple(args), {})
        node.meta["val"] = fake
        self.created.append(node)
        return node

    def _run(self, target: Any, args: Any, kwargs: Any) -> Any:
        if self.fake_mode is None:
            return target(*args, **kwargs)
        with self.fake_mode:
            return target(*args, **kwargs)

    def item(self, x: Any, index: int) -> Any:
        if self.evaluate:
            return x[index]
        return self.call(operator.getitem, x, index)

    def shape(self, x: Any) -> tuple[Any, ...]:
        return tuple(self.meta(x).shape)

    def rank(self, x: Any) -> int:
        return int(self.meta(x).dim())

    def size(self, x: Any, dim: int) -> Any:
        """Dim `dim` of x: an int when static, else a SymInt (evaluating) or a sym_size node."""
        d = self.meta(x).shape[dim]
        if isinstance(d, int) or (isinstance(d, torch.SymInt) and d.node.expr.is_number):
            return int(d)
        return d if self.evaluate else self.call(aten.sym_size.int, x, dim % self.rank(x))

    def constant(self, tensor: torch.Tensor, name: str = "const") -> Any:
        if self.evaluate:
            return self.fake_mode.from_tensor(tensor, static_shapes=True) if self.fake_mode is not None else tensor
        if self._constant is None:
            raise RewriteDeclined("no place for new constants in this graph")
        return self._constant(tensor, name)

    def tensor(self, x: Any, like: Any = None) -> Any:
        """x as a tensor argument: a constant operand becomes a (0-d or vector) constant tensor."""
        if isinstance(x, InlineConst):
            if x.array is None:
                raise RewriteDeclined(f"{x.name} is not a constant tensor")
            device = self.meta(like).device if like is not None else self.device
            return self.constant(numpy_to_tensor(x.array, device), x.name)
        return x


def number(x: Any) -> Any:
    """The Python number a scalar constant stands for."""
    if isinstance(x, InlineConst) and x.array is not None and x.array.size == 1:
        return x.array.reshape(-1)[0].item()
    return None


def ints(b: FxBuilder, x: Any) -> list[Any] | None:
    """An int list operand: a constant vector (inline or a constant node), the symbolic
    list an aten node was given, or the dims of a tensor whose Shape it is."""
    if isinstance(x, InlineConst):
        if x.array is not None:
            return [int(i) for i in x.array.reshape(-1)]
        return list(x.raw) if isinstance(x.raw, (list, tuple)) else None
    if isinstance(x, fx.Node) and x.target is aten._shape_as_tensor.default:  # Shape(src): src's dims, symbolic ones too
        src = x.args[0]
        return [b.size(src, i) for i in range(b.rank(src))]
    value = b.value_of(x)  # shape arithmetic on static dims
    if value is not None and not value.is_floating_point() and value.dim() <= 1:
        return [int(i) for i in value.reshape(-1).tolist()]
    array = b.const_array(x)
    if array is not None and array.dtype.kind in "iu":
        return [int(i) for i in array.reshape(-1)]
    return None



def arg(args: list[Any], i: int) -> Any:
    """The i-th operand, or None where the op was given fewer (an omitted optional input)."""
    return args[i] if i < len(args) else None


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


