"""Check that an optimized model computes what the original did, and repair it if not.

`verify` runs both models in onnxruntime (CPU unless told otherwise) on the same
random inputs and compares every output with a tolerance that depends on its
precision. `verify_and_repair` goes further: when the numbers differ (or the
optimized model does not even load), it bisects over the applied rewrites to
find the first one that changed them, leaves that rewrite out, re-optimizes and
checks again, a bounded number of times.

Random inputs are chosen to be valid for typical models: floats are standard
normal; integers are small non-negative values that stay below the size of any
table they index (found by following the input to a Gather); inputs named like
masks are all ones; symbolic dimensions get one size per name (1 for batch-like
dimensions, 16 otherwise) unless pinned with `input_shapes`.

How outputs are compared (tolerances per type and precision) is graphopt.verify_compare's
job; opening and running onnxruntime sessions is graphopt.verify_session's.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphopt.errors import GraphoptError, VerificationError
from graphopt.inputs import BATCH_DIM, DEFAULT_DIM, MAX_INPUT_BYTES, MAX_INT_VALUE, _inputs, _np_dtype, _resolve_shapes, make_inputs  # noqa: F401  (re-exported)
from graphopt.report.model import Report, RewriteRecord
from graphopt.report.sections import Verification
from graphopt.verify_compare import (
    _EXACT,
    PRECISION_TOLERANCES,
    QUANTIZED_MIN_COSINE,
    TOLERANCES,
    Tolerance,
    _loosest,
    _tolerance,
    compare_outputs,
)
from graphopt.verify_session import _MISSING_KERNEL, Providers, _first_line, _LoadFailed, _run

__all__ = [
    "VerificationError",
    "Tolerance",
    "TOLERANCES",
    "PRECISION_TOLERANCES",
    "DEFAULT_DIM",
    "BATCH_DIM",
    "verify",
    "verify_and_repair",
    "make_inputs",
    "compare_outputs",
    "parse_shape",
    "providers_for",
]

# ------------------------------------------------------------------ verify


@dataclass
class _Reference:
    """The original model's outputs on the random inputs: computed once, compared many times."""

    feeds: list[dict[str, np.ndarray]]
    outputs: list[dict[str, np.ndarray]]
    shapes: dict[str, list[int]]
    tolerance: Tolerance
    providers: Providers
    #: A missing kernel is "cannot verify here", not a failure (a GPU target checked on a CPU).
    cpu_only: bool = False
    #: The precision's tolerance for float outputs (see PRECISION_TOLERANCES), if any.
    floor: Tolerance | None = None
    #: Applied to a copy of each optimized model before it runs (emulations of what the
    #: target runs and this provider does not; see `_stand_ins`).
    prepare: Callable[[ir.Model], ir.Model] | None = None
    #: What the check does not prove here ("" when it runs on the target's provider).
    caveat: str = ""
    #: With quantized weights: float outputs pass on their cosine similarity (QUANTIZED_MIN_COSINE).
    min_cosine: float | None = None


def _as_model(model: ir.Model | onnx.ModelProto | str | os.PathLike[str]) -> ir.Model:
    if isinstance(model, ir.Model):
        return model
    if isinstance(model, onnx.ModelProto):
        return ir.serde.deserialize_model(model)
    from graphopt.ir.onnx_io import load_model

    return load_model(model)


