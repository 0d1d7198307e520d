"""CUDA graphs for graphopt without inductor (options={"inductor": False, "mode": "reduce-overhead"}).

No GPU here: `CudaGraphReplay` runs against a stand-in for torch.cuda whose "graph" records,
during capture, what the captured function computes into its buffers, and re-runs exactly
that on replay (a CUDA graph's semantics: the same kernels on the same memory). The real
capture runs in benchmarks/torch_compile.py (variant graphopt-cg) on the GPU machine.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from fake_cuda_graph import _Stream
from torch._subclasses.fake_tensor import FakeTensorMode

from graphopt.torch_backend import CudaGraphReplay, cuda_graphs_refusal
from graphopt.torch_cudagraphs import context_lost


class _Graph:
    def __init__(self) -> None:
        self.kernels: list[Callable[[], None]] = []
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for kernel in self.kernels:
            kernel()


class FakeCuda:
    """The part of torch.cuda that CudaGraphReplay uses (recording kernels; tests/fake_cuda_graph.py
    has a fake that also undoes a capture's writes)."""

    def __init__(self, fail_capture: bool = False) -> None:
        self.capturing: _Graph | None = None
        self.side_stream_calls = 0
        self.on_side_stream = False
        self.fail_capture = fail_capture

    def Stream(self) -> _Stream:  # noqa: N802 (torch.cuda's name)
        return _Stream()

    def current_stream(self) -> _Stream:
        return _Stream()

    @contextlib.contextmanager
    def stream(self, stream: _Stream) -> Iterator[None]:
        self.on_side_stream = True
        try:
            yield
        finally:
            self.on_side_stream = False

    def CUDAGraph(self) -> _Graph:  # noqa: N802
        return _Graph()

    @contextlib.contextmanager
    def graph(self, graph: _Graph) -> Iterator[None]:
        if self.fail_capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.capturing = graph
        try:
            yield
        finally:
            self.capturing = None


def _doubling_plus_one(cuda: FakeCuda, calls: list[str]) -> Callable[..., tuple[torch.Tensor]]:
    """x * 2 + 1, recording into the graph (as kernels writing the same buffer) while captured."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor]:
        calls.append("capture" if cuda.capturing else "side stream" if cuda.on_side_stream else "plain")
        out = x * 2 + 1
        if cuda.capturing is not None:
            cuda.capturing.kernels.append(lambda: out.copy_(x * 2 + 1))
        return (out,)

    return fn


def test_replay_copies_inputs_in_and_outputs_out() -> None:
    cuda, calls = FakeCuda(), []
    runner = CudaGraphReplay(_doubling_plus_one(cuda, calls), cuda=cuda)
    first_input = torch.arange(4.0)
    (first,) = runner(first_input)
    assert calls == ["side stream"] * CudaGraphReplay.warmup_calls + ["capture"]
    torch.testing.assert_close(first, first_input * 2 + 1)
    (second,) = runner(torch.full((4,), 10.0))
    assert calls[-1] == "capture", "later calls replay, they do not run the function"
    assert runner.graph.replays == 2
    torch.testing.assert_close(second, torch.full((4,), 21.0))
    torch.testing.assert_close(first, first_input * 2 + 1)  # the first output outlived the second call
    assert runner.static_inputs[0] is not first_input  # the graph reads its own buffer
    # Another layout of the same shape is copied into the captured buffer.
    (third,) = runner(torch.arange(8.0)[::2])
    torch.testing.assert_close(third, torch.arange(8.0)[::2] * 2 + 1)


def test_other_shapes_and_gradients_run_without_the_graph() -> None:
    cuda, calls = FakeCuda(), []
    runner = CudaGraphReplay(_doubling_plus_one(cuda, calls), cuda=cuda)
    runner(torch.zeros(4))
    (out,) = runner(torch.ones(3))
    assert calls[-1] == "plain" and runner.graph.replays == 1
    torch.testing.assert_close(out, torch.full((3,), 3.0))
    x = torch.ones(4, requires_grad=True)
    (out,) = runner(x)
    assert calls[-1] == "plain" and out.requires_grad


def test_a_failed_capture_warns_once_and_runs_the_function() -> None:
    cuda, calls = FakeCuda(fail_capture=True), []
    runner = CudaGraphReplay(_doubling_plus_one(cuda, calls), cuda=cuda)
    with pytest.warns(RuntimeWarning, match="CUDA graph capture failed"):
        (out,) = runner(torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 3.0))
    (out,) = runner(torch.zeros(2))
    assert calls[-1] == "plain" and runner.failed is not None
    torch.testing.assert_close(out, torch.ones(2))


def test_which_graphs_are_replayed() -> None:
    with FakeTensorMode() as mode:
        on_cuda = [torch.empty(2, 3, device="cuda"), torch.empty(4, dtype=torch.int64, device="cuda")]
    assert cuda_graphs_refusal(on_cuda, training=False) is None
    assert "gradients" in str(cuda_graphs_refusal(on_cuda, training=True))
    assert "not on CUDA" in str(cuda_graphs_refusal([torch.ones(2)], training=False))
    assert "not on CUDA" in str(cuda_graphs_refusal([], training=False))
    assert "not tensors" in str(cuda_graphs_refusal([*on_cuda, 3], training=False))
    with mode:
        other = torch.empty(2, device="cuda:1")
    assert "more than one device" in str(cuda_graphs_refusal([on_cuda[0], other], training=False))


def test_backend_without_cuda_inputs_reports_and_runs_plainly() -> None:
    """End to end on CPU: the graph runs (correctly) without CUDA graphs, and the report says why."""
    import graphopt
    from graphopt.torch_backend import clear_reports

    torch._dynamo.reset()
    clear_reports()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        got: Any = torch.compile(model, backend="graphopt", options={"inductor": False, "mode": "reduce-overhead"})(x)
        torch.testing.assert_close(got, model(x))
    report = graphopt.last_report()
    assert report is not None and any("not on CUDA" in w for w in report.warnings)
    torch._dynamo.reset()


def _cache_write(cuda: FakeCuda, calls: list[str]) -> Callable[..., tuple[torch.Tensor]]:
    """A decode step's shape: cache[step] = x, step += 1, read the cache (all in place on the inputs)."""

    def kernel(cache: torch.Tensor, step: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
        cache.index_copy_(0, step, x)
        step.add_(1)
        out.copy_(cache.sum(0))

    def fn(cache: torch.Tensor, step: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
        calls.append("capture" if cuda.capturing else "side stream" if cuda.on_side_stream else "plain")
        out = torch.empty(cache.shape[1:])
        if cuda.capturing is not None:  # a capture records, it does not run
            cuda.capturing.kernels.append(lambda: kernel(cache, step, x, out))
        else:
            kernel(cache, step, x, out)
        return (out,)

    return fn


def test_written_inputs_are_the_callers_own_buffers() -> None:
    """A static KV cache and its step counter: the replays write into the caller's tensors, the
    warm-ups into copies (the counter advances once per call), and nothing is copied per call."""
    cuda, calls = FakeCuda(), []
    runner = CudaGraphReplay(_cache_write(cuda, calls), cuda=cuda, written=frozenset({0, 1}))
    cache, step = torch.zeros(4, 2), torch.zeros(1, dtype=torch.long)
    for i in range(3):
        (out,) = runner(cache, step, torch.full((1, 2), float(i + 1)))
        torch.testing.assert_close(out, torch.full((2,), float(sum(range(1, i + 2)))))
    assert calls == ["side stream"] * CudaGraphReplay.warmup_calls + ["capture"]
    assert step.item() == 3, "the warm-ups must not advance the caller's counter"
    torch.testing.assert_close(cache, torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [0.0, 0.0]]))
    assert runner.static_inputs[0] is cache and runner.static_inputs[1] is step
    # Another cache passed later runs without the graph (the captured buffers are the first cache).
    other, other_step = torch.zeros(4, 2), torch.tensor([2])
    (out,) = runner(other, other_step, torch.full((1, 2), 7.0))
    assert calls[-1] == "plain" and runner.graph.replays == 3
    torch.testing.assert_close(out, torch.full((2,), 7.0))
    torch.testing.assert_close(other[2], torch.full((2,), 7.0))
    assert other_step.item() == 3
    torch.testing.assert_close(cache[:3].sum(), torch.tensor(12.0))  # the first cache kept its contents
    assert step.item() == 3


def test_without_written_inputs_the_caller_keeps_its_tensors_unchanged() -> None:
    """The negative: a graph declared as writing nothing works on copies (the pre-existing contract)."""
    cuda, calls = FakeCuda(), []
    runner = CudaGraphReplay(_cache_write(cuda, calls), cuda=cuda)
    cache, step = torch.zeros(4, 2), torch.zeros(1, dtype=torch.long)
    runner(cache, step, torch.ones(1, 2))
    assert step.item() == 0 and cache.abs().sum() == 0


def test_every_warm_up_starts_from_the_callers_values() -> None:
    """A cache with room for one call: each warm-up writes at the caller's step, not one further
    (on one copy of the counter the second warm-up wrote past the end: a device-side assert on
    the GPU). Before the fix this capture failed and the graph ran without CUDA graphs."""
    cuda, calls = FakeCuda(), []
    seen_steps: list[int] = []
    write = _cache_write(cuda, calls)

    def fn(cache: torch.Tensor, step: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
        if cuda.capturing is None:
            seen_steps.append(int(step))
        return write(cache, step, x)

    runner = CudaGraphReplay(fn, cuda=cuda, written=frozenset({0, 1}))
    cache, step = torch.zeros(1, 2), torch.zeros(1, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        (out,) = runner(cache, step, torch.full((1, 2), 5.0))
    assert runner.failed is None and runner.graph.replays == 1
    assert seen_steps == [0] * CudaGraphReplay.warmup_calls, "every warm-up saw the caller's counter"
    assert step.item() == 1
    torch.testing.assert_close(cache, torch.full((1, 2), 5.0))
    torch.testing.assert_close(out, torch.full((2,), 5.0))


def test_an_error_that_loses_the_cuda_context_is_raised_not_followed_by_a_fallback() -> None:
    calls: list[str] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append("run")
        raise RuntimeError("CUDA error: device-side assert triggered")

    runner = CudaGraphReplay(fn, cuda=FakeCuda())
    with pytest.raises(RuntimeError, match="no fallback") as raised:
        runner(torch.ones(2))
    assert "device-side assert" in str(raised.value.__cause__)
    assert calls == ["run"], "nothing ran after the error (the fallback would fail in another op)"
    assert context_lost(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not context_lost(RuntimeError("CUDA error: operation not permitted when stream is capturing"))


def test_a_written_input_sharing_memory_with_another_is_not_captured() -> None:
    """Checked before any warm-up: captured at the caller's memory, the written input would be
    read through the other input's copy, which no replay updates."""
    calls: list[str] = []

    def fn(step: torch.Tensor, seen: torch.Tensor) -> tuple[torch.Tensor]:
        calls.append("run")
        step.add_(1)
        return (seen * 10,)

    runner = CudaGraphReplay(fn, cuda=FakeCuda(), written=frozenset({0}))
    steps = torch.zeros(2, dtype=torch.long)
    with pytest.warns(RuntimeWarning, match="shares memory"):
        (out,) = runner(steps[:1], steps[1:])
    assert calls == ["run"] and runner.graph is None and runner.failed is not None
    (out,) = runner(steps[:1], steps[:1])
    assert calls == ["run", "run"] and out.item() == 20 and steps[0].item() == 2
