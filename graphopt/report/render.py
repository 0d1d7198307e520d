"""Renderings of a `Report`: JSON (schema in docs/report-schema.md) and a terminal summary."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from graphopt.errors import escape_markup as escape  # control characters escaped too
from graphopt.paths import short_name
from graphopt.report.hints import summarize_target_gaps, target_gap

if TYPE_CHECKING:  # the model's __str__ renders with this module: no import back at run time
    from graphopt.report.model import NearMiss, Report

__all__ = ["report_to_json", "write_json", "print_summary", "render_summary", "open_near_misses", "MAX_NEAR_MISS_ROWS"]

#: Near-miss rows shown in the terminal, in all and per rule (the JSON keeps all of them).
MAX_NEAR_MISS_ROWS = 10
MAX_NEAR_MISSES_PER_RULE = 3


def report_to_json(report: Report) -> str:
    return json.dumps(_finite(report.to_dict()), indent=2, allow_nan=False, default=_fallback) + "\n"


def _finite(obj: Any) -> Any:
    # JSON has no NaN or infinity; a non-finite number becomes null rather than invalid JSON.
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _fallback(obj: Any) -> Any:
    # numpy scalars and sets can slip into free-form fields; anything else is a bug.
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def write_json(report: Report, path: str | os.PathLike[str]) -> None:
    """Write the report as JSON atomically: a reader never sees half a file."""
    write_text_atomically(report_to_json(report), path)  # rendered first: a bug leaves nothing behind


def write_text_atomically(text: str, path: str | os.PathLike[str]) -> None:
    """Write `text` to a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, staged = tempfile.mkstemp(prefix=f".{short_name(path.name)}.", suffix=".tmp", dir=folder)  # fits where NAME fits
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private (0600); a report is an ordinary file
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(staged, path)
    except BaseException:
        try:
            os.unlink(staged)
        except OSError:
            pass
        raise


def _umask() -> int:
    # The only portable way to read the umask is to set it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


#: Above this many decisions, the terminal shows one row per (kind, choice, basis).
MAX_DECISION_ROWS = 8
#: Nodes kept in fp32 for want of a low-type kernel, listed one per line (the JSON report has all).
MAX_KERNEL_KEEP_ROWS = 20
#: The decisions that keep nodes in float32 for speed (precision_conversion.kept_for_speed).
SPEED_KINDS = ("precision", "recurrent_precision")


def _decision_ms(ms: float | None) -> str:
    return "?" if ms is None else f"{ms:.3g}"


def open_near_misses(report: Report) -> tuple[list[NearMiss], list[tuple[str, str]]]:
    """(rows, gaps): the near-misses worth a row, deepest first, and (rule, reason) of those
    that only say the target lacks the op (one summary line each, not rows).

    Left out: misses where the same rule applied at the same node in a later sweep (after
    constant folding or another rewrite prepared it) and repeats of a node's miss."""
    report.finalize()
    rules = [s for s in report.rules.values() if s.applications < s.attempts]
    applied_at = {(s.name, r.scope, r.matched[0] if r.matched else r.node) for s in report.rules.values() for r in s.rewrites}
    rows: list[NearMiss] = []
    gaps: list[tuple[str, str]] = []
    seen: set[tuple[str, str, str]] = set()
    for m in sorted((m for s in rules for m in s.near_misses), key=lambda m: -m.depth):
        if (m.rule, m.scope, m.node) in applied_at or (m.rule, m.node, m.reason) in seen:
            continue
        seen.add((m.rule, m.node, m.reason))
        if target_gap(m.reason) is not None:
            gaps.append((m.rule, m.reason))
        else:
            rows.append(m)
    return rows, gaps