def _reference(
    original: ir.Model, input_shapes: Mapping[str, list[int]] | None, seed: int, runs: int, providers: Providers, precision: str | None = None
) -> _Reference:
    shapes = _resolve_shapes(original.graph, input_shapes or {})
    feeds = [make_inputs(original, shapes, seed + i) for i in range(max(1, runs))]
    try:
        outputs = _run(original, feeds, providers)
    except GraphoptError:
        raise
    except _LoadFailed as error:
        raise VerificationError(f"cannot verify: onnxruntime cannot load the original model: {error}") from None
    except Exception as error:  # noqa: BLE001 - onnxruntime raises its own exception types
        shown = ", ".join(f"{k}={','.join(map(str, v))}" for k, v in shapes.items())
        raise VerificationError(
            f"cannot verify: the original model fails in onnxruntime on random inputs ({shown}): {_first_line(error)}; pin input shapes with --input-shape NAME=D1,D2,..."
        ) from None
    floor = PRECISION_TOLERANCES.get((precision or "").lower())
    # A float64 output computed in float32 (then Cast) carries float32 rounding: every float
    # output gets at least the tolerance of the least precise float type the model computes in.
    computed = _computation_tolerance(original)
    floor = _loosest(computed, floor) if computed is not None else floor
    loosest = _EXACT
    for array in outputs[0].values():
        tol = _tolerance(np.asarray(array).dtype)
        loosest = _loosest(loosest, tol if tol is _EXACT else _loosest(tol, floor))
    return _Reference(feeds, outputs, shapes, loosest, providers, floor=floor)


def _computation_tolerance(model: ir.Model) -> Tolerance | None:
    """The tolerance of the least precise float type among the model's values (where known) and
    its Casts' targets; None if it computes in no float type graphopt has a tolerance for."""
    dtypes: set[ir.DataType] = set()
    for graph in model.graphs():
        values = [*graph.inputs, *graph.initializers.values()]
        for node in graph:
            values.extend(node.outputs)
            if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and "to" in node.attributes:
                dtypes.add(ir.DataType(node.attributes.get_int("to")))
        dtypes.update(v.dtype for v in values if v.dtype is not None)
    tolerances = [TOLERANCES[name] for name in (_dtype_name(d) for d in dtypes) if name in TOLERANCES]
    return max(tolerances, key=lambda t: (t.rtol, t.atol)) if tolerances else None


def _dtype_name(dtype: ir.DataType) -> str | None:
    try:
        return np.dtype(dtype.numpy()).name
    except Exception:  # noqa: BLE001 - types numpy lacks (bfloat16 without ml_dtypes, float8)
        return "bfloat16" if dtype == ir.DataType.BFLOAT16 else None


def _check(reference: _Reference, candidate: ir.Model) -> Verification:
    def result(passed: bool, diffs: dict[str, float], message: str) -> Verification:
        return Verification(
            passed, len(reference.feeds), diffs, reference.tolerance.rtol, reference.tolerance.atol, dict(reference.shapes), message=message,
            provider=_provider_name(reference.providers), caveat=reference.caveat,
        )

    try:
        if reference.prepare is not None:
            candidate = reference.prepare(candidate)
        outputs = _run(candidate, reference.feeds, reference.providers)
    except _LoadFailed as error:
        if reference.cpu_only and _MISSING_KERNEL.search(str(error)):
            # Built for a GPU target and checked on a CPU: a CUDA-only kernel is no fault of the rewrite.
            raise VerificationError(
                f"cannot verify here: {error}; the model uses a kernel this onnxruntime's CPU provider lacks (verify where the target runs)"
            ) from None
        maker = _maker_of_failing_node(candidate, str(error))
        return result(False, {}, f"the optimized model does not load in onnxruntime: {error}{maker}")
    except Exception as error:  # noqa: BLE001
        return result(False, {}, f"the optimized model does not run in onnxruntime: {_first_line(error)}")
    diffs: dict[str, float] = {}
    cosines: dict[str, float] = {}
    for want, got in zip(reference.outputs, outputs, strict=True):
        run_diffs, problems = compare_outputs(want, got, reference.floor, reference.min_cosine, cosines)
        for name, diff in run_diffs.items():
            diffs[name] = max(diffs.get(name, 0.0), diff)
        if problems:
            failed = result(False, diffs, "; ".join(problems))
            failed.cosine, failed.min_cosine = cosines, reference.min_cosine
            return failed
    within = ""
    if reference.min_cosine is not None and cosines:
        worst = min(cosines, key=lambda name: cosines[name])
        within = f"; quantized weights: cosine similarity >= {reference.min_cosine:g} (lowest {cosines[worst]:.5f}, output '{worst}')"
    passed = result(True, diffs, f"all {len(diffs)} outputs match on {len(reference.feeds)} random inputs (on {_provider_name(reference.providers)}){within}")
    passed.cosine, passed.min_cosine = cosines, reference.min_cosine
    return passed


