"""`graphopt.optimize`: the whole ONNX pipeline as one call.

    load -> shape inference -> [constant folding, rule sweep]* -> [precision] -> CSE, DCE -> lower -> save

The rule sweeps and constant folding alternate until neither changes anything
or the sweep limit is reached (reported in the report, never fatal).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import onnx
import onnx_ir as ir

from graphopt.errors import PatternError, RuleNameError
from graphopt.ir.onnx_io import load_model, save_model
from graphopt.ir.onnx_view import OnnxView
from graphopt.ir.provenance import tag_new_nodes
from graphopt.library import BUILTIN_RULES_DIR
from graphopt.match.driver import DriverOptions, RuleSet, apply_rules
from graphopt.ops.lowering import lower_fused_ops
from graphopt.ops.targets import get_target
from graphopt.pattern.ir import Rule
from graphopt.pipeline import GraphKind, Pipeline, run_pass
from graphopt.report.model import GraphSummary, Report

__all__ = ["OptimizeOptions", "optimize", "optimize_file", "builtin_rules", "select_rules", "BUILTIN_RULES_DIR"]

ModelLike = TypeVar("ModelLike", ir.Model, onnx.ModelProto)




@dataclass
class OptimizeOptions:
    target: str = "onnx"
    #: Extra pattern files or folders, loaded after the built-in library.
    patterns: Sequence[str | os.PathLike[str]] = ()
    #: Only these rules (None: all).
    enable: Sequence[str] | None = None
    disable: Sequence[str] = ()
    builtin: bool = True
    max_sweeps: int = 8
    #: Constant folding never grows the model by more than this per folded node.
    fold_size_limit: int = 1 << 20
    #: "auto": infer shapes unless every node output already has a type and shape.
    shape_inference: bool | str = "auto"
    #: Rewrites to leave out, as (rule, root output name); set by verification.
    blocked: set[tuple[str, str]] = field(default_factory=set)
    #: If set, only rewrites for which it returns True are applied (bisection).
    allow: Callable[[str, str], bool] | None = None
    max_rewrites: int | None = None
    #: Keep every failed attempt (rule, node, failing check) in report.trace.
    trace: bool = False
    #: Keep each rewrite's subgraph before and after in the report (the HTML report's drawings; the
    #: command line turns it off when it writes no report).
    snapshots: bool = True
    progress: Callable[[str], None] | None = None
    #: "fp16" or "bf16": convert the model after the rules ran (inputs and outputs keep
    #: their types); "fp32" or None: leave its precision alone. See docs/precision.md.
    precision: str | None = None
    #: With `precision`: more op types ("Gemm", "com.microsoft.Gelu") or node or output
    #: names to keep in float32, on top of the default block list.
    keep_fp32: Sequence[str] = ()
    #: ort-cuda only: "nhwc" runs Conv as com.microsoft.NhwcConv with the NHWC layout
    #: propagated (graphopt.passes.layout), "nchw" keeps NCHW (FusedConv), "auto" picks
    #: NHWC for float16/bfloat16 Convs and for GroupNorm (measured: float32 runs faster as
    #: NCHW FusedConv); or a `graphopt.passes.layout.LayoutOptions`.
    layout: Any = "auto"
    #: Called with every rule attempt (a `graphopt.match.driver.Attempt`); used by `graphopt explain`.
    observe: Callable[[Any], None] | None = None
    #: A rule whose own code raises stops the run (an error) instead of being skipped at that site.
    strict: bool = False
    #: Decisions (layout, conv bias form, FusedConv, SkipLayerNorm on ort-cpu; graphopt.decisions) are made by timing
    #: their candidates on the target's execution provider when it is present, not only
    #: from the shipped cost table.
    tune: bool = False
    #: Where --tune keeps its measurements (None: the user's cache folder, see graphopt.decisions.tune).
    tune_cache: str | os.PathLike[str] | None = None
    #: --tune's timer (tests inject a fake one): (model bytes, feeds, provider) -> median ms.
    tune_timer: Callable[..., float] | None = None
    #: A cost table (a path or a `graphopt.decisions.CostTable`) instead of the shipped one.
    cost_table: Any = None
    #: With `precision`: an .npz of calibration inputs (input name -> array) for the range check
    #: (None: random inputs from the input specs); see graphopt.passes.precision.
    calibration_data: str | os.PathLike[str] | None = None
    #: With `precision` "fp16": keep in float32 the nodes whose measured values do not fit (see docs/precision.md).
    range_check: bool = True
    #: "shared": the KV cache of GroupQueryAttention may be one max-length buffer bound as both past and
    #: present (onnxruntime's past_present_share_buffer): the past length is read from an attention_mask
    #: input (added where the export has none), not from the past input's shape (graphopt.passes.kv_buffer);
    #: on ort-cuda GroupQueryAttention over the cache is then emitted. "growing" (default): past and present differ.
    kv_buffer: str = "growing"
    #: With kv_buffer "shared": the longest sequence (past + new tokens) the buffer will hold. The rotary
    #: tables become constants of this many positions (the onnxruntime-genai builder's cos/sin caches)
    #: instead of being computed every step; a longer run is outside them. None: computed every step.
    kv_max_length: int | None = None
    #: With `precision`: the model's 2-D convolutions in the low type or float32. "auto": a
    #: decision (graphopt.passes.precision_decision; ort-cuda): converted as asked unless the
    #: cost table predicts (or --tune measures) float32 faster; "low": converted; "fp32": kept.
    precision_convs: str = "auto"
    #: With `precision`: the model's recurrent ops (LSTM, GRU, RNN) in the low type or float32, the
    #: same way (graphopt.passes.precision_recurrent; ort-cuda): "auto", "low" or "fp32".
    precision_recurrent: str = "auto"
    #: Built-in rules that a rule of the same name in `patterns` replaces. A user rule
    #: named like a built-in one is an error unless its name is here.
    replace: Sequence[str] = ()
    #: "int4" or "int8": weight-only quantization of the MatMul/Gemm layers with a constant 2-D weight,
    #: after --precision (graphopt.passes.weight_quant; docs/cli.md). None: weights keep their type.
    weights: str | None = None
    #: With `weights`: consecutive K values sharing one scale (16, 32, 64, 128 or 256).
    block_size: int = 32
    #: With `weights`: layers to keep unquantized: fnmatch globs over node, weight and output names and
    #: op types, added to the default block list (the LM head); "none" clears the default list.
    weights_keep: Sequence[str] = ()
    #: With `weights`: None: asymmetric (zero points) for int4, symmetric for int8; True/False forces it.
    weights_symmetric: bool | None = None
    #: With `weights`: the least output SNR (dB) a layer must keep to be quantized (None: int8 35, int4 20).
    weights_min_snr: float | None = None
    #: With `weights`: MatMulNBits' accuracy_level (None: 4 on ort-cpu, 0 on ort-cuda).
    weights_accuracy_level: int | None = None


_BUILTIN_CACHE: list[Rule] | None = None


def builtin_rules() -> list[Rule]:
    global _BUILTIN_CACHE
    if _BUILTIN_CACHE is None:
        from graphopt.pattern.loader import load_patterns

        _BUILTIN_CACHE = load_patterns(BUILTIN_RULES_DIR)
    return list(_BUILTIN_CACHE)


def select_rules(options: OptimizeOptions) -> list[Rule]:
    from graphopt.pattern.loader import load_patterns

    rules = builtin_rules() if options.builtin else []
    builtin = {r.name: r for r in rules}
    users: dict[str, Rule] = {}
    for extra in options.patterns:
        for rule in load_patterns(extra):
            earlier = users.get(rule.name) or builtin.get(rule.name)
            if earlier is not None and not (rule.name in options.replace and rule.name not in users):
                what = "a built-in rule" if rule.name not in users else "another rule"
                hint = f"; rename it, or pass --replace {rule.name} to use it instead of the built-in one" if rule.name not in users else ""
                raise PatternError(f"{rule.loc or '<unknown>:1:1'}: rule '{rule.name}' has the name of {what} ({earlier.loc}){hint}")
            users[rule.name] = rule
    for name in options.replace:
        if name not in builtin or name not in users:
            raise RuleNameError(f"--replace {name}: needs a built-in rule and a rule of yours (--patterns) of that name")
    rules = [r for r in rules if r.name not in users] + list(users.values())
    names = {r.name for r in rules}
    for name in [*(options.enable or ()), *options.disable]:
        if name not in names:
            raise RuleNameError(f"unknown rule '{name}' (see `graphopt patterns` for the list)")
    if options.enable is not None:
        wanted = set(options.enable)
        rules = [r for r in rules if r.name in wanted]
    dropped = set(options.disable)
    return [r for r in rules if r.name not in dropped]


def _summary(model: ir.Model) -> GraphSummary:
    ops = [n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in ir.traversal.RecursiveGraphIterator(model.graph)]
    for function in model.functions.values():
        ops.extend(n.op_type for n in function)
    return GraphSummary.of(ops, len(model.graph.initializers), sum(map(_elements, model.graph.initializers.values())))


def _elements(value: ir.Value) -> int:
    """Elements of an initializer (0 when its shape is not static), without loading its data."""
    shape = value.const_value.shape if value.const_value is not None else value.shape
    dims = [d for d in shape if isinstance(d, int)] if shape is not None else None
    return math.prod(dims) if dims is not None and shape is not None and len(dims) == len(shape) else 0


def optimize(model: ModelLike | str | os.PathLike[str], options: OptimizeOptions | None = None, **kwargs: Any) -> tuple[Any, Report]:
    """Optimize a model; returns (optimized model, report).

    `model` may be a path, an onnx-ir Model (rewritten in place) or a ModelProto
    (a ModelProto comes back as a ModelProto). Keyword arguments set fields of
    `OptimizeOptions`.
    """
    options = options or OptimizeOptions(**kwargs)
    target = get_target(options.target)
    plan = None
    if options.precision is not None:  # the precision modules are imported only when a precision is asked for
        from graphopt.passes.precision_plan import PrecisionPlan
        from graphopt.quant.fp8_onnx import refuse_fp8

        refuse_fp8(options.precision, target.name)  # not on the ONNX path: one line saying what the target lacks
        plan = PrecisionPlan.make(options.precision, options.keep_fp32)  # an unknown precision fails before any work
    weight_plan = _weight_plan(options)
    rules = RuleSet(select_rules(options))
    report = Report(target=target.name, precision=plan.precision if plan else None)
    started = time.perf_counter()

    as_proto = isinstance(model, onnx.ModelProto)
    graph_model: ir.Model
    if isinstance(model, (str, os.PathLike)):
        report.input_path = str(model)
        graph_model = load_model(model)
    elif isinstance(model, onnx.ModelProto):
        # onnx-ir's tensors write through to the protobuf they wrap (get_const_tensor names a
        # Constant's tensor, for one): work on a copy so the caller's ModelProto stays as it was.
        private = onnx.ModelProto()
        private.CopyFrom(model)
        graph_model = ir.serde.deserialize_model(private)
    else:
        graph_model = model
    report.times_s["load"] = time.perf_counter() - started
    report.before = _summary(graph_model)

    from graphopt.ops.fused_ops import shared_kv_buffer

    if options.kv_buffer != "growing":  # the default needs no check (nor the pass's import)
        from graphopt.passes.kv_buffer import KV_BUFFER_MODES

        if options.kv_buffer not in KV_BUFFER_MODES:
            raise ValueError(f"kv_buffer must be one of {', '.join(KV_BUFFER_MODES)}, not {options.kv_buffer!r}")
    if options.kv_max_length is not None and (options.kv_buffer != "shared" or isinstance(options.kv_max_length, bool)
                                              or not isinstance(options.kv_max_length, int) or options.kv_max_length < 1):
        raise ValueError(f"kv_max_length takes a length >= 1 with kv_buffer='shared', not {options.kv_max_length!r}"
                         f"{'' if options.kv_buffer == 'shared' else ' with kv_buffer=' + repr(options.kv_buffer)}")
    with shared_kv_buffer(options.kv_buffer == "shared"):
        _run_pipeline(graph_model, rules, target, report, options, plan, weight_plan)

    report.after = _summary(graph_model)
    if report.total_rewrites and not target.confirmed:
        report.warnings.append(
            f"target {target.name}: its kernel table is {target.kernel_source}: "
            "the kernels it emits are not confirmed against the onnxruntime that will run the model"
        )
    report.times_s["optimize"] = time.perf_counter() - started - report.times_s["load"]
    report.finalize()
    return (ir.serde.serialize_model(graph_model) if as_proto else graph_model), report


def _weight_plan(options: OptimizeOptions) -> Any:
    if options.weights is None:  # no plan, whatever the other weight options say: the quantizer is not imported
        return None
    from graphopt.passes.weight_quant import WeightQuantPlan

    return WeightQuantPlan.make(options.weights, options.block_size, options.weights_keep, options.weights_symmetric,
                                options.weights_min_snr, options.weights_accuracy_level)


def _quantize_weights(model: ir.Model, target: Any, report: Report, weight_plan: Any, decider: Any) -> None:
    """After precision (the weights' final type gives the scales' type), before lowering and cleanup
    (DCE removes the float weights no layer reads any more)."""
    from graphopt.passes.weight_quant import quantize_weights

    summary = quantize_weights(model, target, weight_plan, stats=report.pass_stats("weight_quant"), decider=decider)
    report.weight_quantization = summary
    for entry in summary._unmatched_keep:
        report.warnings.append(f"--weights-keep {entry}: no MatMul/Gemm weight layer of that name or op type in the model")


def _run_pipeline(model: ir.Model, rules: RuleSet, target: Any, report: Report, options: OptimizeOptions, plan: Any = None,
                  weight_plan: Any = None) -> None:
    from graphopt import passes
    from graphopt.passes.qdq_weights import fold_weight_quantize

    say = options.progress or (lambda message: None)

    def tag(pass_name: str) -> Any:
        return tag_new_nodes(model, pass_name)  # nodes a pass makes say so (graphopt.ir.provenance)

    inferred = options.shape_inference is True or (options.shape_inference == "auto" and not _fully_typed(model))
    if inferred:
        say("shape inference")
        run_pass(report, "shape_inference", lambda: passes.infer_shapes(model), tag)
    # Whether the graph may have changed since shapes were last inferred: rules and
    # folding of a sweep change it; the first sweep's rules run on freshly inferred shapes.
    stale = [not inferred]

    def fold_constants() -> int:
        folded = passes.fold_constants(view, size_limit_bytes=options.fold_size_limit)
        stale[0] = stale[0] or folded > 0
        return folded

    def refine_shapes() -> int:
        # Folding may have made the shapes behind a Shape or Size static.
        changed, stale[0] = stale[0], True
        if not changed or options.shape_inference is False:
            return 0
        from graphopt.ir.symbolic import forget_derived_shapes

        refined = passes.refine_shapes(model)
        forget_derived_shapes(view)  # the symbolic dims cached from the old shapes
        return refined

    def uncrop_sliding_window_cache() -> int:
        from graphopt.ir.symbolic import forget_derived_shapes
        from graphopt.passes.sliding_window_cache import uncrop_sliding_window_cache as uncrop

        notes: list[str] = []
        changed = uncrop(view, notes, shared=options.kv_buffer == "shared")
        report.warnings.extend(note for note in notes if note not in report.warnings)
        if changed:
            stale[0] = True
            forget_derived_shapes(view)
        return changed

    view = OnnxView(model)
    kind = GraphKind(
        view=view,
        fold=[
            ("sliding_window_cache", uncrop_sliding_window_cache),
            ("inline_constant_ifs", lambda: passes.inline_constant_ifs(view)),
            ("cse", lambda: passes.eliminate_common_subexpressions(view)),
            ("weight_quantize_folding", lambda: fold_weight_quantize(view)),  # a quantizer's Q -> DQ of a constant weight
            ("constant_folding", fold_constants),
            ("shape_refinement", refine_shapes),
        ],
        tag=tag,
    )
    driver_options = DriverOptions(
        max_rewrites=options.max_rewrites, allow=options.allow, blocked=set(options.blocked), trace_all=options.trace, precision=plan,
        observe=options.observe, strict=options.strict, snapshots=options.snapshots,
    )
    pipeline = Pipeline(kind, rules, target, report, driver_options, max_sweeps=options.max_sweeps, say=say)
    pipeline.sweep()
    view.restore_node_names()  # a node a rewrite stood in for leaves its name to its replacement
    # The onnx target names no execution provider (graphopt.decisions.EP_OF_TARGET): with neither
    # precision nor weights nothing asks it a decision, and graphopt.decisions (~3 ms) stays unimported.
    decider = _decision_point(target.name, options) if plan is not None or weight_plan is not None or target.name != "onnx" else None
    if plan is not None:
        say(f"precision: {plan.precision}")
        with tag_new_nodes(model, "precision"):
            _convert_precision(model, target, report, plan, options, decider)
    if weight_plan is not None:
        say(f"weights: {weight_plan.weights}")
        with tag_new_nodes(model, "weight_quant"):
            _quantize_weights(model, target, report, weight_plan, decider)
    say("cleanup")
    _lower_and_decide(model, target, report, options, decider, pipeline.run_passes, say)
    report.decisions = decider.records if decider is not None else []


def _lower_and_decide(model: ir.Model, target: Any, report: Report, options: OptimizeOptions, decider: Any, run_passes: Any, say: Any) -> None:
    """After precision: CSE, DCE, lowering, and the decisions that read the lowered graph (FusedConv, layout)."""
    from graphopt import passes

    run_passes([
        ("cse", lambda: passes.eliminate_common_subexpressions(model)),
        ("dce", lambda: passes.eliminate_dead_code(model)),
        ("lowering", lambda: lower_fused_ops(model, target)),
    ])
    if target.name in ("ort-cpu", "ort-cuda", "onnx"):  # another tool's blocked DequantizeLinear -> MatMul (int4 exports)
        from graphopt.passes.dq_matmul_nbits import lower_dequantize_matmuls

        run_passes([("dq_matmul_nbits", lambda: lower_dequantize_matmuls(model, target))])
    from graphopt.passes.fp8_qdq import fp8_note, guard_fp8_qdq

    note = fp8_note(model, target.name)  # a float8 QDQ model (ModelOpt's fp8 export): why its Q/DQ stay
    if note is not None:
        report.warnings.append(note)
        run_passes([("fp8_qdq", lambda: guard_fp8_qdq(model, target))])
    if decider is not None and decider.ep is not None:
        from graphopt.passes.fused_conv import decide_fused_convs

        say("decisions: FusedConv")
        run_passes([("fused_conv_decisions", lambda: decide_fused_convs(model, decider))])
    if target.name == "ort-cpu":
        from graphopt.passes.skip_norm import decide_skip_norms

        say("decisions: SkipLayerNormalization")  # ort-cuda keeps the fused ops (graphopt/passes/skip_norm.py)
        run_passes([("skip_norm_decisions", lambda: decide_skip_norms(model, decider, target))])
    if target.name in ("ort-cpu", "ort-cuda"):
        from graphopt.passes.bias_act import decide_bias_activations

        say("decisions: bias activations")  # the bias in the Gemm or in BiasGelu (graphopt/passes/bias_act.py)
        run_passes([("bias_act_decisions", lambda: decide_bias_activations(model, decider, target))])
    if target.name in ("ort-cpu", "ort-cuda"):
        from graphopt.passes.pack_qkv import pack_qkv

        run_passes([("pack_qkv", lambda: pack_qkv(model))])  # GroupQueryAttention's q, k, v projections as one MatMul
    if options.kv_buffer == "shared":
        from graphopt.passes.kv_buffer import share_kv_buffer

        say("kv buffer: shared")
        problem: list[str] = []
        run_passes([("kv_buffer", lambda: _count_or_note(share_kv_buffer(model, max_length=options.kv_max_length), problem))])
        if problem:
            report.warnings.append(f"--kv-buffer shared: not applied: {problem[0]}")
        else:  # the layers' seqlens_k, total and rotary pads now read one past length: merge them
            after: list[tuple[str, Callable[[], int]]] = []
            if options.kv_max_length is not None:  # the rotary tables, now of constant inputs: folded (under a bound of their own)
                from graphopt.passes.kv_buffer import rotary_table_nodes

                after.append(("constant_folding", lambda: passes.fold_constants(
                    OnnxView(model), size_limit_bytes=max(options.fold_size_limit, 1 << 30), only=rotary_table_nodes(model.graph))))
            run_passes([
                *after,
                ("cse", lambda: passes.eliminate_common_subexpressions(model)),
                ("dce", lambda: passes.eliminate_dead_code(model)),
            ])
    if target.name == "ort-cuda":
        from graphopt.passes.layout import convert_layout

        say(f"layout: {options.layout}")
        with tag_new_nodes(model, "layout"):
            report.layout = convert_layout(model, target, options.layout, stats=report.pass_stats("layout"), decider=decider)


def _count_or_note(result: tuple[int, str | None], problems: list[str]) -> int:
    count, problem = result
    if problem is not None:
        problems.append(problem)
    return count


def _decision_point(target: str, options: OptimizeOptions) -> Any:
    from graphopt.decisions import EP_OF_TARGET, CostTable, DecisionPoint, TuneCache, default_table

    table = options.cost_table
    if target not in EP_OF_TARGET:
        table = CostTable()  # the `onnx` target names no execution provider: nothing to decide, no table to read
    elif table is None:
        table = default_table()
    elif not isinstance(table, CostTable):
        table = CostTable.load(table)
    return DecisionPoint(
        target, table=table, tune=options.tune, timer=options.tune_timer, cache=TuneCache(options.tune_cache) if options.tune_cache else None
    )


def _convert_precision(model: ir.Model, target: Any, report: Report, plan: Any, options: OptimizeOptions, decider: Any) -> None:
    """Fusion rules ran in float32; now decide what stays float32 (range check, the
    convolutions' and the recurrent ops' precision decisions), convert, then collapse the Casts that are left."""
    from graphopt.decisions import DecisionPoint
    from graphopt.passes.precision_decision import decide_conv_precision
    from graphopt.passes.precision_range import range_checked_plan
    from graphopt.passes.precision_recurrent import decide_recurrent_precision

    if plan.precision == "fp16" and options.range_check:
        plan, kept, note = range_checked_plan(model, target, plan, options.calibration_data, say=options.progress)
    else:
        kept, note = [], ""

    def finish(copy: ir.Model, candidate: Any) -> None:
        # --tune: the candidate as graphopt writes it, its later decisions from the table.
        scratch = Report(target=target.name)
        _convert_and_clean(copy, target, scratch, candidate)
        _lower_and_decide(copy, target, scratch, options, DecisionPoint(target.name, table=decider.table),
                          lambda steps: [fn() for _, fn in steps], lambda message: None)

    plan, _ = decide_conv_precision(model, target, plan, decider, layout=options.layout, forced=options.precision_convs, finish=finish)
    plan, _ = decide_recurrent_precision(model, target, plan, decider, layout=options.layout, forced=options.precision_recurrent, finish=finish)
    summary = _convert_and_clean(model, target, report, plan)
    summary.kept_for_range, summary.calibration = kept, note
    if "range check skipped" in note or "did not run" in note or "still not finite" in note:
        report.warnings.append(f"{plan.precision}: {note}")
    report.precision_conversion = summary
    for entry in summary._unmatched_keep:
        report.warnings.append(f"--keep-fp32 {entry}: no op type, node or output of that name in the model")
    if summary.values_clamped or summary.values_flushed:
        report.warnings.append(
            f"{plan.precision}: {summary.values_clamped} constant values clamped to the largest finite {plan.low}, "
            f"{summary.values_flushed} flushed to zero"
        )


def _convert_and_clean(model: ir.Model, target: Any, report: Report, plan: Any) -> Any:
    """Convert with `plan`, then remove the Cast pairs left; returns the PrecisionSummary."""
    from graphopt.passes.precision import convert_precision, remove_cast_pairs

    summary = convert_precision(model, target, plan, stats=report.pass_stats("precision"))
    cast_rule_names = ("DropNoOpCast", "CollapseCastChain")
    cast_rules = RuleSet([r for r in builtin_rules() if r.name in cast_rule_names])

    def run_cast_rules(m: ir.Model) -> int:
        # A scratch report: these rewrites belong to the pass, not to the rules verification bisects over.
        return apply_rules(OnnxView(m), cast_rules, target, Report(target=target.name), DriverOptions(trace=False, provenance=False))

    summary.casts_removed = remove_cast_pairs(model, summary._casts, run_cast_rules, stats=report.pass_stats("precision_cleanup"))
    return summary


def _fully_typed(model: ir.Model) -> bool:
    """Exporters that write value_info for every value need no shape inference."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            if value.type is None or value.shape is None:
                return False
    return True


def optimize_file(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    options: OptimizeOptions | None = None,
    **kwargs: Any,
) -> Report:
    """Load, optimize and atomically save; the input file is never modified unless it is the output."""
    options = options or OptimizeOptions(**kwargs)
    optimized, report = optimize(input_path, options)
    report.output_path = str(output_path)
    t0 = time.perf_counter()
    save_model(optimized, output_path, reference=input_path)
    report.times_s["save"] = time.perf_counter() - t0
    return report


