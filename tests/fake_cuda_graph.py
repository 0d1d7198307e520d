"""A CPU stand-in for the part of torch.cuda that graphopt's CudaGraphReplay uses, which
captures any function the way a CUDA graph does, so the real rewritten graphs (a transformers
StaticCache decode step included) can be captured and replayed without a GPU.

During `graph(g)` every ATen op (and graphopt kernel) is recorded with the tensors it read
and wrote; what the ops wrote into memory that existed before the capture is put back at
its end (a capture launches nothing: the caller's KV cache and step counter stay as they
were). `replay()` runs the recorded ops again on the same tensors, the results copied into
the tensors the capture produced (the graph's fixed memory). A host read during capture
(`.item()`, data-dependent shapes) raises, as it does on the GPU.

`checks` run before every op of the warm-ups and the replays (not the capture: its values
are not computed on a GPU): `index_in_range` raises where an index_copy_/index_put_ would
trip CUDA's device-side assert, which would leave the process's CUDA context unusable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

Check = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]


class DeviceSideAssert(RuntimeError):
    """What the GPU would do: an assert in a kernel (the CUDA context is lost after it)."""


def index_in_range(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """index_copy(_)(self, dim, index, source) and index_put(_) with an index outside self's dim."""
    if func in (aten.index_copy_.default, aten.index_copy.default):
        target, dim, index = args[0], args[1], args[2]
        size = target.shape[dim]
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
            raise DeviceSideAssert(f"index_copy_(): index out of bounds: {index.tolist()} for a dim of {size}")
    elif func in (aten.index_put_.default, aten.index_put.default):
        target, indices = args[0], args[1]
        for dim, index in enumerate(indices):
            if isinstance(index, torch.Tensor) and index.dtype != torch.bool and index.numel():
                size = target.shape[dim]
                if int(index.min()) < -size or int(index.max()) >= size:
                    raise DeviceSideAssert(f"index_put_(): index out of bounds: {index.tolist()} for a dim of {size}")


def _writes(func: Any) -> list[int]:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _returns_alias(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


class _Checking(TorchDispatchMode):
    def __init__(self, checks: list[Check]) -> None:
        super().__init__()
        self.checks = checks

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        for check in self.checks:
            check(func, args, kwargs)
        return func(*args, **kwargs)


class _Recording(TorchDispatchMode):
    def __init__(self, graph: FakeGraph) -> None:
        super().__init__()
        self.graph = graph
        self.created: set[int] = set()  # storages made during the capture (the graph's own memory)
        self.saved: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}  # pre-existing tensors written: (tensor, old value)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing (a host read)")
        flat = [*args, *kwargs.values()]
        for i in _writes(func):
            written = flat[i] if i < len(args) else None
            for tensor in (t for t in tree_flatten(written)[0] if isinstance(t, torch.Tensor)):
                key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
                if tensor.untyped_storage().data_ptr() not in self.created and key not in self.saved:
                    self.saved[key] = (tensor, tensor.detach().clone())
        out = func(*args, **kwargs)
        for tensor in (t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):
            if not _returns_alias(func):
                self.created.add(tensor.untyped_storage().data_ptr())
        self.graph.ops.append((func, args, kwargs, out))
        return out

    def undo_writes(self) -> None:
        with torch.no_grad():
            for tensor, old in self.saved.values():
                tensor.copy_(old)


class FakeGraph:
    """The recorded ops of one capture; replay() runs them again on the same tensors."""

    def __init__(self, checks: list[Check]) -> None:
        self.ops: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = []
        self.checks = checks
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                for check in self.checks:
                    check(func, args, kwargs)
                result = func(*args, **kwargs)
                if _returns_alias(func):
                    continue  # a view or an in-place write: it already is the captured tensor
                for fixed, fresh in zip(tree_flatten(out)[0], tree_flatten(result)[0]):
                    if isinstance(fixed, torch.Tensor):
                        fixed.copy_(fresh)


class _Stream:
    def wait_stream(self, other: _Stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


class FakeCuda:
    """torch.cuda's Stream, current_stream, stream, CUDAGraph and graph, on the CPU."""

    def __init__(self, checks: tuple[Check, ...] = (index_in_range,)) -> None:
        self.checks = list(checks)
        self.graphs: list[FakeGraph] = []
        self.warmup_calls = 0

    def Stream(self) -> _Stream:  # noqa: N802 (torch.cuda's name)
        return _Stream()

    def current_stream(self) -> _Stream:
        return _Stream()

    @contextlib.contextmanager
    def stream(self, stream: _Stream) -> Iterator[None]:
        # The warm-ups run here: their kernels run on the GPU, so the checks apply.
        self.warmup_calls += 1
        with _Checking(self.checks):
            yield

    def CUDAGraph(self) -> FakeGraph:  # noqa: N802
        graph = FakeGraph(self.checks)
        self.graphs.append(graph)
        return graph

    @contextlib.contextmanager
    def graph(self, graph: FakeGraph) -> Iterator[None]:
        recording = _Recording(graph)
        try:
            with recording:
                yield
        finally:
            recording.undo_writes()
