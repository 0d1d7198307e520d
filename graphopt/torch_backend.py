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
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from graphopt.errors import GraphoptError
from graphopt.ir.fx_view import FxView, is_neutral
from graphopt.match.driver import DriverOptions, RuleSet
from graphopt.ops import torch_lowering
from graphopt.passes import fx_passes
from graphopt.pipeline import GraphKind, Pipeline
from graphopt.report.model import Alternative, DecisionRecord, GraphSummary, Report

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

aten = torch.ops.aten

#: Composite ops kept whole when tracing to ATen: the rules match them as MatMul and Attention.
PRESERVED_OPS = (aten.matmul.default, aten.scaled_dot_product_attention.default)

_LAYOUTS = ("auto", "nhwc", "nchw")
_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes in which inductor replays CUDA graphs


@dataclass
class TorchOptions:
    """What ``torch.compile(..., options={...})`` may set (see docs/torch-compile.md)."""

    #: Only these rules (None: the whole library). ``"rules"`` is accepted as another name.
    enable: list[str] | None = None
    disable: list[str] = field(default_factory=list)
    #: Extra .pdll / .py pattern files or folders, loaded after the built-in library.
    patterns: list[str] = field(default_factory=list)
    #: Write each graph's report here, as JSON or (for a .html name) as the HTML page; an
    #: index is added per graph, or put {index} in the name.
    report: str | None = None
    #: Hand the rewritten graph to inductor (True) or run it as it is (False).
    inductor: bool = True
    #: Inference only: parameters and buffers become constants (they must not change after compiling).
    freeze: bool = True
    #: "auto" (channels-last convolutions on CUDA), "nhwc" (always), "nchw" (never).
    layout: str = "auto"
    fold_size_limit: int = 1 << 20
    max_sweeps: int = 8
    #: Keep every failed attempt in report.trace.
    trace: bool = False
    #: Raise when graphopt fails on a graph (default: warn, and run the graph without its rewrites).
    strict: bool = False
    #: Which torch.ops.graphopt custom kernels fused ops may run on: "all", "none" (ATen ops
    #: only), or "auto": all without inductor; with inductor and CUDA graphs only those measured
    #: faster than inductor's own code (torch_lowering.PREFERRED_OVER_INDUCTOR), so it is never
    #: slower; with inductor and no CUDA graphs none: a custom op's Python dispatch, which CUDA
    #: graphs do away with, costs more than its kernel saves (ResNet-50 on an H200: 3.64 ms
    #: with cuDNN's fused conv as a custom op, against inductor's 2.02 ms).
    kernels: str = "auto"
    #: With inductor: compile the graph both ways (graphopt's rewrites, and as dynamo captured
    #: it), time both on the example inputs, and keep the faster (the report says which, and
    #: the times). Costs a second compile; graphs graphopt leaves unchanged skip it.
    tune: bool = False
    #: torch.compile's mode (passed to inductor; "reduce-overhead" also means CUDA graphs without it).
    #: torch.compile takes mode= or options=, not both: options={"mode": ...} sets it along with others.
    mode: str | None = None

    def kernel_policy(self) -> str:
        if self.kernels == "auto":
            if not self.inductor:
                return "all"
            return "inductor" if self.mode in _CUDA_GRAPH_MODES else "none"
        return self.kernels

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None, mode: str | None = None) -> TorchOptions:
        given = dict(options or {})
        if "rules" in given:
            if "enable" in given:
                raise GraphoptError("graphopt options: give 'rules' or 'enable', not both")
            given["enable"] = given.pop("rules")
        # torch.compile takes mode= or options=, never both: the mode may come in the options.
        if "mode" in given and mode is not None:
            raise GraphoptError("graphopt: mode given twice (torch.compile's mode= and options['mode'])")
        mode = given.pop("mode", mode)
        known = {f.name for f in fields(cls)} - {"mode"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise GraphoptError(f"unknown graphopt option {', '.join(map(repr, unknown))} (known: rules, mode, {', '.join(sorted(known))})")
        opts = cls(mode=mode)
        for key, value in given.items():
            if key in ("enable", "disable", "patterns"):
                value = [value] if isinstance(value, (str, os.PathLike)) else value
                if value is not None and not all(isinstance(v, (str, os.PathLike)) for v in value):
                    raise GraphoptError(f"graphopt option '{key}' takes a list of names, not {value!r}")
                value = None if value is None else [str(v) for v in value]
            elif key in ("inductor", "freeze", "trace", "strict", "tune") and not isinstance(value, bool):
                raise GraphoptError(f"graphopt option '{key}' takes True or False, not {value!r}")
            elif key == "kernels" and value not in ("auto", "all", "none"):
                raise GraphoptError(f"graphopt option 'kernels' takes 'auto', 'all' or 'none', not {value!r}")
            elif key == "layout" and value not in _LAYOUTS:
                raise GraphoptError(f"graphopt option 'layout' takes one of {', '.join(_LAYOUTS)}, not {value!r}")
            elif key in ("fold_size_limit", "max_sweeps") and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise GraphoptError(f"graphopt option '{key}' takes a non-negative int, not {value!r}")
            elif key == "report" and value is not None and not isinstance(value, (str, os.PathLike)):
                raise GraphoptError(f"graphopt option 'report' takes a path, not {value!r}")
            setattr(opts, key, str(value) if key == "report" and value is not None else value)
        if opts.mode not in _MODES:
            raise GraphoptError(f"torch.compile mode {opts.mode!r} is not one of {', '.join(m for m in _MODES if m)}")
        return opts


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
        optimize_fx(aten_gm, fake_mode, rules, target, report, opts)
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
        t0 = time.perf_counter()
        compiled = _compile_leftovers(aten_gm, kept_inputs, opts, report, dynamo_gm=gm, training=training)
        report.times_s["leftovers"] = time.perf_counter() - t0
        if frozen:
            rewritten = compiled

            def compiled(*args: Any) -> Any:
                return rewritten(*[args[i] for i in kept])

        if opts.tune and opts.inductor and aten_gm is not gm:
            compiled = _faster_of(compiled, gm, list(example_inputs), opts, report)

    index = _register(report, aten_gm)
    LOG.info("graph %d: %s; %.2f s", index, report.one_line(), time.perf_counter() - started)
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


#: Passes whose changes inductor would not make itself (the rest, folding and dead code, it does).
_PASSES_INDUCTOR_LACKS = ("layout", "pad_gemms")


def adds_to_inductor(report: Report) -> bool:
    """Whether graphopt did anything to this graph that inductor would not do on its own."""
    return report.total_rewrites > 0 or any(
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


# --------------------------------------------------------------------------- tracing to ATen


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
    """A parameter or buffer of the compiled module (not a user input)."""
    if isinstance(value, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    name = getattr(source, "name", "")
    name = name() if callable(name) else str(name)
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
        name = f"_frozen_{i}"
        aten_gm.register_buffer(name, value.detach())
        with graph.inserting_before(first):
            constant = graph.get_attr(name)
        constant.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
        frozen.append(i)
    return frozen


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


def optimize_fx(gm: fx.GraphModule, fake_mode: Any, rules: RuleSet, target: Any, report: Report, opts: TorchOptions | None = None) -> None:
    """Rewrite an ATen FX graph in place: the rules, constant folding, lowering to torch ops."""
    opts = opts or TorchOptions()
    started = time.perf_counter()
    view = FxView(gm, fake_mode)
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
        ("lowering", lambda: torch_lowering.lower_neutral_nodes(gm, fake_mode, new_constant, view.const_array, view.device)),
        # What the lowerings built from constants (rotary caches in their torch form) folds too.
        ("constant_folding", lambda: fx_passes.fold_constants(gm, new_constant, opts.fold_size_limit)),
        ("views_to_reshapes", lambda: fx_passes.views_to_reshapes(gm)),
    ])
    if _wants_channels_last(gm, opts.layout):
        pipeline.run_pass("layout", lambda: fx_passes.to_channels_last(gm, new_constant))
    pipeline.run_passes([
        ("pad_gemms", lambda: fx_passes.pad_unaligned_gemms(gm, new_constant, fake_mode)),
        ("dce", lambda: fx_passes.remove_dead_code(gm)),
    ])
    assert not any(is_neutral(n) for n in gm.graph.nodes), "every graphopt op is lowered"
    gm.graph.lint()
    gm.recompile()
    report.times_s["optimize"] = time.perf_counter() - started
    report.finalize()


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
            return CudaGraphReplay(gm)
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
    patches = list_mode_options(opts.mode) if opts.mode not in (None, "default") else {}
    # inner_compile looked up at call time: the same function compile_fx uses by default
    # (tests wrap it to see what inductor is asked to do).
    return inductor_compile_fx.compile_fx(gm, list(inputs), inner_compile=inductor_compile_fx.compile_fx_inner,  # type: ignore[return-value]
                                          config_patches=patches)


# --------------------------------------------------------------------------- CUDA graphs without inductor


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

    A call whose inputs differ in shape, dtype or device from the captured ones, or
    that needs gradients, runs `fn` as it is; so does every call after a failed capture (with
    a RuntimeWarning). `cuda` is the torch.cuda API (tests pass a stand-in).
    """

    warmup_calls = 3

    def __init__(self, fn: Callable[..., Any], cuda: Any = None) -> None:
        self.fn = fn
        self.cuda = cuda if cuda is not None else torch.cuda
        self.graph: Any = None
        self.static_inputs: list[Any] = []
        self.static_outputs: Any = None
        self.failed: str | None = None

    def __call__(self, *args: Any) -> Any:
        if self.failed is not None or (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
            return self.fn(*args)
        if self.graph is None:
            try:
                self._capture(args)
            except Exception as error:  # an op that cannot be captured: run without CUDA graphs
                self.failed = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
                self.graph = None
                warnings.warn(f"graphopt: CUDA graph capture failed ({self.failed}); this graph runs without CUDA graphs", RuntimeWarning, stacklevel=2)
                return self.fn(*args)
        elif not self._matches(args):
            return self.fn(*args)
        for static, arg in zip(self.static_inputs, args):
            if isinstance(static, torch.Tensor):
                static.copy_(arg)
        self.graph.replay()
        return torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, self.static_outputs)

    def _capture(self, args: Sequence[Any]) -> None:
        cuda = self.cuda
        self.static_inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        # Warm up on a side stream (as torch.cuda.graphs documents): lazy initialisations
        # (Triton compiling, autotuning, cuBLAS workspaces) must not happen during capture.
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):
            for _ in range(self.warmup_calls):
                self.fn(*self.static_inputs)
        cuda.current_stream().wait_stream(side)
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            self.static_outputs = self.fn(*self.static_inputs)
        self.graph = graph

    def _matches(self, args: Sequence[Any]) -> bool:
        if len(args) != len(self.static_inputs):
            return False
        for static, arg in zip(self.static_inputs, args):
            if isinstance(static, torch.Tensor):
                # Strides may differ: copy_ writes any layout into the captured buffer.
                if not (isinstance(arg, torch.Tensor) and arg.shape == static.shape and arg.dtype == static.dtype and arg.device == static.device):
                    return False
            elif arg != static:
                return False
        return True
