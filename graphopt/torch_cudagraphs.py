"""Running a rewritten FX graph as one CUDA graph without inductor (mode="reduce-overhead", inductor off).

`cuda_graphs_refusal` says why a graph cannot be replayed (inputs not all CUDA tensors,
dynamic shapes, gradients flowing); `CudaGraphReplay` captures the graph on its first
call and replays it afterwards. It is graphopt's own capture, not dynamo's "cudagraphs"
backend, which re-traces with aot_autograd and rejects graphopt's triton_op nodes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["CudaGraphReplay", "context_lost", "cuda_graphs_refusal"]

#: CUDA errors after which the process's CUDA context runs nothing more (sticky errors).
_STICKY_ERRORS = ("device-side assert", "illegal memory access", "unspecified launch failure", "misaligned address",
                  "illegal instruction")


def context_lost(error: BaseException) -> bool:
    """Whether `error` is a CUDA error that leaves the CUDA context unusable."""
    text = str(error).lower()
    return any(sticky in text for sticky in _STICKY_ERRORS)


def cuda_graphs_refusal(inputs: Sequence[Any], training: bool) -> str | None:
    """Why the rewritten graph cannot be replayed as one CUDA graph (None: it can)."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if len(tensors) != len(inputs):
        return "some inputs are not tensors (symbolic sizes or Python values)"
    if not tensors or not all(x.is_cuda for x in tensors):
        return "these inputs are not on CUDA"
    if len({x.device for x in tensors}) > 1:
        return "the inputs are on more than one device"
    if training:
        return "gradients flow through this graph"
    if any(not isinstance(d, int) for x in tensors for d in (*x.shape, *x.stride())):
        return "the input shapes are dynamic"
    return None


class CudaGraphReplay:
    """Runs `fn` as one CUDA graph: the first call warms up (Triton compiles, cuBLAS sets up)
    and captures; later calls copy their inputs into the captured input buffers, replay, and
    return copies of the captured outputs (so an output stays valid after the next call).

    Inputs the graph writes to (`written`: positions; a static KV cache) are captured as
    the caller's tensors themselves, not copies: a replay writes where the caller reads, with
    no copy of the cache per step. A later call that passes another tensor there runs `fn`
    as it is (the graph's buffer is the first caller's cache, which must keep its contents).
    The warm-up calls write into copies only (a step counter must not advance three times),
    and each starts from the caller's values: the written copies are put back before each, so
    every warm-up computes what this call computes (no index the call itself would not use).

    A call whose inputs differ in shape, dtype or device from the captured ones, or
    that needs gradients, runs `fn` as it is; so does every call after a failed or refused
    capture (with a RuntimeWarning). An error that leaves the CUDA context unusable (a
    device-side assert) is raised, not followed by a fallback that cannot run either.
    `cuda` is the torch.cuda API (tests pass a stand-in).
    """

    warmup_calls = 3

    def __init__(self, fn: Callable[..., Any], cuda: Any = None, written: frozenset[int] = frozenset()) -> None:
        self.fn = fn
        self.cuda = cuda if cuda is not None else torch.cuda
        self.written = written
        self.graph: Any = None
        self.static_inputs: list[Any] = []
        self.static_outputs: Any = None
        self.failed: str | None = None

    def __call__(self, *args: Any) -> Any:
        if self.failed is not None or (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
            return self.fn(*args)
        if self.graph is None:
            refusal = self._refusal(args)
            if refusal is not None:
                self.failed = refusal
                warnings.warn(f"graphopt: no CUDA graph for this graph: {refusal}; it runs without CUDA graphs", RuntimeWarning, stacklevel=2)
                return self.fn(*args)
            try:
                self._capture(args)
            except Exception as error:  # an op that cannot be captured: run without CUDA graphs
                self.failed = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
                self.graph = None
                if context_lost(error):
                    raise RuntimeError(
                        f"graphopt: a kernel failed while warming up this graph for CUDA graph capture ({self.failed}); "
                        "after a device-side error the CUDA context runs nothing more, so there is no fallback. The warm-ups "
                        "ran on this call's own input values: the call fails without CUDA graphs too "
                        "(CUDA_LAUNCH_BLOCKING=1 names the op)") from error
                warnings.warn(f"graphopt: CUDA graph capture failed ({self.failed}); this graph runs without CUDA graphs", RuntimeWarning, stacklevel=2)
                return self.fn(*args)
        elif not self._matches(args):
            return self.fn(*args)
        for static, arg in zip(self.static_inputs, args):
            if isinstance(static, torch.Tensor) and static is not arg:
                static.copy_(arg)
        self.graph.replay()
        return torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, self.static_outputs)

    def _capture(self, args: Sequence[Any]) -> None:
        cuda = self.cuda
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        # Warm up on a side stream (as torch.cuda.graphs documents): lazy initialisations
        # (Triton compiling, autotuning, cuBLAS workspaces) must not happen during capture.
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):
            for _ in range(self.warmup_calls):
                # Each warm-up starts from the caller's values. A StaticCache's write index is
                # arange(new tokens) + its step counter (an input the graph advances): three
                # warm-ups on one copy wrote up to three calls ahead, past the cache's end
                # (the GPU's device-side assert in index_copy_, and a lost CUDA context).
                for i in self.written:
                    copies[i].copy_(args[i])
                self.fn(*copies)
            side.synchronize()  # a warm-up kernel's error shows here, not in the middle of the capture
        cuda.current_stream().wait_stream(side)
        # Written inputs are captured at the caller's own addresses (no copy in or out per call).
        self.static_inputs = [a if i in self.written else c for i, (a, c) in enumerate(zip(args, copies))]
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            self.static_outputs = self.fn(*self.static_inputs)
        self.graph = graph

    def _refusal(self, args: Sequence[Any]) -> str | None:
        """Checked before anything runs: why these inputs cannot be captured as given (None: they can)."""
        if any(i >= len(args) or not isinstance(args[i], torch.Tensor) for i in self.written):
            return "an input the graph writes to is not a tensor"
        # A written input is captured at the caller's memory, the others as copies: if they
        # shared memory, the graph would read a stale copy of what it writes.
        storages = [a.untyped_storage().data_ptr() if isinstance(a, torch.Tensor) and a.numel() else None for a in args]
        for i in sorted(self.written):
            shared = [j for j, storage in enumerate(storages) if j not in self.written and storage is not None and storage == storages[i]]
            if shared:
                return f"input {i}, which the graph writes to, shares memory with input {shared[0]}"
        return None

    def _matches(self, args: Sequence[Any]) -> bool:
        if len(args) != len(self.static_inputs):
            return False
        for i, (static, arg) in enumerate(zip(self.static_inputs, args)):
            if i in self.written and arg is not static:
                return False
            if isinstance(static, torch.Tensor):
                # Strides may differ: copy_ writes any layout into the captured buffer.
                if not (isinstance(arg, torch.Tensor) and arg.shape == static.shape and arg.dtype == static.dtype and arg.device == static.device):
                    return False
            elif arg != static:
                return False
        return True
