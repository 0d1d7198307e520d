"""A GEMM + bias + activation site decided before inductor lowers it: graphopt::linear_act against
inductor's own compiled code for the same site (issue 15, item 1; graphopt.inductor_choices says how the
sites fit together).

`decide_linear_act` is asked by the torch lowering of graphopt.GemmActivation while the rewrite is planned
(graphopt.ops.torch_fused), where inductor will autotune. It compiles the site's ATen form with inductor in
the compile's mode: ``addmm(bias, x, w)`` (``mm`` without a bias) then the activation, x, w and the bias
random tensors of the site's shapes, strides, dtype and device, so inductor autotunes the GEMM among its
own choices and fuses the activation as its scheduler decides, exactly as it does in the model. It times
that code against graphopt::linear_act on the same inputs and caches the outcome per shape, layout, dtype,
device and mode. The rewrite goes ahead only where graphopt's kernel is faster by `WIN_MARGIN`; anywhere
else it is declined and the site's ATen ops stay untouched, for inductor to lower them as it would
without graphopt.

How each side is timed (`benchmark`; tests replace it): inductor's code as CUDA-graph replays, where its
launches cost nothing; graphopt's kernel as the compiled graph runs it, replayed where inductor replays the
graph as a CUDA graph, else called through the dispatcher as its extern call is. Both medians of
``triton.testing.do_bench`` (L2 flushed between runs). On the CPU, wall-clock medians. Where graphopt's
kernel looks faster, both sides are timed again and each keeps its better time: a slow moment of inductor's
side alone is not a win.

What the site's timing cannot see: inductor may fuse more into the winning GEMM's epilogue in the model (a
residual add after the activation) than in the site alone; graphopt's kernel, an extern call, fuses
nothing. A graphopt win is a win over the site as compiled alone.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graphopt.report.model import Alternative, DecisionRecord, Report

__all__ = ["WIN_MARGIN", "SiteTiming", "deciding", "decide_linear_act", "clear_site_timings", "benchmark"]

#: graphopt's kernel is kept only where its time is below this fraction of inductor's (a tie, or noise, keeps inductor's).
WIN_MARGIN = 0.97
_MAX_AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class SiteTiming:
    """One site's shapes timed: both sides (ms), inductor's pick for the GEMM where its autotuner said."""

    graphopt_ms: float | None = None
    inductor_ms: float | None = None
    inductor_gemm: str = ""
    failure: str | None = None  # why it was not timed (inductor's own lowering is then kept)

    @property
    def graphopt_wins(self) -> bool:
        return (self.failure is None and self.graphopt_ms is not None and self.inductor_ms is not None
                and self.graphopt_ms < WIN_MARGIN * self.inductor_ms)


#: (shapes, strides, dtype, device, activation, mode, replay, inductor's GEMM backends) -> its timing, for this process.
_TIMINGS: dict[tuple[Any, ...], SiteTiming] = {}


def clear_site_timings() -> None:
    _TIMINGS.clear()


@dataclass
class _Compile:
    """The compile whose rewrites are being planned: where its decisions go, inductor's mode, CUDA graphs."""

    report: Report | None
    mode: str | None
    replay: bool
    recorded: set[str] = field(default_factory=set)


_STATE = threading.local()


@contextlib.contextmanager
def deciding(report: Report | None, mode: str | None, replay: bool) -> Iterator[None]:
    """Inside: the sites planned are timed for inductor in `mode` (`replay`: the compiled graph replays as a CUDA
    graph) and decided, each recorded once in `report`."""
    previous = getattr(_STATE, "compile", None)
    _STATE.compile = _Compile(report, mode, replay)
    try:
        yield
    finally:
        _STATE.compile = previous


def _dims(t: Any) -> str:
    return "x".join(str(d) for d in t.shape)


