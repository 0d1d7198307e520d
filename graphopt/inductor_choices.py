"""graphopt's GEMM kernels as inductor autotune choices, timed against inductor's own (issue 15, item 1).

Where inductor autotunes (``mode="max-autotune"`` / ``"max-autotune-no-cudagraphs"``, or the user's
``torch._inductor.config.max_autotune`` / ``max_autotune_gemm``), the torch lowering writes a GEMM with
a bias and an epilogue activation (graphopt.GemmActivation) as ``torch.ops.graphopt.tuned_linear_act``
instead of the static choice (aten._addmm_activation). That op exists for inductor only:
``graphopt::linear_act`` is a ``triton_op``, which aot_autograd decomposes into its Triton launch (or,
on the CPU, its reference's ATen ops) before inductor lowers anything, so no lowering of it would ever
run; ``tuned_linear_act`` is a plain custom op that calls it, and this module registers its inductor
lowering:

* inductor autotuning: inductor's own choices for the same computation (``tuned_addmm``, or
  ``tuned_mm`` without a bias: cuBLAS, its Triton templates, ...) plus graphopt's kernel as one more
  ``ExternKernelChoice``, all given to ``autotune_select_algorithm``, which times them on the user's
  device and keeps the fastest. graphopt's time includes its fused activation; inductor's is the GEMM
  alone (its activation follows as an epilogue: fused into a Triton template, or one more kernel after
  cuBLAS), so graphopt's kernel is kept only where it beats inductor's GEMM without its epilogue;
* not autotuning (a safety net; the lowering only writes the op when inductor will autotune): the
  graphopt kernel, as the static policy would have run it.

Every site leaves a decision in the report (kind "kernel", basis "measured"): the winner, graphopt's
time against inductor's best, every choice's time (select_algorithm's feedback hook). Where this
torch's inductor lacks an API used here, `problem()` says which, and the backend keeps the static
policy with a report warning.

graphopt::wq_linear (weight-only int8/int4, written by fx_weight_quant where its own timing picked
the kernel) goes the same way as ``graphopt::tuned_wq_linear``, through inductor's custom-op autotuning
(``register_custom_op_autotuning``): its fair opponent, dequantize then the GEMM, reads other inputs
(a dequantized weight) than a GEMM choice would, so it is a subgraph choice that inductor compiles
from the ATen form (``wq_linear_reference``; inlined into the graph where it wins, fused with its
neighbours), timed against graphopt's kernel on the packed weight. An absent zero point or bias is a
0-element tensor there (that API passes the tensors by position).
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

__all__ = ["TUNED_OPS", "ACTIVATIONS", "WQ_PROBLEM", "problem", "install", "inductor_autotunes", "recording", "SiteOutcome",
           "uses_autotune_sites", "wq_sites", "dequant_then_linear"]

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


#: The ops whose inductor lowering offers graphopt's kernel as a choice.
TUNED_OPS = ("graphopt::tuned_linear_act", "graphopt::tuned_wq_linear")
_WQ_SELECT = "graphopt_wq_linear"  # the name of its select_algorithm calls


def uses_autotune_sites(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph holds a site op (its compile then records decisions)."""
    targets = {torch.ops.graphopt.tuned_linear_act.default, torch.ops.graphopt.tuned_wq_linear.default}
    return any(n.op == "call_function" and n.target in targets for n in gm.graph.nodes)


# --------------------------------------------------------------------------- can this inductor do it