#: A pass (not a rule) made the node onnxruntime refused: bisecting over rewrites cannot find it.
_MADE_BY_PASS = "made by graphopt's "


def _maker_of_failing_node(model: ir.Model, error: str) -> str:
    """", at node N made by graphopt's X pass" (or "... by rule R") for the node onnxruntime names."""
    from graphopt.ir.provenance import PASS_KEY, RULE_KEY

    found = re.search(r"Node \(([^)]*)\)", error)
    if found is None:
        return ""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.name == found.group(1):
            props = node.metadata_props
            if props.get(RULE_KEY):
                return f" (node {node.name} was made by rule {props[RULE_KEY]})"
            if props.get(PASS_KEY):
                return f" (node {node.name} was {_MADE_BY_PASS}{props[PASS_KEY]} pass)"
    return ""


def _providers(providers: Providers | None) -> Providers:
    return list(providers) if providers else ["CPUExecutionProvider"]


def _provider_name(providers: Providers) -> str:
    first = providers[0] if providers else "CPUExecutionProvider"
    return str(first[0] if isinstance(first, tuple) else first)


#: The execution provider each target's models are built for.
TARGET_PROVIDERS = {"ort-cuda": "CUDAExecutionProvider", "ort-cpu": "CPUExecutionProvider"}


def _low_precision(model: ir.Model) -> bool:
    return any(v.dtype == ir.DataType.FLOAT16 for n in model.graph for v in n.outputs)


def _stand_ins(target: str, precision: str | None, providers: Providers) -> tuple[Callable[[ir.Model], ir.Model] | None, str]:
    """Where the check does not run on the target's provider: how an optimized model is
    made runnable here (NHWC-only CUDA ops through standard ops; float16 rounded after
    every op, as a GPU stores it, since the CPU provider computes float16 regions in float32),
    and what such a check does not prove."""
    where = _provider_name(providers)
    wanted = TARGET_PROVIDERS.get(target)
    fp16 = str(precision).lower() == "fp16"
    if wanted is None or wanted == where:
        if where == "CPUExecutionProvider" and fp16:
            return _emulated(nhwc=False, fp16=True), ""
        return None, ""
    caveat = (
        f"checked on {where}, not on the target's {wanted} (absent here): this does not prove the target's own kernels"
        " (cuDNN/cuBLAS algorithms, TF32, the accumulation order of its float16 kernels); CUDA-only ops ran through"
        " onnxruntime's CPU contrib kernels or as standard-op emulations (NhwcConv, channels-last GroupNorm)"
    )
    if fp16:
        caveat += "; float16 was emulated by rounding every op's result to float16"
    return _emulated(nhwc=target == "ort-cuda", fp16=fp16), caveat


def _emulated(nhwc: bool, fp16: bool) -> Callable[[ir.Model], ir.Model]:
    def prepare(model: ir.Model) -> ir.Model:
        from graphopt.passes.nhwc_emulation import emulate_nhwc_ops
        from graphopt.passes.precision_range import emulate_low_precision

        copy = ir.serde.deserialize_model(ir.serde.serialize_model(model))
        if nhwc:
            emulate_nhwc_ops(copy)
        if fp16 and _low_precision(copy):
            copy = emulate_low_precision(copy)
        return copy

    return prepare