def _static(t: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    sizes, strides = tuple(t.shape), tuple(t.stride())
    return (sizes, strides) if all(type(d) is int for d in (*sizes, *strides)) else None  # noqa: E721 - SymInt is no int


def decide_linear_act(site: str, x: Any, w: Any, bias: Any, activation: str) -> str | None:
    """None where graphopt::linear_act beats inductor's compiled code for this site (timed now, or earlier
    for the same shapes); else why not, and the rewrite is declined. x [..., K], w [K, N], bias [N] or None:
    tensors or fake tensors (only their shapes, strides, dtype and device are read)."""
    compile = getattr(_STATE, "compile", None) or _Compile(None, "max-autotune-no-cudagraphs", False)
    name = f"{site or 'gemm'} [{_dims(x)} @ {_dims(w)}{' + bias' if bias is not None else ''}, {activation}]"
    layouts = [_static(t) for t in (x, w, bias) if t is not None]
    if any(layout is None for layout in layouts):
        timing = SiteTiming(failure="symbolic shapes: not timed")
    else:
        key = (*layouts, bias is not None, str(x.dtype), str(x.device), activation, compile.mode, compile.replay, _gemm_backends())
        cached = _TIMINGS.get(key)
        timing = cached if cached is not None else _TIMINGS.setdefault(key, _time_site(x, w, bias, activation, compile))
    if name not in compile.recorded:
        compile.recorded.add(name)
        _record(compile.report, name, timing, activation)
    if timing.graphopt_wins:
        return None
    if timing.failure is not None:
        return f"graphopt::linear_act not timed against inductor ({timing.failure}): inductor's own lowering kept"
    return (f"inductor's compiled code for this site ({timing.inductor_ms:.4f} ms) is not beaten by graphopt::linear_act "
            f"({timing.graphopt_ms:.4f} ms): inductor's own lowering kept")


def _gemm_backends() -> str:
    from torch._inductor import config

    return str(getattr(config, "max_autotune_gemm_backends", ""))


# --------------------------------------------------------------------------- timing a site


def _random_like(t: Any) -> torch.Tensor:
    out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
    return out.normal_(0.0, 0.5)


def _apply(y: torch.Tensor, activation: str) -> torch.Tensor:
    """The activation as a model writes it (dynamo's graph holds these calls)."""
    import torch.nn.functional as F

    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if activation == "gelu":
        return F.gelu(y)
    if activation == "silu":
        return F.silu(y)
    return y


def _site_graph(x: torch.Tensor, w: torch.Tensor, with_bias: bool, activation: str) -> torch.fx.GraphModule:
    """The site's ATen form as an FX graph of (x, w[, bias]): x flattened to 2-D, addmm / mm, the activation, x's shape back."""
    rows, k, out_shape = x.numel() // x.shape[-1], x.shape[-1], [*x.shape[:-1], w.shape[1]]

    def with_bias_site(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return _apply(torch.addmm(bias, x.reshape(rows, k), w), activation).reshape(out_shape)

    def bias_free_site(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _apply(torch.mm(x.reshape(rows, k), w), activation).reshape(out_shape)

    return torch.fx.symbolic_trace(with_bias_site if with_bias else bias_free_site)


@contextlib.contextmanager
def _outside_the_compile() -> Iterator[None]:
    """Real tensors and a compile of its own, while dynamo's compile of the model is under way."""
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), tracing(None), torch.no_grad():
        yield


def _compile_site(inputs: list[torch.Tensor], with_bias: bool, activation: str, mode: str | None) -> tuple[Callable[..., Any], str]:
    """inductor's code for the site, in `mode` without CUDA graphs (the timing replays it itself), and the
    GEMM choice its autotuner kept ("" where it benchmarked none: a cache hit)."""
    from torch._inductor import compile_fx, list_mode_options

    from graphopt import inductor_choices

    patches = dict(list_mode_options(mode)) if mode in _MAX_AUTOTUNE_MODES else {}
    patches["triton.cudagraphs"] = False
    with inductor_choices.collecting_gemm_timings() as gemm_timings:
        compiled: Callable[..., Any] = compile_fx.compile_fx(  # type: ignore[assignment]
            _site_graph(inputs[0], inputs[1], with_bias, activation), list(inputs), config_patches=patches)
    best = min(gemm_timings.items(), key=lambda kv: kv[1], default=("", 0.0))
    return compiled, best[0]


def _time_site(x: Any, w: Any, bias: Any, activation: str, compile: _Compile) -> SiteTiming:
    import graphopt.kernels  # noqa: F401  (torch.ops.graphopt.linear_act)

    timing = SiteTiming()
    try:
        with _outside_the_compile():
            inputs = [_random_like(t) for t in (x, w, bias) if t is not None]
            inductor_fn, timing.inductor_gemm = _compile_site(inputs, bias is not None, activation, compile.mode)

            def graphopt_fn(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
                return torch.ops.graphopt.linear_act(x, w, bias, activation)

            timing.inductor_ms = benchmark("inductor", inductor_fn, inputs, True)
            timing.graphopt_ms = benchmark("graphopt", graphopt_fn, inputs, compile.replay)
            if timing.graphopt_wins:  # a win is confirmed by a second round (each side's best of two): a slow moment is no win
                timing.inductor_ms = min(timing.inductor_ms, benchmark("inductor", inductor_fn, inputs, True))
                timing.graphopt_ms = min(timing.graphopt_ms, benchmark("graphopt", graphopt_fn, inputs, compile.replay))
    except Exception as error:  # noqa: BLE001 - a site that cannot be timed keeps inductor's own lowering
        text = str(error).strip().splitlines()
        timing.failure = f"{type(error).__name__}: {text[0] if text else ''}"
    return timing


def _cuda_ms(call: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    try:
        return float(do_bench(call, warmup=10, rep=40, return_mode="median"))
    except TypeError:  # a triton without return_mode
        return float(do_bench(call, warmup=10, rep=40))


def _replayed(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    """fn(*inputs) captured as a CUDA graph (after warm-up runs on a side stream, as torch's docs ask): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*inputs)
    return graph.replay


def benchmark(side: str, fn: Callable[..., Any], inputs: Sequence[torch.Tensor], replay: bool) -> float:
    """Median ms of fn(*inputs); on CUDA as CUDA-graph replays where `replay` (falls back to calls where the
    capture fails). `side` ("graphopt" / "inductor") names whose code it is (tests fix the times by it)."""
    for _ in range(3):
        fn(*inputs)
    if inputs[0].device.type != "cuda":
        times = []
        for _ in range(20):
            started = time.perf_counter()
            fn(*inputs)
            times.append((time.perf_counter() - started) * 1e3)
        return statistics.median(times)
    call: Callable[[], Any] = lambda: fn(*inputs)  # noqa: E731
    if replay:
        try:
            call = _replayed(fn, inputs)
        except Exception:  # noqa: BLE001 - not capturable here: timed as called
            torch.cuda.synchronize()
    return _cuda_ms(call)


# --------------------------------------------------------------------------- the report


def _record(report: Report | None, name: str, timing: SiteTiming, activation: str) -> None:
    if report is None:
        return
    form = f"addmm + {activation}" if activation != "none" else "addmm"
    gemm = timing.inductor_gemm.split(" (")[0]  # the choice's name; its full label (a template's block sizes) in `source`
    inductor = f"inductor {form}" + (f" (GEMM: {gemm})" if gemm else "")
    alternatives = [Alternative("graphopt::linear_act", measured_ms=timing.graphopt_ms, source="site timing"),
                    Alternative(inductor, measured_ms=timing.inductor_ms, source="site timing: inductor's compiled code"
                                + (f"; its autotuner's GEMM pick {timing.inductor_gemm}" if timing.inductor_gemm else ""))]
    if timing.failure is not None or timing.graphopt_ms is None or timing.inductor_ms is None:
        report.decisions.append(DecisionRecord(
            kind="kernel", site=name, chosen="inductor", baseline="inductor", basis="forced", alternatives=alternatives,
            reason=f"not timed ({timing.failure}): inductor's own lowering kept, the site's ATen ops left as they were"))
        return
    ratio = timing.inductor_ms / timing.graphopt_ms if timing.graphopt_ms > 0 else float("inf")
    kept = ("graphopt (graphopt::linear_act called as an extern kernel)" if timing.graphopt_wins
            else "inductor (its own lowering: the site's ATen ops left as they were)")
    close = "" if timing.graphopt_wins or timing.graphopt_ms >= timing.inductor_ms else f" (faster by less than {1 - WIN_MARGIN:.0%}: a tie)"
    report.decisions.append(DecisionRecord(
        kind="kernel", site=name, chosen="graphopt" if timing.graphopt_wins else "inductor", baseline="inductor", basis="measured",
        reason=(f"graphopt::linear_act {timing.graphopt_ms:.4f} ms against {inductor}, compiled by inductor for this site, "
                f"{timing.inductor_ms:.4f} ms: graphopt {ratio:.2f}x{close}; kept: {kept}"),
        alternatives=alternatives))
