"""What a user can do about a near-miss: hints keyed on the failing check's words.

The matcher and the native checks explain a failure in words ("the number of heads
or the head size is not static (...)", "'b' is not a constant"). Some of those
failures have a known remedy; this table maps the words to it. The first entry whose
pattern is found in the reason wins, so the specific entries come before the
general ones. Reasons with no known remedy get no hint: better none than a wrong one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from graphopt.ops.registry import GRAPHOPT_DOMAIN, spec

__all__ = ["Hint", "HINTS", "hint_for", "target_gap", "summarize_target_gaps"]


@dataclass(frozen=True)
class Hint:
    pattern: re.Pattern[str]  # searched (not fully matched) in the reason
    text: str


def _hint(pattern: str, text: str) -> Hint:
    return Hint(re.compile(pattern, re.IGNORECASE), text)


_FIX_DIMS = (
    "fix the symbolic dims in the model (e.g. `python -m onnxruntime.tools.make_dynamic_shape_fixed "
    "--dim_param seq --dim_value 128 in.onnx fixed.onnx`) or export it with static shapes, then optimize again"
)

HINTS: tuple[Hint, ...] = (
    # --- shapes
    _hint(
        r"number of heads or the head size is not static",
        f"num_heads could not be inferred because the attention dims are symbolic; {_FIX_DIMS}.",
    ),
    _hint(r"Min\(|Max\(", f"a dim is a computed expression (e.g. Min(512, seq) from a position-embedding slice); {_FIX_DIMS}."),
    _hint(
        r"not static|not known to be equal|dims are not known|has unknown rank|rank is unknown|count is unknown",
        f"the check could not prove the dims from the model's (symbolic) shapes; if they are fixed when you run it, {_FIX_DIMS}.",
    ),
    # --- constants
    _hint(
        r"is not a constant|bound is not constant",
        "the value is computed in the graph rather than stored as a weight; if it depends only on constants, constant "
        "folding may have skipped it (it folds up to a size limit, OptimizeOptions.fold_size_limit).",
    ),
    # --- uses
    _hint(
        r"has another user|has \d+ uses, pattern wants one|produces a graph output|is still used",
        "an intermediate value is also used outside the pattern, so fusing would have to compute it twice; "
        "the rule leaves it alone.",
    ),
    # --- types and precision
    _hint(r"with --precision", "the fused kernel would run in a different precision than its neighbours; see --keep-fp32 in docs/precision.md."),
    _hint(r"has dtype .*pattern wants|dtypes differ| is (?:f|bf|i|u)\d+, the ", "the rule covers other element types; the tensors here are of another type."),
    # --- target and opset
    _hint(
        r"target \S+ has no|target \S+ cannot run|the kernel's activations are|the CUDA \w+ kernel",
        "the target has no kernel for the fused op in this form; another --target (onnx, ort-cpu, ort-cuda) may take it.",
    ),
    _hint(
        r"opset is \d+",
        "the model's opset is too old for the op this rule emits; convert it (onnx.version_converter) or export with a newer opset.",
    ),
    # --- structure (the most frequent, least specific: last)
    _hint(
        r"got graphopt\.|got com\.microsoft\.",
        "an earlier rewrite already fused this node into a larger op; rules with a higher benefit are tried first.",
    ),
    _hint(
        r"attribute \w+ = .*pattern wants",
        "the node's attribute has a value this rule does not cover (a sibling rule may cover it: see `graphopt patterns`).",
    ),
)


def hint_for(reason: str) -> str | None:
    """The first hint whose pattern occurs in `reason`, else None."""
    for hint in HINTS:
        if hint.pattern.search(reason):
            return hint.text
    return None


# "target onnx has no lowering for graphopt.FusedConv": the rule matched, and the target
# lacks the op it would emit. The same words at every site of a model: one line says it.
_TARGET_GAP = re.compile(r"target (\S+) has no (?:lowering for|kernel for) (\S+)")


def target_gap(reason: str) -> tuple[str, str] | None:
    """(target, op) when the only reason is that the target lacks the op; else None."""
    found = _TARGET_GAP.fullmatch(reason.strip())
    return (found.group(1), found.group(2)) if found else None


def summarize_target_gaps(misses: list[tuple[str, str]]) -> list[str]:
    """One line per distinct reason, for misses (rule, reason) whose reason is a target gap."""
    by_reason: dict[str, dict[str, int]] = {}
    for rule, reason in misses:
        if target_gap(reason) is not None:
            rules = by_reason.setdefault(reason.strip(), {})
            rules[rule] = rules.get(rule, 0) + 1
    lines = []
    for reason, rules in by_reason.items():
        target, op = target_gap(reason) or ("", "")
        count = sum(rules.values())
        which = ", ".join(f"{rule} ×{n}" for rule, n in sorted(rules.items(), key=lambda item: (-item[1], item[0])))
        lines.append(f"{count} {'match' if count == 1 else 'matches'} not applied, {reason} ({which}): {_where_it_runs(target, op)}.")
    return lines


_ONNX_TARGETS = ("onnx", "ort-cpu", "ort-cuda")


def _where_it_runs(target: str, op: str) -> str:
    """Which other --target lowers a graphopt op, as its declaration says (graphopt/ops/fused_ops.py)."""
    domain, _, name = op.rpartition(".")
    declared = spec(domain, name) if domain == GRAPHOPT_DOMAIN and target in _ONNX_TARGETS else None
    if declared is None:
        return f"another --target ({', '.join(t for t in _ONNX_TARGETS if t != target)}) may take them"
    others = [t for t in _ONNX_TARGETS if t in declared.lowerings and t != target]
    if not others:
        return f"no other --target lowers {op}" + ("" if declared.lowerings else " (it runs on torch.compile only)")
    return f"--target {' or '.join(others)} {'lowers' if len(others) == 1 else 'lower'} {op}"