def providers_for(target: str) -> Providers:
    """Where to verify a model optimized for `target`: on CUDA for ort-cuda when this
    onnxruntime has it (TF32 off, so float32 stays float32), else on the CPU."""
    import onnxruntime as ort

    if target == "ort-cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def verify(
    original: ir.Model | onnx.ModelProto | str | os.PathLike[str],
    optimized: ir.Model | onnx.ModelProto | str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, list[int]] | None = None,
    seed: int = 0,
    runs: int = 2,
    providers: Providers | None = None,
    precision: str | None = None,
    target: str | None = None,
    weights: str | None = None,
) -> Verification:
    """Run both models on the same random inputs and compare every output (with
    `precision` "fp16" or "bf16", float outputs get that precision's tolerance). With
    `target`, the check runs on that target's provider when present (`providers_for`), and
    elsewhere says what it does not prove (`Verification.caveat`). With `weights` "int4" or "int8"
    (the model's weights were quantized), float outputs pass on their cosine similarity with the
    original's (QUANTIZED_MIN_COSINE).

    Raises VerificationError when the comparison cannot be made (the original does
    not run, an input shape cannot be resolved); a difference, or an optimized model
    that does not load, is a failed Verification, not an exception.
    """
    chosen = _providers(providers) if providers or target is None else providers_for(target)
    reference = _reference(_as_model(original), input_shapes, seed, runs, chosen, precision)
    reference.min_cosine = QUANTIZED_MIN_COSINE.get(str(weights).lower()) if weights else None
    if target is not None:
        reference.prepare, reference.caveat = _stand_ins(target, precision, chosen)
    return _check(reference, _as_model(optimized))


# ------------------------------------------------------------------ repair


def _describe(record: RewriteRecord) -> str:
    where = record.node if record.scope == "main" else f"{record.node} (in {record.scope})"
    return f"{record.rule} at {where}"


def verify_and_repair(
    load_original: Callable[[], ir.Model],
    optimized: ir.Model,
    report: Report,
    options: Any,
    input_shapes: Mapping[str, list[int]] | None = None,
    *,
    seed: int = 0,
    runs: int = 2,
    max_repairs: int = 5,
    providers: Providers | None = None,
) -> tuple[ir.Model, Verification]:
    """Verify `optimized`; if it fails, find the rewrite that broke it, leave it out, retry.

    `load_original` must return a fresh copy of the input model each call (optimize
    rewrites in place). Each round bisects over `report.applied`: re-optimizing with
    only the first k rewrites allowed finds the smallest k whose model fails, and that
    rewrite is added to `options.blocked`. `report` is updated in place to describe the
    model returned (its rewrites, and `report.verification`).
    """
    from graphopt.api import optimize

    started = time.perf_counter()
    say = getattr(options, "progress", None) or (lambda message: None)
    say("verify: running the original model")
    target = getattr(options, "target", "onnx")
    precision = getattr(options, "precision", None)
    chosen = list(providers) if providers else providers_for(target)
    reference = _reference(load_original(), input_shapes, seed, runs, chosen, precision)
    weights = getattr(options, "weights", None)
    reference.min_cosine = QUANTIZED_MIN_COSINE.get(str(weights).lower()) if weights else None
    on_cpu = chosen == ["CPUExecutionProvider"]
    # onnxruntime's CPU provider has few bfloat16 kernels: only ort-cpu models are built for it.
    reference.cpu_only = on_cpu and (target == "ort-cuda" or (str(precision).lower() == "bf16" and target != "ort-cpu"))
    reference.prepare, reference.caveat = _stand_ins(target, precision, chosen)
    say(f"verify: on {_provider_name(chosen)}" + (" (not the target's provider)" if reference.caveat else ""))
    say("verify: running the optimized model")
    verification = _check(reference, optimized)
    dropped: list[str] = []
    first_problem = verification.message
    quiet = dataclasses.replace(options, progress=None)

    def attempt(allowed: set[tuple[str, str]] | None) -> tuple[ir.Model, Report, Verification]:
        trial = dataclasses.replace(
            quiet, blocked=set(options.blocked), allow=None if allowed is None else (lambda rule, node: (rule, node) in allowed)
        )
        model, trial_report = optimize(load_original(), trial)
        return model, trial_report, _check(reference, model)

    rounds = 0
    # A node a pass made is what onnxruntime refused: leaving rewrites out would blame an innocent rule.
    pass_made_it = not verification.passed and _MADE_BY_PASS in verification.message
    if pass_made_it:
        verification.message += "; cannot repair: the failing node was not made by a rewrite"
    while not verification.passed and rounds < max_repairs and not pass_made_it:
        rounds += 1
        applied = report.applied
        keys = [(r.rule, r.node) for r in applied]
        say(f"verify: failed; bisecting over {len(keys)} rewrites (round {rounds})")
        prefix_passes = functools.partial(_prefix_passes, attempt, keys)
        culprit, why = _bisect(keys, prefix_passes)
        if culprit is None:
            verification.message = f"{verification.message}; cannot repair: {why}"
            break
        record = applied[culprit]
        options.blocked.add(keys[culprit])
        dropped.append(_describe(record))
        say(f"verify: leaving out {dropped[-1]}")
        optimized, new_report, verification = attempt(None)
        _replace_report(report, new_report)

    verification.dropped = dropped
    if dropped:
        outcome = "the rest verifies" if verification.passed else "still fails"
        first = first_problem.split("; ")[0]
        verification.message = (
            f"left out {', '.join(dropped)}: {'it' if len(dropped) == 1 else 'each'} changed the outputs"
            f" (first found: {dropped[0]}, where {first}); {outcome}: {verification.message}"
        )
        for text in dropped:
            report.warnings.append(f"left out {text}: it changed the model's outputs")
    elif not verification.passed and rounds >= max_repairs and not pass_made_it:
        verification.message += f" (gave up after {max_repairs} repairs)"
    report.verification = verification
    report.times_s["verify"] = report.times_s.get("verify", 0.0) + time.perf_counter() - started
    return optimized, verification