def print_summary(report: Report, console: Console, *, json_report: str | os.PathLike[str] | None = None) -> None:
    """Nodes before/after by op, the rules that applied, near-misses, warnings, verification, times.

    `json_report`: where the JSON report was written, if it was (the near-miss table points to it)."""
    before = report.before.ops if report.before else {}
    after = report.after.ops if report.after else {}
    nodes = Table(title="Nodes by op type", title_justify="left")
    nodes.add_column("op")
    nodes.add_column("before", justify="right")
    nodes.add_column("after", justify="right")
    nodes.add_column("change", justify="right")
    changed = sorted(
        (op for op in {*before, *after} if before.get(op, 0) != after.get(op, 0)),
        key=lambda op: (-abs(after.get(op, 0) - before.get(op, 0)), op),
    )
    for op in changed:
        b, a = before.get(op, 0), after.get(op, 0)
        nodes.add_row(escape(op), str(b), str(a), f"{a - b:+d}")
    total_b = report.before.nodes if report.before else 0
    total_a = report.after.nodes if report.after else 0
    nodes.add_row("[bold]total[/]", str(total_b), str(total_a), f"{total_a - total_b:+d}", end_section=True)
    if report.before and report.after:
        ib, ia = report.before.initializers, report.after.initializers
        nodes.add_row("initializers", str(ib), str(ia), f"{ia - ib:+d}")
    console.print(nodes)

    rules = sorted(report.rules.values(), key=lambda s: (-s.applications, -s.matches, s.name))
    applied = [s for s in rules if s.applications]
    tried = sum(1 for s in rules if s.attempts)
    if applied:
        table = Table(title="Rewrites by rule", title_justify="left")
        table.add_column("rule")
        table.add_column("applied", justify="right")
        table.add_column("matched", justify="right")
        table.add_column("attempts", justify="right")
        table.add_column("time ms", justify="right")
        for s in applied:
            table.add_row(escape(s.name), str(s.applications), str(s.matches), str(s.attempts), _ms(s.time_s))
        table.add_row(
            "[bold]total[/]",
            str(report.total_rewrites),
            str(sum(s.matches for s in applied)),
            str(sum(s.attempts for s in applied)),
            _ms(sum(s.time_s for s in applied)),
            end_section=True,
        )
        others = tried - sum(1 for s in applied if s.attempts)
        if others:
            table.caption = f"{others} other rules were tried and did not apply (time {_ms(sum(s.time_s for s in rules if not s.applications))} ms)"
        console.print(table)
    elif tried:
        console.print(f"No rule applied ({tried} rules were tried).")
    else:
        console.print("No rule was tried: no node has an op that a rule starts from.")

    misses, gaps = open_near_misses(report)
    for line in summarize_target_gaps(gaps):
        console.print(escape(line), highlight=False)
    # A few rows per rule keep one rule tried at many nodes from crowding out the rest.
    per_rule = Counter[str]()
    shown = [m for m in misses if per_rule.update([m.rule]) or per_rule[m.rule] <= MAX_NEAR_MISSES_PER_RULE][:MAX_NEAR_MISS_ROWS]
    if shown:
        table = Table(title="Near-misses (why a rule did not apply)", title_justify="left")
        table.add_column("rule")
        table.add_column("node")
        table.add_column("failed check")
        for m in shown:
            where = m.node if not m.failed_at or m.failed_at == m.node else f"{m.node} (at {m.failed_at})"
            table.add_row(escape(m.rule), escape(where), escape(m.reason))
        console.print(table)
        if len(misses) > len(shown):
            more = len(misses) - len(shown)
            line = f"{more} more near-misses in {json_report}" if json_report else f"{more} more near-misses: --report FILE.json lists them all"
            console.print(escape(line), highlight=False)

    if report.input_shapes:
        given = ", ".join(f"{name}={','.join(map(str, dims))}" for name, dims in report.input_shapes.get("inputs", {}).items())
        symbols = ", ".join(f"{name}={size}" for name, size in report.input_shapes.get("symbols", {}).items())
        console.print(escape(f"input shapes fixed: {given}" + (f" (symbolic dims {symbols})" if symbols else "")), highlight=False)

    conversion = report.precision_conversion
    if conversion is not None:
        kept = ", ".join(f"{reason} {count}" for reason, count in conversion.kept.items()) or "none"
        console.print(
            f"precision {escape(conversion.precision)}: {conversion.nodes_converted} nodes converted, {conversion.nodes_kept} kept in fp32"
            f" ({escape(kept)}), {conversion.casts_inserted} casts inserted, {conversion.casts_removed} removed,"
            f" {conversion.constants_converted + conversion.constants_copied} constants converted",
            highlight=False,
        )

        for keep in conversion.kept_for_range:
            size = f"max |value| {keep.max_abs:.3g}" if keep.max_abs is not None else "value not measured"
            console.print(f"  kept in fp32: {escape(keep.node)} ({escape(keep.op)}): {keep.reason}, {size}", highlight=False)
        for keep in conversion.kept_for_kernel[:MAX_KERNEL_KEEP_ROWS]:
            console.print(f"  kept in fp32: {escape(keep.node)} ({escape(keep.op)}): {escape(keep.detail or keep.reason)}", highlight=False)
        if len(conversion.kept_for_kernel) > MAX_KERNEL_KEEP_ROWS:
            more = len(conversion.kept_for_kernel) - MAX_KERNEL_KEEP_ROWS
            console.print(f"  {more} more kept in fp32 for want of a kernel: --report FILE.json lists them all", highlight=False)
        if conversion.calibration:
            console.print(f"  range check: {escape(conversion.calibration)}", highlight=False)
        if conversion.kept_for_speed:
            kept_names = ", ".join(conversion.kept_for_speed[:6]) + (f" and {len(conversion.kept_for_speed) - 6} more" if len(conversion.kept_for_speed) > 6 else "")
            kinds = [d.kind for d in report.decisions if d.kind in SPEED_KINDS and d.chosen == "fp32"] or ["precision"]
            which = f"decision{'s' if len(kinds) > 1 else ''} {', '.join(repr(k) for k in kinds)}"
            console.print(f"  kept in fp32 for speed ({which}): {len(conversion.kept_for_speed)} nodes: {escape(kept_names)}", highlight=False)

    if report.weight_quantization is not None:
        _print_weights(report.weight_quantization, console)

    if report.decisions:
        # One row per decision; many alike (a FusedConv decision per node) share one row with a count.
        groups: dict[tuple[str, str, str], list[Any]] = {}
        for d in report.decisions:
            groups.setdefault((d.kind, d.chosen, d.basis), []).append(d)
        rows = [[d] for d in report.decisions] if len(report.decisions) <= MAX_DECISION_ROWS else list(groups.values())
        table = Table(title="Decisions (graphopt.decisions)", title_justify="left")
        table.add_column("decision")
        table.add_column("site")
        table.add_column("chosen")
        table.add_column("candidates: predicted / measured ms")
        table.add_column("why")
        for same in rows:
            d = same[0]
            site = d.site if len(same) == 1 else f"{len(same)} sites, e.g. {d.site}"
            times = ", ".join(f"{escape(a.candidate)} {_decision_ms(a.predicted_ms)} / {_decision_ms(a.measured_ms)}" for a in d.alternatives)
            table.add_row(escape(d.kind), escape(site), f"{escape(d.chosen)} [dim]({escape(d.basis)})[/]", times, escape(d.reason))
        console.print(table)

    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)

    v = report.verification
    if v is not None:
        status = "[green]passed[/]" if v.passed else "[red]FAILED[/]"
        console.print(f"verification: {status} ({escape(v.message)})", highlight=False)
        if v.caveat:
            console.print(f"[yellow]verification caveat:[/] {escape(v.caveat)}", highlight=False)

    times = ", ".join(f"{name} {_ms(t)} ms" for name, t in report.times_s.items())
    if times:
        console.print(f"time: {times}", highlight=False)


