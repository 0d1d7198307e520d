"""Run a model before and after graphopt and compare: the differential oracle.

The comparison is written here rather than taken from graphopt.verify, so that a bug
in graphopt's own verification cannot hide a bug in the optimizer; only the
per-precision tolerances are graphopt's (TOLERANCES), since those are the promise
under test. `check_target` is the whole property for one target:

* graphopt raises nothing but GraphoptError on a valid model;
* it does not modify the ModelProto it was given;
* the result is a valid model (onnx.checker, graphopt's own load checks after an
  atomic save) with the same outputs in the same order and no graphopt.* op left;
* onnxruntime (CPU, its own graph rewrites off) computes the same outputs from it
  within tolerance. A model built for ort-cuda may hold kernels only the CUDA
  provider has; then only the structural checks and graphopt.verify's own verdict
  ("cannot verify here") are asked for. For `--target onnx` (standard ops, any
  runtime) a difference that onnx's reference implementation does not show is
  onnxruntime departing from the spec, reported as `runtime_deviation`, not a failure;
  so is a difference listed in KNOWN_ISSUES (found, reported, not fixed yet).
"""

from __future__ import annotations

import re
import tempfile
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from fuzz.graphs import FuzzCase

__all__ = ["TARGETS", "CheckOutcome", "run_model", "compare", "reference_outputs", "check_target", "CUDA_ONLY_OPS", "KNOWN_ISSUES"]

TARGETS = ("onnx", "ort-cpu", "ort-cuda")


def _cuda_only_ops() -> frozenset[str]:
    """Ops graphopt may emit for ort-cuda that onnxruntime's CPU provider has no kernel for
    (NhwcConv, GroupNorm, BiasSplitGelu, ...), from graphopt's capability tables."""
    from graphopt.ops.targets import get_target

    cpu = get_target("ort-cpu").kernels
    return frozenset(op for domain, op in get_target("ort-cuda").kernels if (domain, op) not in cpu)


CUDA_ONLY_OPS = _cuda_only_ops()
_MISSING_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node|NOT_IMPLEMENTED : Could not find an implementation for (\w+)")


@dataclass
class CheckOutcome:
    """What happened for one target: rules that fired, and whether numerics were compared."""

    target: str
    applied: list[str] = field(default_factory=list)
    compared: bool = False
    rejected: str | None = None  # a GraphoptError's message, if graphopt refused the model
    #: `--target onnx` only: onnxruntime's outputs differ, but by the ONNX reference
    #: implementation the optimized model computes what the original does (an onnxruntime
    #: kernel that departs from the ONNX spec, e.g. Attention-23 on fully masked rows).
    runtime_deviation: str | None = None
    #: A difference of a kind fuzzing found and that is reported but not fixed yet (`KNOWN_ISSUES`).
    known_issue: str | None = None


def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # compare graphopt, not onnxruntime
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))


def reference_outputs(case: FuzzCase, runs: int = 2) -> list[dict[str, np.ndarray]] | None:
    """The original model's outputs on `runs` random feeds; None if the model is not valid
    (the checker or onnxruntime refuses it): such a draw is discarded, not a finding."""
    try:
        onnx.checker.check_model(case.model, full_check=True)
        return [run_model(case.model, case.feeds(run)) for run in range(runs)]
    except Exception:  # noqa: BLE001 - onnx and onnxruntime raise assorted types for invalid models
        return None


def _tolerance(dtype: np.dtype) -> tuple[float, float] | None:
    from graphopt.verify import TOLERANCES

    tol = TOLERANCES.get(np.dtype(dtype).name)
    return None if tol is None else (tol.rtol, tol.atol)


