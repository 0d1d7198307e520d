"""graphopt's GEMM kernels against inductor's own code, per call site (issue 15, item 1).

Where inductor autotunes (``mode="max-autotune"`` / ``"max-autotune-no-cudagraphs"``, or the user's
``torch._inductor.config.max_autotune`` / ``max_autotune_gemm``) and ``options={"autotune_kernels": True}``,
graphopt's GEMM kernels are kept only where they beat what inductor generates for the same site on the
user's device, and the report says per site which won, by how much. Two kinds of site:

* **GEMM + bias + activation** (graphopt.GemmActivation, graphopt::linear_act): decided *before* inductor
  lowers anything. When the rule's torch lowering is planned, `decide_linear_act` compiles the site's ATen
  form (addmm, then the activation) with inductor in the compile's mode (its GEMM autotuned among its own
  choices, the activation fused as inductor's scheduler decides), times it against graphopt's kernel on
  random inputs of the site's shapes and layouts, and caches the result per shape, layout, dtype, device
  and mode. Unless graphopt's kernel wins (by `WIN_MARGIN`), the rewrite is declined: the site's ATen ops
  stay as dynamo traced them and inductor lowers them exactly as it would without graphopt (a graph with
  no other rewrite goes to inductor as dynamo captured it, so its code is inductor's alone). Where
  graphopt's kernel wins, the site becomes ``graphopt::tuned_linear_act``, which inductor lowers to a call
  of graphopt::linear_act (an extern kernel: nothing fuses into it). inductor's code is timed as CUDA-graph
  replays (its launches cost nothing there), graphopt's as the compiled graph will run it (replayed where
  inductor replays CUDA graphs, else called through the dispatcher): a tie goes to inductor.
  (graphopt's kernel as one more ExternKernelChoice inside inductor's GEMM lowering, the earlier way, put
  the activation after whichever GEMM won, outside the winning template's epilogue: on an H100 a
  2048-token block ran 1.16x inductor alone although inductor's GEMM won both of its sites.)
* **weight-only int8/int4** (graphopt::wq_linear, written by fx_weight_quant where its own timing picked
  the kernel) as ``graphopt::tuned_wq_linear``, through inductor's custom-op autotuning
  (``register_custom_op_autotuning``) at lowering time: its fair opponent, dequantize then the GEMM, reads
  other inputs (a dequantized weight) than a GEMM choice would, so it is a subgraph choice that inductor
  compiles from the ATen form (``wq_linear_reference``; inlined into the graph where it wins, fused with its
  neighbours), timed against graphopt's kernel on the packed weight. An absent zero point or bias is a
  0-element tensor there (that API passes the tensors by position).

* **decode GEMMs** (few rows, a constant weight; written by graphopt.passes.fx_gemv where
  ``options={"gemv": True}``, where inductor replays CUDA graphs) as ``graphopt::tuned_gemv_linear``, through the same
  custom-op autotuning: graphopt::gemv_linear (the op itself, called as an extern kernel) against
  ``linear_by_inductor``, torch's linear, which inductor lowers as it lowers any linear (its extern cuBLAS
  mm, or in max-autotune its GEMM autotuner's pick) and inlines where it wins. An absent bias is a
  0-element tensor there.

Where this torch's inductor lacks an API used here, `problem()` says which, and the backend keeps the
static policy with a report warning.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.library import custom_op

from graphopt.report.model import Alternative, DecisionRecord, Report

__all__ = ["TUNED_OPS", "ACTIVATIONS", "WQ_PROBLEM", "GEMV_PROBLEM", "problem", "install", "inductor_autotunes", "recording",
           "SiteOutcome", "uses_autotune_sites", "wq_sites", "gemv_sites", "dequant_then_linear", "linear_by_inductor",
           "collecting_gemm_timings"]

aten = torch.ops.aten

#: The activations graphopt::linear_act fuses (graphopt.kernels.matmul.ACTIVATIONS).
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
_MAX_AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")


# --------------------------------------------------------------------------- the site op


@custom_op("graphopt::tuned_linear_act", mutates_args=())
def tuned_linear_act(x: Tensor, w: Tensor, bias: Tensor | None, activation: str) -> Tensor:
    """graphopt::linear_act, as a site inductor autotunes (see the module's docstring)."""
    return torch.ops.graphopt.linear_act(x, w, bias, activation)


@tuned_linear_act.register_fake
def _tuned_linear_act_fake(x: Tensor, w: Tensor, bias: Tensor | None, activation: str) -> Tensor:
    from graphopt.kernels.matmul import linear_act_fake

    return linear_act_fake(x, w, bias, activation)


def _present(t: Tensor) -> Tensor | None:
    return t if t.numel() else None


@custom_op("graphopt::tuned_wq_linear", mutates_args=())
def tuned_wq_linear(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor, bias: Tensor, bits: int, block_size: int,
                    k: int) -> Tensor:
    """graphopt::wq_linear as a site inductor autotunes; zeros / bias 0-element tensors where absent."""
    return torch.ops.graphopt.wq_linear(x, packed, scales, _present(zeros), _present(bias), bits, block_size, k)


@tuned_wq_linear.register_fake
def _tuned_wq_linear_fake(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor, bias: Tensor, bits: int, block_size: int,
                          k: int) -> Tensor:
    from graphopt.kernels.wq_matmul import wq_linear_fake

    return wq_linear_fake(x, packed, scales, _present(zeros), _present(bias), bits, block_size, k)


def dequant_then_linear(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor, bias: Tensor, bits: int, block_size: int,
                        k: int) -> Tensor:
    """inductor's side of a wq_linear site: the weight dequantized by ATen ops, then the GEMM (inductor compiles it)."""
    from graphopt.kernels.wq_matmul import wq_linear_reference

    return wq_linear_reference(x, packed, scales, _present(zeros), _present(bias), bits, block_size, k)


@custom_op("graphopt::tuned_gemv_linear", mutates_args=())
def tuned_gemv_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """graphopt::gemv_linear as a site inductor autotunes; bias a 0-element tensor where absent."""
    return torch.ops.graphopt.gemv_linear(x, weight, _present(bias))


@tuned_gemv_linear.register_fake
def _tuned_gemv_linear_fake(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    from graphopt.kernels.gemv import gemv_linear_fake

    return gemv_linear_fake(x, weight, _present(bias))


def linear_by_inductor(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """inductor's side of a gemv_linear site: torch's linear, lowered by inductor as it lowers any linear."""
    return torch.nn.functional.linear(x, weight, _present(bias))


#: The site ops: graphopt's kernel where it won (tuned_linear_act), or offered to inductor's autotuner (tuned_wq_linear,
#: tuned_gemv_linear).
TUNED_OPS = ("graphopt::tuned_linear_act", "graphopt::tuned_wq_linear", "graphopt::tuned_gemv_linear")
_WQ_SELECT = "graphopt_wq_linear"  # the name of its select_algorithm calls
_GEMV_SELECT = "graphopt_gemv_linear"


def uses_autotune_sites(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph holds a site inductor autotunes as it lowers it (graphopt::tuned_wq_linear,
    graphopt::tuned_gemv_linear: its compile then records decisions; the linear_act sites were decided before,
    graphopt.inductor_sites)."""
    autotuned = (torch.ops.graphopt.tuned_wq_linear.default, torch.ops.graphopt.tuned_gemv_linear.default)
    return any(n.op == "call_function" and n.target in autotuned for n in gm.graph.nodes)


# --------------------------------------------------------------------------- can this inductor do it


def problem() -> str | None:
    """None where this torch's inductor has every API used here; else which one it lacks."""
    try:
        import torch._inductor as inductor
        from torch._inductor import compile_fx, config, ir, lowering, select_algorithm
    except Exception as error:  # noqa: BLE001 - an inductor that does not import has no choices to offer
        return f"torch._inductor does not import ({type(error).__name__}: {error})"
    needs = [
        # the linear_act sites: inductor's compiled code for a site, timed (graphopt.inductor_sites); a site graphopt won, lowered
        (compile_fx, "compile_fx"), (inductor, "list_mode_options"), (lowering, "register_lowering"), (ir, "FallbackKernel"),
        (ir, "TensorBox"), (select_algorithm, "add_feedback_saver"), (config, "max_autotune"), (config, "max_autotune_gemm"),
    ]
    missing = [f"{module.__name__}.{name}" for module, name in needs if not hasattr(module, name)]
    if missing:
        return f"this inductor (torch {torch.__version__}) lacks {', '.join(missing)}"
    return None


def inductor_autotunes(mode: str | None) -> bool:
    """Whether inductor will autotune GEMMs in this compile: a max-autotune mode, or the user's config."""
    if mode in _MAX_AUTOTUNE_MODES:
        return True
    try:
        from torch._inductor import config
    except Exception:  # noqa: BLE001
        return False
    return bool(getattr(config, "max_autotune", False) or getattr(config, "max_autotune_gemm", False))


# --------------------------------------------------------------------------- the report of a compile


@dataclass
class SiteOutcome:
    """One wq_linear site autotuned by inductor: which choice won and every choice's time (ms)."""

    site: str
    times_ms: dict[str, float] = field(default_factory=dict)
    graphopt_ms: float | None = None
    winner: str = ""


_STATE = threading.local()


def _report() -> Report | None:
    return getattr(_STATE, "report", None)


@contextlib.contextmanager
def recording(report: Report) -> Iterator[None]:
    """Decisions of the wq_linear sites lowered inside go to `report` (the compile of one graph)."""
    previous = getattr(_STATE, "report", None)
    _STATE.report = report
    before = len(report.decisions)
    try:
        yield
    finally:
        _STATE.report = previous
    if not any(d.kind == "kernel" for d in report.decisions[before:]):
        report.warnings.append("autotune choices: no wq_linear / gemv_linear site was lowered by inductor in this compile "
                               "(its FX graph cache served the compiled code?): no per-site decision recorded")


@contextlib.contextmanager
def collecting_gemm_timings() -> Iterator[dict[str, float]]:
    """Inside: the times of the choices of every select call inductor benchmarks (label -> ms, the best kept)."""
    previous = getattr(_STATE, "gemm_timings", None)
    collected: dict[str, float] = {}
    _STATE.gemm_timings = collected
    try:
        yield collected
    finally:
        _STATE.gemm_timings = previous


def _choice_label(choice: Any) -> str:
    name = str(getattr(choice, "name", "") or type(choice).__name__)
    description = str(getattr(choice, "description", "") or "")
    return f"{name} ({description})" if description else name


def _feedback(timings: dict[Any, float], name: str, input_nodes: Any, choices: Any, *rest: Any) -> None:
    """select_algorithm's feedback hook: the times of every choice of a select call."""
    if str(name).startswith(_WQ_SELECT):
        _wq_feedback(timings, input_nodes)
        return
    if str(name).startswith(_GEMV_SELECT):
        _gemv_feedback(timings, input_nodes)
        return
    collected = getattr(_STATE, "gemm_timings", None)
    if collected is not None:
        for choice, ms in timings.items():
            label = _choice_label(choice)
            collected[label] = min(float(ms), collected.get(label, float("inf")))


# --------------------------------------------------------------------------- the lowering of a site graphopt won


def _replays_cuda_graphs() -> bool:
    from torch._inductor import config

    return bool(getattr(getattr(config, "triton", None), "cudagraphs", False))



def _fallback(x: Any, w: Any, bias: Any, activation: str) -> Any:
    """graphopt's kernel, called as an extern kernel: graphopt::linear_act itself (no second dispatch through the site op)."""
    from torch._inductor import ir

    return ir.TensorBox.create(ir.FallbackKernel.create(torch.ops.graphopt.linear_act.default, x, w, bias, activation))


def _lower_tuned_linear_act(x: Any, w: Any, bias: Any = None, activation: str = "none") -> Any:
    """A site is written only where graphopt's kernel won its timing (graphopt.inductor_sites): it is called."""
    return _fallback(x, w, bias, activation)


def _wq_feedback(timings: dict[Any, float], input_nodes: Any) -> None:
    """A wq_linear site's select call (custom-op autotuning): graphopt's kernel is its fallback choice, the
    rest are inductor's compiled dequantize-then-GEMM; the fastest wins (threshold 1.0)."""
    from torch._inductor.virtualized import V

    node = getattr(V.graph, "current_node", None)
    x, packed = list(input_nodes)[:2]
    site = (f"{getattr(node, 'name', 'wq_linear')} [{'x'.join(str(s) for s in x.get_size())} @ int "
            f"{'x'.join(str(s) for s in packed.get_size())}]")
    outcome = SiteOutcome(site)
    for choice, ms in timings.items():
        if getattr(getattr(choice, "choice", None), "use_fallback_kernel", False):
            outcome.graphopt_ms = float(ms)
        else:
            label = "dequantize + GEMM" + ("" if not outcome.times_ms else f" #{len(outcome.times_ms) + 1}")
            outcome.times_ms[label] = float(ms)
    if outcome.graphopt_ms is not None and outcome.times_ms:
        outcome.winner = "graphopt" if outcome.graphopt_ms <= min(outcome.times_ms.values()) else "inductor"
    _record(outcome)


def _gemv_feedback(timings: dict[Any, float], input_nodes: Any) -> None:
    """A gemv_linear site's select call: graphopt's kernel (the fallback choice) against inductor's lowering of
    the linear; the fastest wins (threshold 1.0: a tie goes to the first choice timed, inductor's)."""
    from torch._inductor.virtualized import V

    node = getattr(V.graph, "current_node", None)
    x, weight = list(input_nodes)[:2]
    site = (f"{getattr(node, 'name', 'gemv_linear')} [{'x'.join(str(s) for s in x.get_size())} @ "
            f"{'x'.join(str(s) for s in weight.get_size())}^T]")
    outcome = SiteOutcome(site)
    for choice, ms in timings.items():
        if getattr(getattr(choice, "choice", None), "use_fallback_kernel", False):
            outcome.graphopt_ms = float(ms)
        else:
            label = "linear" + ("" if not outcome.times_ms else f" #{len(outcome.times_ms) + 1}")
            outcome.times_ms[label] = float(ms)
    if outcome.graphopt_ms is not None and outcome.times_ms:
        outcome.winner = "graphopt" if outcome.graphopt_ms < min(outcome.times_ms.values()) else "inductor"
    _record(outcome, kernel="graphopt::gemv_linear")


def _record(outcome: SiteOutcome, failure: str | None = None, kernel: str = "graphopt::wq_linear") -> None:
    report = _report()
    if report is None:
        return
    inductor_best = min(outcome.times_ms.items(), key=lambda kv: kv[1]) if outcome.times_ms else None
    alternatives = [Alternative(kernel, measured_ms=outcome.graphopt_ms, source="inductor autotune")]
    alternatives += [Alternative(f"inductor {label}", measured_ms=ms, source="inductor autotune") for label, ms in sorted(outcome.times_ms.items(), key=lambda kv: kv[1])]
    if failure is not None:
        chosen, basis, reason = "graphopt", "forced", failure
    elif outcome.graphopt_ms is None or inductor_best is None:
        chosen, basis = ("graphopt" if outcome.winner == "graphopt" else "inductor"), "forced"
        reason = f"not timed (inductor chose without benchmarks: one choice, or config.deterministic): {outcome.winner or 'inductor'} kept"
    else:
        label, best_ms = inductor_best
        chosen, basis = ("graphopt" if outcome.winner == "graphopt" else "inductor"), "measured"
        ratio = best_ms / outcome.graphopt_ms if outcome.graphopt_ms > 0 else float("inf")
        reason = (f"{kernel} {outcome.graphopt_ms:.4f} ms against inductor's best, {label}, {best_ms:.4f} ms: graphopt {ratio:.2f}x; "
                  f"kept: {outcome.winner}")
    report.decisions.append(DecisionRecord(kind="kernel", site=outcome.site, chosen=chosen, baseline="inductor", basis=basis,
                                           reason=reason, alternatives=alternatives))


# --------------------------------------------------------------------------- registration


_INSTALLED: list[bool] = []


def _random_bytes(fake: Tensor) -> Tensor:
    return torch.randint(0, 256, tuple(fake.shape), dtype=torch.uint8, device=fake.device)


def _register_wq_autotuning() -> str | None:
    """graphopt::tuned_wq_linear through inductor's custom-op autotuning; None, or why it is not there."""
    return _register_autotuning(tuned_wq_linear, torch.ops.graphopt.tuned_wq_linear.default, dequant_then_linear, _WQ_SELECT,
                                {"packed": _random_bytes, "zeros": _random_bytes})


def _register_gemv_autotuning() -> str | None:
    """graphopt::tuned_gemv_linear through inductor's custom-op autotuning; None, or why it is not there."""
    op = torch.ops.graphopt.tuned_gemv_linear.default
    why = _register_autotuning(tuned_gemv_linear, op, linear_by_inductor, _GEMV_SELECT, {})
    if why is None:
        _fallback_at_every_site(op, _GEMV_SELECT)
    return why


def _fallback_at_every_site(op: Any, name: str) -> None:
    """Older inductors (torch 2.10's custom-op autotuning) register a site op's fallback choice, graphopt's kernel, as
    ``extern_kernels.<name>_fallback_default`` once and skip it wherever that name exists: every later site would time
    inductor's side alone. gemv_linear's fallback takes tensors only (no per-site arguments baked in), so the name is
    removed before each site is lowered and every site gets its own; newer inductors (one reused choice per op, another
    name) are untouched."""
    from torch._inductor import lowering
    from torch._inductor.kernel import custom_op as inductor_custom_op
    from torch._inductor.select_algorithm import extern_kernels

    stale = f"{name}_fallback_default"
    tables = [t for t in (getattr(inductor_custom_op, "user_lowerings", None), getattr(lowering, "lowerings", None))
              if isinstance(t, dict) and op in t]
    if not tables:
        return
    table = tables[0]
    inner = table[op]

    def lower(*args: Any, **kwargs: Any) -> Any:
        if hasattr(extern_kernels, stale):
            delattr(extern_kernels, stale)
        return inner(*args, **kwargs)

    table[op] = realizing_inputs(lower)


def _register_autotuning(site: Any, op: Any, inductors_side: Any, name: str, input_gen_fns: dict[str, Any]) -> str | None:
    """A site op through inductor's custom-op autotuning: graphopt's kernel (the op, its fallback choice) against
    `inductors_side` compiled by inductor; None, or why it is not there."""
    try:
        from torch._inductor.kernel import custom_op as inductor_custom_op

        def register(**extra: Any) -> None:
            inductor_custom_op.register_custom_op_autotuning(
                site, configs=[inductor_custom_op.CustomOpConfig(inductors_side)], name=name,
                input_gen_fns=input_gen_fns or None, **extra)

        register()
    except Exception as error:  # noqa: BLE001 - an inductor without that API: the site op is not written
        return f"inductor's custom-op autotuning is unavailable ({type(error).__name__}: {error})"
    # Where the compiled graph replays as CUDA graphs, graphopt's kernel (a custom op called from Python) is
    # timed as a replay too, as fx_weight_quant_forms times it; elsewhere its dispatch counts.
    table = getattr(inductor_custom_op, "user_lowerings", None)
    if isinstance(table, dict) and op in table:
        plain = table[op]
        try:
            register(benchmark_with_cudagraphs=True)
        except TypeError:  # an older API without it: timed as called
            table[op] = realizing_inputs(plain)
            return None
        replayed = table[op]
        def lower(x: Any, *args: Any, **kwargs: Any) -> Any:
            on_cuda = getattr(x.get_device(), "type", "") == "cuda"
            return (replayed if on_cuda and _replays_cuda_graphs() else plain)(x, *args, **kwargs)

        table[op] = realizing_inputs(lower)
    return None


def realizing_inputs(lowering: Any) -> Any:
    """`lowering` with its tensor arguments realized first: inductor's custom-op autotuning reads each input's
    strides, which an input still fused into its producer (a Pointwise: the RMSNorm before a decode GEMM) does not
    have yet (torch 2.11: NotImplementedError: Pointwise, on TinyLlama's q/k/v site)."""
    def lower(*args: Any, **kwargs: Any) -> Any:
        for arg in args:
            realize = getattr(arg, "realize", None)
            if callable(realize):
                realize()
        return lowering(*args, **kwargs)

    return lower


#: After install(): "" where the wq_linear site is registered, else why not (its static form then stays).
WQ_PROBLEM: list[str] = []
#: After install(): "" where the gemv_linear site is registered, else why not (no site is then written).
GEMV_PROBLEM: list[str] = []


def wq_sites() -> bool:
    """Whether install() registered the wq_linear site (fx_weight_quant then writes it)."""
    return bool(_INSTALLED) and WQ_PROBLEM == [""]


def gemv_sites() -> bool:
    """Whether install() registered the gemv_linear site (graphopt.passes.fx_gemv then writes it)."""
    return bool(_INSTALLED) and GEMV_PROBLEM == [""]


def install() -> str | None:
    """Register the site ops' inductor lowerings and the feedback hook, once; None, or why not
    (`WQ_PROBLEM` says whether the wq_linear site is there too)."""
    if _INSTALLED:
        return None
    reason = problem()
    if reason is not None:
        return reason
    from torch._inductor import select_algorithm
    from torch._inductor.lowering import register_lowering

    import graphopt.kernels  # noqa: F401  (torch.ops.graphopt.linear_act)

    register_lowering(torch.ops.graphopt.tuned_linear_act.default, type_promotion_kind=None)(_lower_tuned_linear_act)
    WQ_PROBLEM.append(_register_wq_autotuning() or "")
    GEMV_PROBLEM.append(_register_gemv_autotuning() or "")
    select_algorithm.add_feedback_saver(_feedback)
    _INSTALLED.append(True)
    return None