def _prefix_passes(
    attempt: Callable[[set[tuple[str, str]] | None], tuple[ir.Model, Report, Verification]], keys: list[tuple[str, str]], k: int
) -> bool:
    """Does the model verify with only the first k rewrites allowed?"""
    return attempt(set(keys[:k]))[2].passed


def _bisect(keys: list[tuple[str, str]], passes: Callable[[int], bool]) -> tuple[int | None, str]:
    """Index of the first rewrite whose inclusion makes the model fail; else None and why.

    Assumes failure is monotonic in the prefix length: once a prefix fails, longer
    ones do too. The empty prefix is checked only when the search ends at the first
    rewrite (the usual run of a pass-only failure)."""
    if not keys:
        return None, "no rewrite was applied, so a pass (not a rule) changed the numbers"
    lo, hi = 0, len(keys)  # prefix lo passes (assumed until checked), prefix hi fails
    if passes(hi):
        return None, "re-optimizing with the same rewrites does not reproduce the failure"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    if lo == 0 and not passes(0):
        return None, "it fails with no rewrite applied, so a pass (not a rule) changed the numbers"
    return hi - 1, ""


def _replace_report(report: Report, new: Report) -> None:
    """Make `report` describe the re-optimized model, keeping what the caller set on it."""
    keep = {"input_path": report.input_path, "output_path": report.output_path}
    times = dict(report.times_s)
    for f in dataclasses.fields(Report):
        setattr(report, f.name, getattr(new, f.name))
    for name, value in keep.items():
        if value is not None:
            setattr(report, name, value)
    # The new run's step times, but the load and verify times of the command as a whole.
    report.times_s = {**new.times_s, **{k: v for k, v in times.items() if k in ("load", "verify")}}


def parse_shape(text: str) -> tuple[str, list[int]]:
    """`name=1,128` -> ("name", [1, 128]); raises VerificationError on malformed text."""
    name, sep, dims = text.rpartition("=")
    try:
        values = [int(d) for d in dims.split(",")] if dims.strip() else []
    except ValueError:
        values = None  # type: ignore[assignment]
    if not sep or not name or values is None or any(v < 0 for v in values):
        raise VerificationError(f"--input-shape {text!r}: expected NAME=D1,D2,... with non-negative integers, e.g. input_ids=1,128")
    return name, values
