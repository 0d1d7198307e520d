"""`torch.compile(model, backend="graphopt")`: the ONNX rule library applied to torch FX graphs.

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml), so no
import of graphopt is needed before ``torch.compile``. For each graph dynamo captures:

1. trace it to ATen ops (make_fx, functionalized) with the ops the rules fuse kept
   whole: ``aten.matmul`` and ``aten.scaled_dot_product_attention`` are not decomposed
   (their composite forms would hide the MatMul / attention the patterns look for);
2. for inference, freeze parameters and buffers into constants (so Conv+BatchNorm
   folds, projections' transposes fold, rotary caches fold);
3. run the rule library through `graphopt.ir.fx_view.FxView`, alternating with
   constant folding, exactly as `graphopt.optimize` does on ONNX, against the
   ``torch`` target (``torch-train`` where gradients flow: only rewrites whose ops
   have gradient formulas);
4. lower graphopt's ops onto ``torch.ops.graphopt.*`` (graphopt.ops.torch_lowering);
5. hand the result to inductor (``compile_fx``: its own decompositions, fusions, autograd
   and, with ``mode="reduce-overhead"``, CUDA graphs), or run it as it is
   (``options={"inductor": False}``; with ``mode="reduce-overhead"`` replayed as one CUDA
   graph by `CudaGraphReplay`).


Each compiled graph leaves a `graphopt.report.model.Report`; `last_report()` and
`torch_reports()` return them, ``options={"report": "r.json"}`` writes them.
Options and their meaning: docs/torch-compile.md.

The backend's parts by job: graphopt.torch_options (the options), graphopt.torch_trace
(steps 1-2), graphopt.torch_cudagraphs (CUDA graphs without inductor); this module holds
the backend itself, the rewrite pipeline of step 3 and the reports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from graphopt.errors import GraphoptError
from graphopt.ir.fx_view import FxView, is_neutral
from graphopt.match.driver import DriverOptions, RuleSet
from graphopt.ops import torch_lowering
from graphopt.passes import fx_gqa, fx_pack, fx_passes, fx_sdpa
from graphopt.passes.fx_reinplace import reinplace_input_writes, written_inputs
from graphopt.pipeline import GraphKind, Pipeline
from graphopt.report.model import GraphSummary, Report
from graphopt.report.sections import Alternative, DecisionRecord
from graphopt.torch_cudagraphs import CudaGraphReplay, cuda_graphs_refusal
from graphopt.torch_options import TorchOptions
from graphopt.torch_trace import PRESERVED_OPS, _fake_inputs, _freeze_module_state, trace_to_aten

__all__ = [
    "graphopt_backend",
    "TorchOptions",
    "optimize_fx",
    "trace_to_aten",
    "last_report",
    "last_graph",
    "torch_reports",
    "clear_reports",
    "PRESERVED_OPS",
    "CudaGraphReplay",
    "cuda_graphs_refusal",
    "check_options",
    "LOG",
]

#: One line per compiled graph at INFO (`GRAPHOPT_LOGS=info` prints them on stderr; or
#: configure the "graphopt" logger as any other).
LOG = logging.getLogger("graphopt.torch")


# --------------------------------------------------------------------------- reports


_REPORTS: list[Report] = []
_GRAPHS: list[weakref.ref[fx.GraphModule]] = []  # the rewritten graphs, as long as their compiled code lives
_LOCK = threading.Lock()


def last_report() -> Report | None:
    """The report of the graph compiled last, or None before any."""
    with _LOCK:
        return _REPORTS[-1] if _REPORTS else None


def torch_reports() -> list[Report]:
    """Every compiled graph's report, in compile order (the index in report file names)."""
    with _LOCK:
        return list(_REPORTS)


def last_graph() -> fx.GraphModule | None:
    """The FX graph the last compile produced (ATen and torch.ops.graphopt calls, before
    inductor), while its compiled code is alive; for inspecting what graphopt did."""
    with _LOCK:
        return _GRAPHS[-1]() if _GRAPHS else None