def computed_in(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """Per graph output, the least precise float type on its way from the inputs (a float64
    output computed in float32 and Cast carries float32 rounding), by onnx's shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    elem = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    elem.update({t.name: t.data_type for t in graph.initializer})
    producer = {name: node for node in graph.node for name in node.output}
    result: dict[str, np.dtype] = {}
    for output in graph.output:
        stack, seen, loosest = [output.name], set(), None
        while stack:
            name = stack.pop()
            if not name or name in seen:
                continue
            seen.add(name)
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem[name])) if elem.get(name) else None
            if dtype is not None and dtype.kind == "f" and (loosest is None or _tolerance(dtype) > _tolerance(loosest)):
                loosest = dtype
            if name in producer:
                stack.extend(producer[name].input)
        if loosest is not None:
            result[output.name] = loosest
    return result


def compare(
    want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], input_magnitude: float = 1.0, computed: Mapping[str, np.dtype] | None = None
) -> list[str]:
    """One line per output that differs: name, shape, type, NaN/inf places, values.

    As in graphopt.verify, |got - want| <= atol * scale + rtol * |want|, with scale the
    output's largest magnitude, or the inputs' (`input_magnitude`) when larger: with inputs
    near 1000 the original's own rounding is about 1000 times that of inputs near 1. The
    tolerance is the output type's, or that of the type it was computed in (`computed_in`)."""
    problems = []
    if list(want) != list(got):
        return [f"outputs {list(got)} instead of {list(want)}"]
    for name, expected in want.items():
        actual = np.asarray(got[name])
        expected = np.asarray(expected)
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            problems.append(f"{name}: {actual.dtype}{list(actual.shape)} instead of {expected.dtype}{list(expected.shape)}")
            continue
        tol = _tolerance(expected.dtype)
        if tol is not None and computed and name in computed:
            tol = max(tol, _tolerance(computed[name]) or tol)
        if tol is None or expected.size == 0:
            if not np.array_equal(actual, expected):
                problems.append(f"{name}: differs (exact type {expected.dtype})")
            continue
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        signed_inf_a, signed_inf_e = np.where(np.isinf(a), np.sign(a), 0), np.where(np.isinf(e), np.sign(e), 0)
        if not np.array_equal(np.isnan(a), np.isnan(e)) or not np.array_equal(signed_inf_a, signed_inf_e):
            problems.append(f"{name}: NaN or infinity in different places")
            continue
        finite = np.isfinite(e)
        rtol, atol = tol
        scale = max(1.0, input_magnitude, float(np.abs(e[finite]).max(initial=0.0)))
        delta = np.abs(a[finite] - e[finite])
        bad = delta > atol * scale + rtol * np.abs(e[finite])
        if bad.any():
            problems.append(f"{name}: max abs diff {delta.max():.3g} ({int(bad.sum())} of {e.size} elements out of tolerance, scale {scale:.3g})")
    return problems


def _missing_cuda_kernel(error: Exception) -> str | None:
    match = _MISSING_KERNEL.search(str(error))
    op = match and (match.group(1) or match.group(2))
    return op if op in CUDA_ONLY_OPS else None


def check_target(case: FuzzCase, target: str, reference: list[dict[str, np.ndarray]]) -> CheckOutcome:
    """The differential property for one target; raises AssertionError with the model on failure."""
    import graphopt
    from graphopt.errors import GraphoptError
    from graphopt.ir.onnx_io import load_model, save_model

    outcome = CheckOutcome(target)
    before = case.model.SerializeToString()

    def fail(message: str) -> AssertionError:
        return AssertionError(f"[{target}] {message}\n{case.describe()}")

    try:
        optimized, report = graphopt.optimize(case.model, target=target)
    except GraphoptError as error:
        outcome.rejected = str(error)
        return outcome
    except Exception as error:  # noqa: BLE001 - anything else is a crash: the finding
        raise fail(f"graphopt.optimize raised {type(error).__name__}: {error}\n{traceback.format_exc()}") from error
    if case.model.SerializeToString() != before:
        raise fail(f"graphopt.optimize modified the ModelProto it was given:\n{_proto_diff(before, case.model)}")
    outcome.applied = [record.rule for record in report.applied]
    if not isinstance(optimized, onnx.ModelProto):
        raise fail(f"a ModelProto in, a {type(optimized).__name__} out")
    leftover = sorted({n.op_type for n in optimized.graph.node if n.domain == "graphopt"})
    if leftover:
        raise fail(f"graphopt ops left after lowering: {leftover}")
    if [o.name for o in optimized.graph.output] != [o.name for o in case.model.graph.output]:
        raise fail(f"outputs {[o.name for o in optimized.graph.output]} instead of {[o.name for o in case.model.graph.output]}")
    try:
        onnx.checker.check_model(optimized)
    except Exception as error:  # noqa: BLE001
        # onnxruntime registers SimplifiedLayerNormalization in the default domain, and LayerNormalization
        # there from opset 1 (graphopt.LayerNorm's lowering below 17); onnx knows neither.
        ort_only = re.search(r"No Op registered for (SimplifiedLayerNormalization|LayerNormalization with domain_version of (1[0-6]|[1-9])\b)", str(error))
        if target == "onnx" or not ort_only:
            raise fail(f"the optimized model fails onnx.checker: {error}") from error
    with tempfile.TemporaryDirectory(prefix="graphopt-fuzz-") as folder:
        path = Path(folder) / "model.onnx"
        try:
            save_model(ir.serde.deserialize_model(optimized), path)
            load_model(path)
        except Exception as error:  # noqa: BLE001
            raise fail(f"the optimized model does not save and load back: {type(error).__name__}: {error}") from error
    try:
        got = [run_model(optimized, case.feeds(run)) for run in range(len(reference))]
    except Exception as error:  # noqa: BLE001
        if target == "ort-cuda" and _missing_cuda_kernel(error):
            _check_graphopt_verify_agrees(case, optimized, fail)
            return outcome
        raise fail(f"the optimized model does not run in onnxruntime: {str(error).splitlines()[0][:500]}") from error
    computed = computed_in(case.model)
    for run, (want, have) in enumerate(zip(reference, got)):
        problems = compare(want, have, case.input_magnitude(), computed)
        if problems and target == "onnx" and _spec_agrees(case, optimized, run):
            outcome.runtime_deviation = "; ".join(problems)
        elif problems and _known_issue(target, outcome.applied, want, have):
            outcome.known_issue = _known_issue(target, outcome.applied, want, have)
        elif problems:
            raise fail(f"outputs differ on random input {run} (rewrites: {outcome.applied}): " + "; ".join(problems))
    outcome.compared = True
    if target == "ort-cuda":
        _check_graphopt_verify_agrees(case, optimized, fail)
    return outcome


#: Differences fuzzing found that are reported and not fixed yet, so the long profile keeps
#: going past them; each is narrow on purpose (RELIABILITY.md, "Found, not fixed").
KNOWN_ISSUES = {
    "attention-onnx-fully-masked-row": "--target onnx, FuseAttention (standard Attention, opset 23): a query row whose "
    "every key is masked with -inf gives 0 where the original gives NaN (onnx.reference agrees with onnxruntime)",
}


def _known_issue(target: str, applied: list[str], want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> str | None:
    if target != "onnx" or "FuseAttention" not in applied:
        return None
    for name, expected in want.items():
        e, a = np.asarray(expected), np.asarray(got[name])
        if e.shape != a.shape or e.dtype.kind != "f":
            return None
        differs = ~((e == a) | (np.isnan(e) & np.isnan(a)) | np.isclose(a, e, rtol=1e-4, atol=1e-5))
        if not np.all(np.isnan(e[differs]) & (a[differs] == 0)):
            return None  # some difference is not a NaN row turned into zeros
    return "attention-onnx-fully-masked-row"


def _spec_agrees(case: FuzzCase, optimized: onnx.ModelProto, run: int) -> bool:
    """Do the original and the optimized model compute the same by onnx's reference
    implementation (the spec), on the random input where onnxruntime saw them differ?"""
    from onnx.reference import ReferenceEvaluator

    feeds = case.feeds(run)
    try:
        want = dict(zip([o.name for o in case.model.graph.output], ReferenceEvaluator(case.model).run(None, feeds)))
        got = dict(zip([o.name for o in optimized.graph.output], ReferenceEvaluator(optimized).run(None, feeds)))
    except Exception:  # noqa: BLE001 - the reference implementation lacks some ops: no verdict, so no excuse
        return False
    return not compare(want, got, case.input_magnitude(), computed_in(case.model))


def _check_graphopt_verify_agrees(case: FuzzCase, optimized: onnx.ModelProto, fail: Callable[[str], AssertionError]) -> None:
    """graphopt's own verification (as `--verify --target ort-cuda` runs it on a CPU) passes,
    or says it cannot verify here because of a CUDA-only kernel."""
    from graphopt.verify import VerificationError, verify

    try:
        initializers = {i.name for i in case.model.graph.initializer}  # overridable ones keep their values there
        shapes = {name: dims for name, dims in case.input_shapes().items() if name not in initializers}
        verdict = verify(case.model, optimized, input_shapes=shapes)
    except VerificationError as error:
        if "cannot verify here" in str(error) or _missing_cuda_kernel(error):
            return
        raise fail(f"graphopt.verify could not run: {error}") from error
    if not verdict.passed and not _missing_cuda_kernel(Exception(verdict.message)):
        raise fail(f"graphopt.verify fails: {verdict.message}")


def _proto_diff(before: bytes, after: onnx.ModelProto) -> str:
    import difflib

    original = onnx.ModelProto()
    original.ParseFromString(before)
    lines = difflib.unified_diff(str(original).splitlines(), str(after).splitlines(), "given", "after optimize", lineterm="", n=2)
    return "\n".join(list(lines)[:80]) or "(the same text, different bytes)"