def problem() -> str | None:
    """None where this torch's inductor has every API used here; else which one it lacks."""
    try:
        from torch._inductor import config, ir, lowering, select_algorithm
        from torch._inductor.kernel import mm
    except Exception as error:  # noqa: BLE001 - an inductor that does not import has no choices to offer
        return f"torch._inductor does not import ({type(error).__name__}: {error})"
    needs = [
        (select_algorithm, "ExternKernelChoice"), (select_algorithm, "ExternKernelCaller"), (select_algorithm, "add_feedback_saver"),
        (select_algorithm, "autotune_select_algorithm"), (mm, "tuned_addmm"), (mm, "tuned_mm"), (mm, "autotune_select_algorithm"),
        (lowering, "register_lowering"), (lowering, "lowerings"), (ir, "FallbackKernel"), (ir, "ExternKernelAlloc"),
        (config, "max_autotune"), (config, "max_autotune_gemm"),
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
    """One autotuned site: which choice won and every choice's time (ms)."""

    site: str
    graphopt_choice: Any = None  # our ChoiceCaller
    times_ms: dict[str, float] = field(default_factory=dict)
    graphopt_ms: float | None = None
    winner: str = ""


_STATE = threading.local()


def _report() -> Report | None:
    return getattr(_STATE, "report", None)


@contextlib.contextmanager
def recording(report: Report) -> Iterator[None]:
    """Decisions of the sites lowered inside go to `report` (the compile of one graph)."""
    previous = getattr(_STATE, "report", None)
    _STATE.report = report
    before = len(report.decisions)
    try:
        yield
    finally:
        _STATE.report = previous
    if not any(d.kind == "kernel" for d in report.decisions[before:]):
        report.warnings.append("autotune choices: no GEMM site was lowered by inductor in this compile "
                               "(its FX graph cache served the compiled code?): no per-site decision recorded")


#: Our choices alive in a select call -> their site (the feedback hook reads it).
_PENDING: dict[int, SiteOutcome] = {}


def _choice_label(choice: Any) -> str:
    name = str(getattr(choice, "name", "") or type(choice).__name__)
    description = str(getattr(choice, "description", "") or "")
    return f"{name} ({description})" if description and not name.startswith("graphopt") else name


def _feedback(timings: dict[Any, float], name: str, input_nodes: Any, choices: Any, *rest: Any) -> None:
    """select_algorithm's feedback hook: the times of every choice of a select call with ours in it."""
    if str(name).startswith(_WQ_SELECT):
        _wq_feedback(timings, input_nodes)
        return
    outcome = next((_PENDING[id(c)] for c in list(timings) + list(choices or []) if id(c) in _PENDING), None)
    if outcome is None:
        return
    for choice, ms in timings.items():
        label = _choice_label(choice)
        if choice is outcome.graphopt_choice:
            outcome.graphopt_ms = float(ms)
        else:
            outcome.times_ms[label] = min(float(ms), outcome.times_ms.get(label, float("inf")))


# --------------------------------------------------------------------------- graphopt's extern choices


def _graphopt_linear_act(activation: str) -> Any:
    """graphopt::linear_act with this activation, called as select_algorithm calls an extern choice:
    (bias, x, w) for an addmm (the bias 1-D, or the [M, N] broadcast inductor benchmarks with), (x, w) for an mm."""

    def run(*inputs: Tensor) -> Tensor:
        if len(inputs) == 3:
            bias, x, w = inputs
            bias = bias if bias.dim() == 1 else bias[0]
        else:
            (x, w), bias = inputs, None
        return torch.ops.graphopt.linear_act(x, w, bias, activation)

    run.__name__ = f"graphopt_linear_act_{activation}"
    return run


_CHOICES: dict[str, Any] = {}


def _extern_choice(activation: str) -> Any:
    """One ExternKernelChoice per activation (inductor's extern benchmark passes no keyword arguments)."""
    from torch._inductor.select_algorithm import ExternKernelChoice

    choice = _CHOICES.get(activation)
    if choice is None:
        kernel = _graphopt_linear_act(activation)
        choice = _CHOICES[activation] = ExternKernelChoice(kernel, None, name=kernel.__name__, has_out_variant=False)
    return choice


# --------------------------------------------------------------------------- the lowering


def _is_extern(choice: Any) -> bool:
    from torch._inductor.select_algorithm import AlgorithmSelectorCache, ExternKernelCaller

    is_extern = getattr(AlgorithmSelectorCache, "_is_extern", None)
    return bool(is_extern(choice)) if is_extern is not None else isinstance(choice, ExternKernelCaller)


@contextlib.contextmanager
def _offering(outcome: SiteOutcome, activation: str) -> Iterator[SiteOutcome]:
    """Inside: inductor's GEMM lowering (kernel/mm.py) selects among its choices plus graphopt's."""
    from torch._inductor.kernel import mm

    real = mm.autotune_select_algorithm

    def select(name: str, choices: list[Any], input_nodes: Any, layout: Any, *args: Any, **kwargs: Any) -> Any:
        # Extern choices are all benchmarked on the first extern choice's inputs (addmm: its 1-D bias):
        # ours takes the same ones, so that the timing and the generated call read the same buffers.
        extern = next((c for c in choices if _is_extern(c)), None)
        ours = _extern_choice(activation).bind(extern.input_nodes if extern is not None else input_nodes, layout)
        outcome.graphopt_choice = ours
        _PENDING[id(ours)] = outcome
        # Decided now, not deferred to the scheduler's epilogue benchmarks: the activation follows only inductor's result.
        kwargs["return_multi_template"] = False
        if _replays_cuda_graphs() and layout.device.type == "cuda" and _select_takes("benchmark_with_cudagraphs"):
            # The compiled graph replays as CUDA graphs, where no choice pays its Python dispatch: time the
            # extern choices (ATen's and graphopt's) as replays too.
            kwargs["benchmark_with_cudagraphs"] = True
        try:
            result = real(name, [*choices, ours], input_nodes, layout, *args, **kwargs)
        finally:
            _PENDING.pop(id(ours), None)
        chosen = result[1] if isinstance(result, tuple) and len(result) == 2 else None
        node = result[0] if isinstance(result, tuple) else result
        ours_won = chosen is ours if chosen is not None else _calls_graphopt(node)
        outcome.winner = "graphopt" if ours_won else (_choice_label(chosen) if chosen is not None else "inductor")
        return result

    mm.autotune_select_algorithm = select
    try:
        yield outcome
    finally:
        mm.autotune_select_algorithm = real


def _replays_cuda_graphs() -> bool:
    from torch._inductor import config

    return bool(getattr(getattr(config, "triton", None), "cudagraphs", False))


def _select_takes(parameter: str) -> bool:
    import inspect

    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    try:
        return parameter in inspect.signature(AlgorithmSelectorCache.__call__).parameters
    except (TypeError, ValueError):
        return False


def _calls_graphopt(node: Any) -> bool:
    """Whether the IR node select_algorithm returned is our extern call (for a torch whose select returns the node only)."""
    data = node
    for _ in range(3):
        data = getattr(data, "data", data)
    return str(getattr(data, "python_kernel_name", "") or "").startswith("extern_kernels.graphopt_linear_act")


def _site_name(x: Any, w: Any, activation: str) -> str:
    from torch._inductor.virtualized import V

    node = getattr(V.graph, "current_node", None)
    sizes = "x".join(str(s) for s in x.get_size()) + " @ " + "x".join(str(s) for s in w.get_size())
    return f"{getattr(node, 'name', 'gemm')} [{sizes}, {activation}]"


def _fallback(x: Any, w: Any, bias: Any, activation: str) -> Any:
    """graphopt's kernel as the static policy runs it: a call of the custom op."""
    from torch._inductor import ir

    return ir.TensorBox.create(ir.FallbackKernel.create(torch.ops.graphopt.linear_act.default, x, w, bias, activation))


def _epilogue(y: Any, activation: str) -> Any:
    """The activation after inductor's GEMM, lowered as inductor lowers the ATen op (fusable into a template's epilogue)."""
    from torch._inductor.lowering import lowerings

    # silu and gelu have no lowering (aot decomposes them before inductor lowers): written out in ops that have one.
    mul, add = lowerings[aten.mul.Tensor], lowerings[aten.add.Tensor]
    if activation == "none":
        return y
    if activation == "relu":
        return lowerings[aten.relu.default](y)
    if activation == "silu":
        return mul(y, lowerings[aten.sigmoid.default](y))
    if activation == "gelu":  # 0.5 y (1 + erf(y / sqrt(2)))
        inner = lowerings[aten.erf.default](mul(y, 0.7071067811865476))
    else:  # tanh form: 0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3)))
        cube = mul(mul(y, y), y)
        inner = lowerings[aten.tanh.default](mul(add(y, mul(cube, 0.044715)), 0.7978845608028654))
    return mul(mul(y, 0.5), add(inner, 1.0))


def _lower_tuned_linear_act(x: Any, w: Any, bias: Any = None, activation: str = "none") -> Any:
    from torch._inductor import config
    from torch._inductor.kernel import mm
    from torch._inductor.lowering import lowerings
    from torch._inductor.utils import sympy_product
    from torch._inductor.virtualized import V

    if activation not in ACTIVATIONS or not (config.max_autotune or config.max_autotune_gemm) or getattr(V.graph, "cpp_wrapper", False):
        return _fallback(x, w, bias, activation)
    sizes = list(x.get_size())
    k, n = sizes[-1], w.get_size()[1]
    x2d = lowerings[aten.view.default](x, [sympy_product(sizes[:-1]), k]) if len(sizes) != 2 else x
    outcome = SiteOutcome(_site_name(x, w, activation))
    try:
        with _offering(outcome, activation):
            y = mm.tuned_addmm(bias, x2d, w) if bias is not None else mm.tuned_mm(x2d, w)
    except Exception as error:  # noqa: BLE001 - autotuning that breaks leaves graphopt's kernel, as the static policy would
        _record(outcome, f"autotuning failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}): graphopt's kernel kept")
        return _fallback(x, w, bias, activation)
    if outcome.winner != "graphopt":
        y = _epilogue(y, activation)
    _record(outcome)
    return lowerings[aten.view.default](y, [*sizes[:-1], n]) if len(sizes) != 2 else y


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
    _record(outcome, kernel="graphopt::wq_linear")


def _record(outcome: SiteOutcome, failure: str | None = None, kernel: str = "graphopt::linear_act") -> None:
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
        what = ("(its activation included) against inductor's best, {label}, {ms:.4f} ms (the GEMM alone)" if kernel.endswith("linear_act")
                else "against inductor's best, {label}, {ms:.4f} ms")
        reason = (f"{kernel} {outcome.graphopt_ms:.4f} ms {what.format(label=label, ms=best_ms)}: graphopt {ratio:.2f}x; "
                  f"kept: {outcome.winner}")
    report.decisions.append(DecisionRecord(kind="kernel", site=outcome.site, chosen=chosen, baseline="inductor", basis=basis,
                                           reason=reason, alternatives=alternatives))


# --------------------------------------------------------------------------- registration


_INSTALLED: list[bool] = []


def _random_bytes(fake: Tensor) -> Tensor:
    return torch.randint(0, 256, tuple(fake.shape), dtype=torch.uint8, device=fake.device)


def _register_wq_autotuning() -> str | None:
    """graphopt::tuned_wq_linear through inductor's custom-op autotuning; None, or why it is not there."""
    op = torch.ops.graphopt.tuned_wq_linear.default
    try:
        from torch._inductor.kernel import custom_op as inductor_custom_op

        def register(**extra: Any) -> None:
            inductor_custom_op.register_custom_op_autotuning(
                tuned_wq_linear, configs=[inductor_custom_op.CustomOpConfig(dequant_then_linear)], name=_WQ_SELECT,
                input_gen_fns={"packed": _random_bytes, "zeros": _random_bytes}, **extra)

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
            table[op] = plain
            return None
        replayed = table[op]
        def lower(x: Any, *args: Any, **kwargs: Any) -> Any:
            on_cuda = getattr(x.get_device(), "type", "") == "cuda"
            return (replayed if on_cuda and _replays_cuda_graphs() else plain)(x, *args, **kwargs)

        table[op] = lower
    return None


#: After install(): "" where the wq_linear site is registered, else why not (its static form then stays).
WQ_PROBLEM: list[str] = []


def wq_sites() -> bool:
    """Whether install() registered the wq_linear site (fx_weight_quant then writes it)."""
    return bool(_INSTALLED) and WQ_PROBLEM == [""]


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

    for activation in ACTIVATIONS:  # the extern kernels exist before any compiled code (an FX-cache hit) calls one
        _extern_choice(activation)
    register_lowering(torch.ops.graphopt.tuned_linear_act.default, type_promotion_kind=None)(_lower_tuned_linear_act)
    WQ_PROBLEM.append(_register_wq_autotuning() or "")
    select_algorithm.add_feedback_saver(_feedback)
    _INSTALLED.append(True)
    return None