def clear_reports() -> None:
    with _LOCK:
        _REPORTS.clear()
        _GRAPHS.clear()


def _register(report: Report, gm: fx.GraphModule) -> int:
    with _LOCK:
        _REPORTS.append(report)
        _GRAPHS.append(weakref.ref(gm))
        return len(_REPORTS) - 1


def _indexed_path(path: str, index: int) -> Path:
    if "{index}" in path:
        return Path(path.format(index=index))
    p = Path(path)
    return p.with_name(f"{p.stem}.{index}{p.suffix or '.json'}")


# --------------------------------------------------------------------------- the backend


def check_options(options: Mapping[str, Any] | None = None, mode: str | None = None) -> TorchOptions:
    """Check torch.compile options for graphopt now: unknown option, bad value, unknown rule or
    a malformed pattern file raise GraphoptError (dynamo would only call the backend, and
    report the error wrapped in its own traceback, at the first run). `graphopt.compile`
    calls it before torch.compile."""
    opts = TorchOptions.parse(options, mode)
    _rule_set(opts)
    return opts


def _log_settings() -> None:
    # GRAPHOPT_LOGS=info (or debug): print graphopt's log lines on stderr, as TORCH_LOGS does for torch's.
    level = os.environ.get("GRAPHOPT_LOGS", "").strip().upper()
    root = logging.getLogger("graphopt")
    if level in ("INFO", "DEBUG", "1", "+") and not any(getattr(h, "_graphopt", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[graphopt] %(message)s"))
        handler._graphopt = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.setLevel(logging.DEBUG if level == "DEBUG" else logging.INFO)


def graphopt_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: Mapping[str, Any] | None = None,
                     mode: str | None = None, **_unused: Any) -> Callable[..., Any]:
    """The torch.compile backend: dynamo's graph in, a callable with the same inputs out."""
    _log_settings()
    opts = TorchOptions.parse(options, mode)
    rules = _rule_set(opts)
    training = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    target = torch_lowering.torch_target(training, opts.kernel_policy())
    report = Report(target=target.name)
    started = time.perf_counter()

    frozen: list[int] = []
    try:
        fake_mode, fake_inputs = _fake_inputs(gm, example_inputs)
        aten_gm = trace_to_aten(gm, fake_inputs, fake_mode)
        report.times_s["trace"] = time.perf_counter() - started
        frozen = _freeze_module_state(aten_gm, gm, example_inputs) if opts.freeze and not training else []
        optimize_fx(aten_gm, fake_mode, rules, target, report, opts, autotune=_autotune_sites(opts, training, report),
                    gemv=_gemv_sites(opts, training, report))
    except GraphoptError:
        raise
    except Exception as error:  # a graphopt bug must not take the user's model down with it
        if opts.strict:
            raise
        first = (str(error).strip().splitlines() or [""])[0]
        message = f"graphopt failed on this graph ({type(error).__name__}: {first}); it runs as dynamo captured it, without graphopt's rewrites"
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        report.warnings.append(message)
        aten_gm, frozen = gm, []
    if frozen:
        report.warnings.append(f"{len(frozen)} parameters and buffers frozen into constants (changing them after compiling has no effect)")
    # graphopt's own cost (tracing, freezing, the rules and passes), apart from the compile of the result.
    report.times_s["graphopt"] = time.perf_counter() - started

    if opts.inductor and aten_gm is not gm and not adds_to_inductor(report):
        # Nothing graphopt did here is something inductor lacks: inductor gets dynamo's graph
        # itself, the exact path of torch.compile(backend="inductor") (the traced, frozen copy
        # with its preserved ops compiled slower: a LLaMA decoder 1.25x on an H200, issue 15).
        report.decisions.append(DecisionRecord(
            kind="graph", site="model", chosen="inductor", baseline="inductor", basis="forced",
            reason="graphopt changed nothing inductor does not do itself: the graph goes to inductor as dynamo captured it"))
        t0 = time.perf_counter()
        compiled = _inductor(gm, list(example_inputs), opts, gm)
        report.times_s["leftovers"] = time.perf_counter() - t0
        aten_gm = gm
    else:
        kept = [i for i in range(len(example_inputs)) if i not in set(frozen)]
        kept_inputs = [example_inputs[i] for i in kept]
        if aten_gm is not gm:
            _carry_input_sources(aten_gm, gm, kept)
            if training:
                from graphopt.passes.fx_training import copy_mutated_inputs_for_autograd
                from graphopt.pipeline import run_pass

                run_pass(report, "training_inputs", lambda: copy_mutated_inputs_for_autograd(aten_gm))
        t0 = time.perf_counter()
        with _recording_choices(aten_gm, opts, report):
            compiled = _compile_leftovers(aten_gm, kept_inputs, opts, report, dynamo_gm=gm, training=training)
        report.times_s["leftovers"] = time.perf_counter() - t0
        if frozen:
            rewritten = compiled

            def compiled(*args: Any) -> Any:
                return rewritten(*[args[i] for i in kept])

        if opts.tune and opts.inductor and aten_gm is not gm:
            compiled = _faster_of(compiled, gm, list(example_inputs), opts, report)

    index = _register(report, aten_gm)
    LOG.info("graph %d: %s; graphopt %.2f s, %s %.2f s", index, report.one_line(), report.times_s["graphopt"],
             "inductor" if opts.inductor else "the rest", report.times_s.get("leftovers", 0.0))
    if opts.report:
        path = _indexed_path(opts.report, index)
        report.output_path = str(path)
        if str(path).lower().endswith((".html", ".htm")):  # the same page as `optimize --report x.html`
            from graphopt.report.html import write_html

            write_html(report, path)
        else:
            from graphopt.report.render import write_json

            write_json(report, path)
    return compiled


def _autotune_sites(opts: TorchOptions, training: bool, report: Report) -> bool:
    """Whether graphopt's GEMM kernels go to inductor as autotune choices (graphopt.inductor_choices):
    inductor autotunes this compile and custom kernels are allowed; where this inductor cannot take
    them, the static policy stands and the report says why."""
    if not opts.autotune_kernels or not opts.inductor or training or opts.kernels == "none":
        return False
    from graphopt import inductor_choices

    if not inductor_choices.inductor_autotunes(opts.mode):
        return False
    reason = inductor_choices.install()
    if reason is not None:
        report.warnings.append(f"autotune choices: {reason}: graphopt's GEMM kernels stay on the static policy (kernels={opts.kernels!r})")
        return False
    return True


def _wq_sites(report: Report) -> bool:
    """Whether graphopt::wq_linear goes to inductor's autotuner too (else a warning says why not)."""
    from graphopt import inductor_choices

    if inductor_choices.wq_sites():
        return True
    why = inductor_choices.WQ_PROBLEM[0] if inductor_choices.WQ_PROBLEM else "not installed"
    report.warnings.append(f"autotune choices: graphopt::wq_linear stays on its static form: {why}")
    return False


def _gemv_sites(opts: TorchOptions, training: bool, report: Report) -> bool:
    """Whether decode GEMMs go to inductor's autotuner as graphopt::gemv_linear sites (options gemv=True; a
    warning says why not where they cannot)."""
    if not opts.gemv:
        return False
    why = None
    if not opts.inductor:
        why = "it needs inductor (its autotuner times the kernel against inductor's GEMM)"
    elif not opts.cuda_graphs():
        why = ("it needs inductor's CUDA graphs (mode 'reduce-overhead' or 'max-autotune'): without them the op's Python "
               "dispatch costs more than a decode GEMM takes")
    elif training:
        why = "inference only"
    elif opts.kernels == "none":
        why = "kernels='none'"
    else:
        from graphopt import inductor_choices

        why = inductor_choices.install()
        if why is None and not inductor_choices.gemv_sites():
            why = inductor_choices.GEMV_PROBLEM[0] if inductor_choices.GEMV_PROBLEM else "not installed"
    if why is not None:
        report.warnings.append(f"gemv: no graphopt::gemv_linear site written: {why}")
        return False
    return True


@contextlib.contextmanager
def _recording_choices(gm: fx.GraphModule, opts: TorchOptions, report: Report) -> Iterator[None]:
    """Around inductor's compile of a graph with autotune sites: their decisions go to `report`."""
    if not opts.inductor or "graphopt.inductor_choices" not in sys.modules:
        yield
        return
    from graphopt import inductor_choices

    if not inductor_choices.uses_autotune_sites(gm):
        yield
        return
    with inductor_choices.recording(report):
        yield


def _carry_input_sources(aten_gm: fx.GraphModule, dynamo_gm: fx.GraphModule, kept: list[int]) -> None:
    """Give the traced graph's inputs dynamo's facts about them (their source, a static address)."""
    ours = list(aten_gm.graph.find_nodes(op="placeholder"))
    theirs = list(dynamo_gm.graph.find_nodes(op="placeholder"))
    if len(ours) != len(kept) or len(theirs) <= max(kept, default=-1):
        return
    for node, i in zip(ours, kept):
        source = theirs[i]
        if hasattr(source, "_dynamo_source"):
            node._dynamo_source = source._dynamo_source  # type: ignore[attr-defined]
        if "tensor_dict" in source.meta:
            node.meta["tensor_dict"] = source.meta["tensor_dict"]


#: Passes whose changes inductor would not make itself (the rest, folding and dead code, it does).
_PASSES_INDUCTOR_LACKS = ("layout", "pad_gemms", "unrepeat_kv", "pack_projections", "weight_quant", "fp8_matmuls", "gemv_sites")


#: Rules whose rewrites inductor makes itself: views, reshapes and transposes are free in its
#: IR, copies and no-op casts vanish, static shapes are known to it. Alone they are no reason
#: to hand inductor graphopt's traced copy instead of dynamo's graph (BERT's and ViT's
#: default-mode rewrites were only these: reshape clean-ups).
RULES_INDUCTOR_DOES = frozenset({
    "CollapseReshapes", "DropNoOpReshape", "DropReshapeRoundTrip", "ComposeTransposes", "DropIdentityTranspose",
    "UnflattenBatchedTranspose", "DropPassThrough", "DropInferenceDropout", "DropSingleInputConcat", "DropNoOpCast",
    "FoldStaticShape", "FoldGatherOfStaticDims", "FoldSliceOfStaticDims", "RangeOfScalars",
})


def adds_to_inductor(report: Report) -> bool:
    """Whether graphopt did anything to this graph that inductor would not do on its own."""
    return any(stats.applications for name, stats in report.rules.items() if name not in RULES_INDUCTOR_DOES) or any(
        report.passes[name].changes for name in _PASSES_INDUCTOR_LACKS if name in report.passes
    )


#: How `tune` times a compiled graph: (callable, inputs) -> median milliseconds (tests replace it).
def _time_ms(fn: Callable[..., Any], inputs: Sequence[Any], runs: int = 20, warmup: int = 3) -> float:
    import statistics

    cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    for _ in range(warmup):
        fn(*inputs)
    times = []
    for _ in range(runs):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(*inputs)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


TIMER: Callable[[Callable[..., Any], Sequence[Any]], float] = _time_ms


def _faster_of(rewritten: Callable[..., Any], gm: fx.GraphModule, inputs: list[Any], opts: TorchOptions, report: Report) -> Callable[..., Any]:
    """`tune`: inductor on dynamo's own graph against inductor on graphopt's; the faster is kept."""
    from torch._subclasses.fake_tensor import FakeTensor

    if any(isinstance(x, FakeTensor) for x in inputs):
        report.warnings.append("tune: the example inputs are fake tensors, nothing to time: graphopt's graph is kept")
        return rewritten
    plain = _inductor(gm, inputs, opts, gm)
    with torch.no_grad():
        ms_graphopt, ms_inductor = TIMER(rewritten, inputs), TIMER(plain, inputs)
    keep_graphopt = ms_graphopt <= ms_inductor
    report.decisions.append(DecisionRecord(
        kind="graph", site="model", chosen="graphopt" if keep_graphopt else "inductor", baseline="inductor", basis="measured",
        reason=f"timed on the example inputs: graphopt {ms_graphopt:.3f} ms, inductor alone {ms_inductor:.3f} ms",
        alternatives=[Alternative("graphopt", measured_ms=ms_graphopt, source="tune"), Alternative("inductor", measured_ms=ms_inductor, source="tune")],
    ))
    return rewritten if keep_graphopt else plain


def _rule_set(opts: TorchOptions) -> RuleSet:
    from graphopt.api import OptimizeOptions, select_rules

    key = (tuple(opts.enable) if opts.enable is not None else None, tuple(opts.disable), tuple(opts.patterns))
    cached = _RULE_SETS.get(key)
    if cached is None:
        cached = _RULE_SETS[key] = RuleSet(select_rules(OptimizeOptions(enable=opts.enable, disable=opts.disable, patterns=opts.patterns)))
    return cached


_RULE_SETS: dict[tuple[Any, ...], RuleSet] = {}


# --------------------------------------------------------------------------- the rewrite pipeline


def _summary(view: FxView) -> GraphSummary:
    names = []
    for node in view.nodes(view.graph):
        domain, op = view.op_key(node)
        names.append(op if domain in ("", "torch") else f"{domain}.{op}")
    constants = sum(1 for n in view.graph.nodes if n.op == "get_attr")
    return GraphSummary.of(names, constants)


def _wants_channels_last(gm: fx.GraphModule, layout: str) -> bool:
    if layout == "nchw":
        return False
    convs = [n for n in gm.graph.nodes if fx_passes.is_conv2d(n)]
    if not convs:
        return False
    return layout == "nhwc" or convs[0].meta["val"].device.type == "cuda"


def optimize_fx(gm: fx.GraphModule, fake_mode: Any, rules: RuleSet, target: Any, report: Report, opts: TorchOptions | None = None,
                autotune: bool = False, gemv: bool = False) -> None:
    """Rewrite an ATen FX graph in place: the rules, constant folding, lowering to torch ops.
    `autotune`: inductor autotunes; graphopt's GEMM kernels are timed against inductor's compiled code for
    their sites as the rules plan them, and written only where they win (graphopt.inductor_sites).
    `gemv`: GEMMs of few rows become graphopt::gemv_linear sites for inductor's autotuner (graphopt.passes.fx_gemv)."""
    opts = opts or TorchOptions()
    if not (autotune and opts.weights is None):
        _optimize_fx(gm, fake_mode, rules, target, report, opts, autotune, gemv)
        return
    from graphopt import inductor_sites

    with inductor_sites.deciding(report, opts.mode, opts.cuda_graphs()):
        _optimize_fx(gm, fake_mode, rules, target, report, opts, autotune, gemv)


def _optimize_fx(gm: fx.GraphModule, fake_mode: Any, rules: RuleSet, target: Any, report: Report, opts: TorchOptions,
                 autotune: bool, gemv: bool = False) -> None:
    started = time.perf_counter()
    # inductor compiles the graph: rules refuse ATen forms it cannot fuse into; where it autotunes, the GEMM
    # sites are decided by timing (FxBuilder.autotune)
    view = FxView(gm, fake_mode, inductor=opts.inductor, autotune=autotune and opts.weights is None)
    new_constant = view.add_constant
    kind = GraphKind(
        view=view,
        fold=[
            ("cse", lambda: fx_passes.eliminate_common_subexpressions(gm)),
            ("constant_folding", lambda: fx_passes.fold_constants(gm, new_constant, opts.fold_size_limit)),
        ],
        refresh=view.refresh,  # the FX passes change the graph behind the view's back
    )
    pipeline = Pipeline(kind, rules, target, report, DriverOptions(trace_all=opts.trace), max_sweeps=opts.max_sweeps)

    pipeline.run_passes([
        ("dce", lambda: fx_passes.remove_dead_code(gm)),
        ("split_rsqrt", lambda: fx_passes.split_rsqrt(gm)),
        ("split_log1p", lambda: fx_passes.split_log1p(gm)),
        ("drop_clones", lambda: fx_passes.drop_clones(gm)),
    ])
    report.before = _summary(view)
    pipeline.sweep()
    pipeline.run_pass("dce", lambda: fx_passes.remove_dead_code(gm))
    report.after = _summary(view)
    pipeline.run_passes([
        ("merge_rsqrt", lambda: fx_passes.merge_rsqrt(gm)),
        ("merge_log1p", lambda: fx_passes.merge_log1p(gm)),
        ("lowering", lambda: torch_lowering.lower_neutral_nodes(gm, fake_mode, new_constant, view.const_array, view.device,
                                                                 cuda_graphs=opts.cuda_graphs(), target=target,
                                                                 inductor=opts.inductor,
                                                                 # with `weights` the epilogue GEMMs stay aten._addmm_activation:
                                                                 # fx_weight_quant quantizes those (its wq_linear sites are autotuned)
                                                                 autotune=autotune and opts.weights is None)),
        ("unrepeat_kv", lambda: fx_gqa.unrepeat_kv(gm)),
        # What the lowerings built from constants (rotary caches in their torch form) folds too.
        ("constant_folding", lambda: fx_passes.fold_constants(gm, new_constant, opts.fold_size_limit)),
        ("views_to_reshapes", lambda: fx_passes.views_to_reshapes(gm)),
        ("pack_projections", lambda: fx_pack.pack_projections(gm, new_constant, fake_mode)),
    ])
    if _wants_channels_last(gm, opts.layout):
        pipeline.run_pass("layout", lambda: fx_passes.to_channels_last(gm, new_constant))
    if opts.weights is not None:  # after packing: q/k/v (gate/up) quantized as one GEMM
        from graphopt.passes import fx_weight_quant  # numpy quantization and the kernels: only when asked for

        wq_autotune = autotune and _wq_sites(report)
        pipeline.run_pass("weight_quant", lambda: fx_weight_quant.quantize_weights(gm, new_constant, fake_mode, opts, report, wq_autotune))
    pipeline.run_passes([
        ("pad_gemms", lambda: fx_passes.pad_unaligned_gemms(gm, new_constant, fake_mode)),
        # Last: the masks that dropped clones and folding left strided (fx_sdpa: a fused CUDA kernel would refuse them).
        ("attention_masks", lambda: fx_sdpa.attention_masks(gm, new_constant, fake_mode, opts.attention_mask)),
    ])
    if opts.precision == "fp8":
        _fp8(pipeline, gm, new_constant, fake_mode, opts, report)
    if gemv:  # last of the GEMM passes: what packing, quantization and FP8 left as plain GEMMs
        from graphopt.passes import fx_gemv

        pipeline.run_pass("gemv_sites", lambda: fx_gemv.offer_gemv_sites(gm, new_constant, fake_mode))
    pipeline.run_pass("dce", lambda: fx_passes.remove_dead_code(gm))
    if not opts.inductor:  # inductor re-inplaces on its own; the graph run as it is must not copy a KV cache per step
        pipeline.run_pass("reinplace_input_writes", lambda: reinplace_input_writes(gm))
    assert not any(is_neutral(n) for n in gm.graph.nodes), "every graphopt op is lowered"
    gm.graph.lint()
    gm.recompile()
    report.times_s["optimize"] = time.perf_counter() - started
    report.finalize()


def _fp8(pipeline: Pipeline, gm: fx.GraphModule, new_constant: Any, fake_mode: Any, opts: TorchOptions, report: Report) -> None:
    """precision="fp8": the GEMMs with constant weights in FP8 (graphopt.passes.fx_fp8)."""
    from graphopt.passes import fx_fp8

    outcome = fx_fp8.Fp8Outcome()

    def run() -> int:
        nonlocal outcome
        outcome = fx_fp8.fp8_matmuls(gm, new_constant, fake_mode, opts.precision_keep)
        return len(outcome.converted)

    pipeline.run_pass("fp8_matmuls", run)
    fx_fp8.record(outcome, report)
    if outcome.refusal is not None:
        warnings.warn(outcome.refusal, RuntimeWarning, stacklevel=3)


# --------------------------------------------------------------------------- what runs the result


def _compile_leftovers(gm: fx.GraphModule, inputs: Sequence[Any], opts: TorchOptions, report: Report,
                       dynamo_gm: fx.GraphModule | None = None, training: bool = False) -> Callable[..., Any]:
    if opts.inductor:
        return _inductor(gm, inputs, opts, dynamo_gm)
    if opts.mode == "reduce-overhead":
        # Our own capture, not torch._dynamo's "cudagraphs" backend: that one re-traces the
        # graph with aot_autograd and rejects the triton_op nodes of graphopt's kernels.
        reason = cuda_graphs_refusal(inputs, training)
        if reason is None:
            return CudaGraphReplay(gm, written=written_inputs(gm))
        report.warnings.append(f"mode='reduce-overhead' without inductor uses CUDA graphs, and {reason}: the graph runs without them")
    return gm


def _inductor(gm: fx.GraphModule, inputs: Sequence[Any], opts: TorchOptions, dynamo_gm: fx.GraphModule | None) -> Callable[..., Any]:
    """compile_fx on the rewritten graph, as torch.compile's own inductor backend calls it."""
    from torch._inductor import compile_fx as inductor_compile_fx
    from torch._inductor import list_mode_options

    # aot_autograd (inside compile_fx) lifts the graph's constants (the frozen parameters,
    # folded results) into inputs; it marks them static (same address every call) only for
    # graphs that carry a dynamo compile id, else CUDA graphs copy every one of them into
    # graph-owned memory on every call (BERT-base: 200 copies, 2x slower than inductor's own
    # reduce-overhead). Without `_param_name_to_source` aot takes the torch.export route:
    # every lifted parameter and buffer is static.
    if "dynamo_compile_id" not in gm.meta:
        from torch._guards import CompileContext

        compile_id = dynamo_gm.meta.get("dynamo_compile_id") if dynamo_gm is not None else None
        gm.meta["dynamo_compile_id"] = compile_id if compile_id is not None else CompileContext.current_compile_id()
    # Inputs dynamo knows at a static address (a StaticCache's tensors: mark_static_address) must
    # stay static for CUDA graphs, which skip a graph that writes into a non-static input (a
    # decode step writing its KV cache). aot_autograd reads those marks only on the dynamo route
    # (`_param_name_to_source`, a `_dynamo_source` per input), where every lifted constant is static too.
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if (not hasattr(gm, "_param_name_to_source") and placeholders and all(hasattr(n, "_dynamo_source") for n in placeholders)
            and any(n.meta.get("tensor_dict", {}).get("_dynamo_static_input_type") for n in placeholders)):
        from torch._dynamo.source import LocalSource

        names = [name for name, _ in gm.named_parameters(remove_duplicate=False)] + [name for name, _ in gm.named_buffers(remove_duplicate=False)]
        gm._param_name_to_source = {name: LocalSource(f"_graphopt_constant_{name}") for name in names}  # type: ignore[assignment]
    patches = list_mode_options(opts.mode) if opts.mode not in (None, "default") else {}
    # inner_compile looked up at call time: the same function compile_fx uses by default
    # (tests wrap it to see what inductor is asked to do).
    return inductor_compile_fx.compile_fx(gm, list(inputs), inner_compile=inductor_compile_fx.compile_fx_inner,  # type: ignore[return-value]
                                          config_patches=patches)