#: Kept layers named in the terminal summary (the JSON report lists every layer).
MAX_WEIGHT_KEEP_ROWS = 8


def _print_weights(summary: Any, console: Console) -> None:
    """`weights int4 (block 32): 41 of 44 MatMuls, 3 kept: ...`, then one row per kept layer and, where
    the form is chosen per layer (torch), one per quantized layer with its form and SNR."""
    layers = summary.layers
    ops = {layer.op for layer in layers}
    what = "MatMuls" if ops <= {"MatMul"} else "MatMul/Gemm layers" if ops <= {"MatMul", "Gemm"} else "matmuls"
    size = f" ({summary.bytes_before / 2**20:.1f} -> {summary.bytes_after / 2**20:.1f} MiB)" if summary.quantized else ""
    block = "per-row scales" if summary.block_size == 0 else f"block {summary.block_size}"
    console.print(
        f"weights {summary.weights} ({block}, {'symmetric' if summary.symmetric else 'zero points'}, {summary.form}): "
        f"{summary.quantized} of {len(layers)} {what}{size}, {summary.kept} kept{':' if summary.kept else ''}",
        highlight=False,
    )
    kept = [layer for layer in layers if not layer.quantized]
    for layer in kept[:MAX_WEIGHT_KEEP_ROWS]:
        why = {"keep_list": "--weights-keep", "lm_head": "LM head (default block list)", "no_kernel": "no kernel on the target for its type",
               "speed_decision": "predicted no faster quantized (decision weights)",
               "speed_measured": "measured slower quantized"}.get(layer.reason, layer.reason)
        if layer.detail and (layer.reason in ("keep_list", "lm_head") or layer.snr_db is None):
            why = layer.detail
        if layer.snr_db is not None and layer.reason in ("budget", "speed_measured"):
            why = f"SNR {layer.snr_db:.1f} dB < {summary.min_snr_db:g} dB" if layer.reason == "budget" else f"{why} (SNR {layer.snr_db:.1f} dB)"
        console.print(f"  kept: {escape(layer.node)} ({layer.op} {layer.k}x{layer.n}): {escape(why)}", highlight=False)
    if len(kept) > MAX_WEIGHT_KEEP_ROWS:
        console.print(f"  {len(kept) - MAX_WEIGHT_KEEP_ROWS} more kept: --report FILE.json lists them all", highlight=False)
    per_layer = [layer for layer in layers if layer.quantized and layer.layer_form]
    for layer in per_layer[:MAX_WEIGHT_KEEP_ROWS]:
        snr = f", SNR {layer.snr_db:.1f} dB" if layer.snr_db is not None else ""
        console.print(f"  {summary.weights}: {escape(layer.node)} ({layer.op} {layer.k}x{layer.n}): {layer.layer_form}{snr}", highlight=False)
    if len(per_layer) > MAX_WEIGHT_KEEP_ROWS:
        forms = ", ".join(f"{form} {count}" for form, count in sorted(Counter(layer.layer_form for layer in per_layer).items()))
        console.print(f"  {len(per_layer) - MAX_WEIGHT_KEEP_ROWS} more quantized (forms: {forms}): the JSON report lists them all", highlight=False)
    measured = [layer.snr_db for layer in layers if layer.quantized and layer.snr_db is not None]
    if measured:
        console.print(f"  output SNR of the quantized layers (random inputs): min {min(measured):.1f} dB, median {sorted(measured)[len(measured) // 2]:.1f} dB",
                      highlight=False)


def render_summary(report: Report, width: int = 100) -> str:
    """The terminal summary as plain text (what `print(report)` shows)."""
    import io

    buffer = io.StringIO()
    print_summary(report, Console(file=buffer, width=width, force_terminal=False, no_color=True, highlight=False))
    return buffer.getvalue().rstrip("\n")
