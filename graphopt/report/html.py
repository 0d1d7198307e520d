"""The rewrite report as one self-contained HTML page.

    graphopt optimize M.onnx -o O.onnx --report report.html
    graphopt report report.json -o report.html

The page is rendered from the report's JSON form (docs/report-schema.md), so both
commands give the same page. It has a summary (model, target, nodes, parameters and
op histogram before and after, verification, latency, times), a table of the rules,
every rewrite with the matched subgraph before and its replacement after (laid out
in Python, drawing.py: no system tool needed), the near-misses with a hint where one is known, and a filter by
rule, op type or node name. Everything is inline (CSS, a little vanilla JS, SVG):
the page fetches nothing and opens offline.

Size stays bounded on deep models: drawings show op types and value types, not
names, so the same rewrite in every layer gives one drawing, kept once in a
<template> and copied into a rewrite when it is opened.

Reading a JSON report back and checking it is graphopt.report.document's job; the
page's style sheet and script are in graphopt.report.html_assets.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from graphopt.library import display_source
from graphopt.report.document import check_document
from graphopt.report.drawing import format_type, snapshot_to_svg
from graphopt.report.hints import hint_for, summarize_target_gaps, target_gap
from graphopt.report.html_assets import _CSS, _JS
from graphopt.report.model import MAX_LOCATIONS, Report

__all__ = ["render_html", "write_html"]

#: Near-misses at this depth or less (the failure came at the root or its first operand)
#: are hidden until asked for: on a large model they are mostly "expected Mul, got Add".
SHALLOW_DEPTH = 1
_SUMMARY_TIMING = ' elementtiming="summary"'


# ------------------------------------------------------------------ output


def write_html(report: Report | Mapping[str, Any], path: str | os.PathLike[str], *, drawings: bool = True) -> None:
    """Render the report (a Report, or its JSON form) and write it atomically."""
    from graphopt.report.render import write_text_atomically

    write_text_atomically(render_html(report, drawings=drawings), path)  # rendered first: a failure leaves nothing behind


def render_html(report: Report | Mapping[str, Any], *, drawings: bool = True) -> str:
    """The page as a string (`drawings=False`: no pictures, a smaller page)."""
    if isinstance(report, Report):
        from graphopt.report.render import report_to_json

        document: Mapping[str, Any] = json.loads(report_to_json(report))  # exactly what the JSON file holds
    else:
        document = report
    check_document(document)
    return _Page(document, drawings).render()


# ------------------------------------------------------------------ reading helpers
# The document may come from an older graphopt or a hand-edited file: fields are read
# with a default instead of trusted.


def _fmt_ms(ms: Any) -> str:
    return f"{ms:.3g} ms" if isinstance(ms, (int, float)) else "?"


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _get(obj: Any, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:  # JSON true is not the number 1
        return default
    return value if isinstance(value, kinds) else default


def _int(obj: Any, key: str) -> int:
    return int(_get(obj, key, (int, float), 0))


def _str(obj: Any, key: str) -> str:
    return str(_get(obj, key, str, ""))


def _list(obj: Any, key: str) -> list[Any]:
    return list(_get(obj, key, list, []))


def _dict(obj: Any, key: str) -> dict[str, Any]:
    return dict(_get(obj, key, dict, {}))


def _with_code(text: str) -> str:
    """Escaped text with `quoted` commands set as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


def _count(n: int) -> str:
    return f"{n:,}"


def _short_count(n: int) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= limit:
            return f"{n / limit:.1f} {suffix}"
    return str(n)


def _seconds(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "–"
    return f"{t * 1000:.1f} ms" if t < 1 else f"{t:.2f} s"


def _change(before: int, after: int) -> str:
    if not before:
        return ""
    pct = (after - before) / before * 100
    return f"{pct:+.0f}%"


# ------------------------------------------------------------------ drawings


class _Drawings:
    """Distinct drawings, each kept once in one <template>."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.ids: dict[str, str] = {}  # SVG text -> template id

    def add(self, snapshot: Any, kind: str) -> str | None:
        if not self.enabled or not isinstance(snapshot, dict) or not (snapshot.get("nodes") or snapshot.get("edges")):
            return None
        svg = snapshot_to_svg(snapshot, kind)
        return self.ids.setdefault(svg, f"g{len(self.ids)}") if svg else None

    def templates(self) -> str:
        return "".join(f'<template id="{tid}">{svg}</template>' for svg, tid in self.ids.items())


# ------------------------------------------------------------------ the page


class _Page:
    def __init__(self, document: Mapping[str, Any], drawings: bool) -> None:
        self.doc = document
        self.rules = [r for r in _list(document, "rules") if isinstance(r, dict)]
        # At most MAX_LOCATIONS entries per rule, so a huge model still gives a page a browser opens.
        self.rewrites = sorted(
            (rw for rule in self.rules for rw in _list(rule, "rewrites")[:MAX_LOCATIONS] if isinstance(rw, dict)),
            key=lambda rw: _int(rw, "index"),
        )
        self.drawings = _Drawings(drawings)

    def render(self) -> str:
        model = _str(self.doc, "input_path")
        title = f"graphopt report: {Path(model).name}" if model else "graphopt report"
        rewrites = self._rewrites()  # first: collects the drawings
        templates = self.drawings.templates()
        body = "".join(
            [
                self._header(title),
                self._summary(),
                self._op_histogram(),
                self._rules(),
                rewrites,
                self._near_misses(),
                self._passes(),
                f'<footer>graphopt {_e(_str(_dict(self.doc, "tool"), "version"))} · report schema '
                f'{_e(self.doc.get("schema"))} v{_e(self.doc.get("version"))}</footer>',
            ]
        )
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n"
            f'<body><main>{body}</main>\n<div hidden id="drawings">{templates}</div>\n<script>{_JS}</script></body></html>\n'
        )

    def _lowered(self, op: str) -> str:
        """A rewrite inserts graphopt.X; the model (and the op table) has what the target lowers it to."""
        domain, _, op_type = op.rpartition(".")
        if domain != "graphopt":
            return op
        from graphopt.ops.targets import TARGETS

        target = TARGETS.get(_str(self.doc, "target"))
        low = target.lowering(op_type) if target is not None else None
        if low is None:
            return op
        return f"{low.domain}.{low.op_type}" if low.domain else low.op_type

    # ---------------------------------------------------------- sections
    def _header(self, title: str) -> str:
        doc = self.doc
        model, output = _str(doc, "input_path"), _str(doc, "output_path")
        facts = [
            ("model", model or "(in memory)"),
            ("written to", output or "(not written)"),
            ("target", _str(doc, "target") or "?"),
            ("precision", _str(doc, "precision") or "unchanged"),
        ]
        items = "".join(f"<span><b>{_e(k)}</b> {_e(v)}</span>" for k, v in facts)
        return f'<header><h1>{_e(title)}</h1><p class="facts">{items}</p></header>'

    def _summary(self) -> str:
        doc = self.doc
        before, after = _dict(doc, "before"), _dict(doc, "after")
        cards = [
            ("rewrites", _count(_int(doc, "total_rewrites")), f"by {sum(1 for r in self.rules if _int(r, 'applications'))} rules"),
            ("nodes", f"{_count(_int(before, 'nodes'))} → {_count(_int(after, 'nodes'))}", _change(_int(before, "nodes"), _int(after, "nodes"))),
            (
                "parameters",
                f"{_short_count(_int(before, 'parameters'))} → {_short_count(_int(after, 'parameters'))}"
                if "parameters" in before or "parameters" in after
                else "–",
                f"{_count(_int(before, 'initializers'))} → {_count(_int(after, 'initializers'))} initializers",
            ),
        ]
        times = _dict(doc, "times_s")
        # "rules" is part of "optimize"; the other steps follow one another.
        total = sum(v for k, v in times.items() if isinstance(v, (int, float)) and k != "rules")
        cards.append(("time", _seconds(total), ", ".join(f"{k} {_seconds(v)}" for k, v in times.items())))
        verification = doc.get("verification")
        if isinstance(verification, dict):
            passed = verification.get("passed") is True
            cards.append(("verification", "passed" if passed else "FAILED", _str(verification, "message")))
        else:
            cards.append(("verification", "not run", "pass --verify to compare outputs"))
        cards.append(self._latency_card())
        sweeps = _int(doc, "sweeps")
        cards.append(("sweeps", str(sweeps), "limit reached: not a fixpoint" if doc.get("limit_reached") else "fixpoint reached"))
        # elementtiming: browsers can report when the summary was first painted (benchmarks/report_html.py).
        html = "".join(
            f'<div class="card" data-card="{_e(name)}"><div class="k">{_e(name)}</div>'
            f'<div class="v"{_SUMMARY_TIMING if i == 0 else ""}>{_e(value)}</div><div class="d">{_e(detail)}</div></div>'
            for i, (name, value, detail) in enumerate(cards)
        )
        warnings = "".join(f"<li>{_e(w)}</li>" for w in _list(doc, "warnings"))
        warn_html = f'<ul class="warnings">{warnings}</ul>' if warnings else ""
        return f'<section id="summary"><h2>Summary</h2><div class="cards">{html}</div>{warn_html}{self._extras()}</section>'

    def _latency_card(self) -> tuple[str, str, str]:
        latency = self.doc.get("latency")
        if not isinstance(latency, dict):
            return ("latency", "not measured", "")
        b, a = latency.get("before_ms"), latency.get("after_ms")
        fmt = lambda ms: f"{ms:.2f} ms" if isinstance(ms, (int, float)) else "?"  # noqa: E731
        speedup = f"{b / a:.2f}× faster" if isinstance(b, (int, float)) and isinstance(a, (int, float)) and a > 0 else ""
        where = _str(latency, "provider")
        detail = " · ".join(x for x in (speedup, where, f"{_int(latency, 'runs')} runs" if _int(latency, "runs") else "") if x)
        return ("latency", f"{fmt(b)} → {fmt(a)}", detail)

    def _extras(self) -> str:
        """One line each for fixed input shapes, the layout pass and the precision conversion, when they apply."""
        lines = []
        fixed = self.doc.get("input_shapes")
        if isinstance(fixed, dict):
            given = ", ".join(f"{name}={','.join(map(str, dims))}" for name, dims in _dict(fixed, "inputs").items() if isinstance(dims, list))
            symbols = ", ".join(f"{name}={size}" for name, size in _dict(fixed, "symbols").items())
            lines.append(f"input shapes fixed: {given}" + (f" (symbolic dims {symbols})" if symbols else ""))
        layout = self.doc.get("layout")
        if isinstance(layout, dict):
            converted = ", ".join(f"{op} {n}" for op, n in _dict(layout, "converted").items()) or "none"
            lines.append(
                f"layout {_str(layout, 'mode')}: converted {converted}; transposes inserted {_int(layout, 'transposes_inserted')}, "
                f"cancelled {_int(layout, 'transposes_cancelled')}, left {_int(layout, 'transposes')}"
            )
        conversion = self.doc.get("precision_conversion")
        if isinstance(conversion, dict):
            kept = ", ".join(f"{k} {v}" for k, v in _dict(conversion, "kept").items()) or "none"
            lines.append(
                f"precision {_str(conversion, 'precision')}: {_int(conversion, 'nodes_converted')} nodes converted, "
                f"{_int(conversion, 'nodes_kept')} kept in fp32 ({kept}), {_int(conversion, 'casts_inserted')} casts inserted"
            )
            for keep in conversion.get("kept_for_range") or []:
                if isinstance(keep, dict):
                    size = keep.get("max_abs")
                    shown = f"max |value| {size:.3g}" if isinstance(size, (int, float)) else "value not measured"
                    lines.append(f"kept in fp32: {_str(keep, 'node')} ({_str(keep, 'op')}): {_str(keep, 'reason')}, {shown}")
            speed = [str(name) for name in conversion.get("kept_for_speed") or []]
            if speed:
                more = f" and {len(speed) - 12} more" if len(speed) > 12 else ""
                kinds = [str(d.get("kind")) for d in self.doc.get("decisions") or []
                         if isinstance(d, dict) and d.get("kind") in ("precision", "recurrent_precision") and d.get("chosen") == "fp32"]
                which = f"decision{'s' if len(kinds) > 1 else ''} {', '.join(kinds or ['precision'])}"
                lines.append(f"kept in fp32 for speed ({which}): {len(speed)} nodes: {', '.join(speed[:12])}{more}")
            for keep in conversion.get("kept_for_kernel") or []:
                if isinstance(keep, dict):
                    lines.append(f"kept in fp32: {_str(keep, 'node')} ({_str(keep, 'op')}): {_str(keep, 'detail') or _str(keep, 'reason')}")
        weights = self.doc.get("weight_quantization")
        if isinstance(weights, dict):
            layers = [layer for layer in weights.get("layers") or [] if isinstance(layer, dict)]
            lines.append(
                f"weights {_str(weights, 'weights')} (block {_int(weights, 'block_size')}, {_str(weights, 'form')}): "
                f"{_int(weights, 'quantized')} of {len(layers)} layers quantized, {_int(weights, 'kept')} kept"
            )
            for layer in layers:
                snr = layer.get("snr_db")
                shown = f", SNR {snr:.1f} dB" if isinstance(snr, (int, float)) else ""
                if not layer.get("quantized"):
                    lines.append(f"weights kept: {_str(layer, 'node')} ({_str(layer, 'op')}): {_str(layer, 'reason')}{shown}")
                elif layer.get("layer_form"):  # the torch path: each layer's form
                    lines.append(f"weights {_str(weights, 'weights')}: {_str(layer, 'node')} ({_str(layer, 'op')}): {_str(layer, 'layer_form')}{shown}")
        for decision in self.doc.get("decisions") or []:
            if isinstance(decision, dict):
                times = ", ".join(
                    f"{_str(a, 'candidate')} {_fmt_ms(a.get('predicted_ms'))} predicted / {_fmt_ms(a.get('measured_ms'))} measured"
                    for a in decision.get("alternatives") or [] if isinstance(a, dict)
                )
                lines.append(
                    f"decision {_str(decision, 'kind')} at {_str(decision, 'site')}: {_str(decision, 'chosen')} "
                    f"({_str(decision, 'basis')}; {_str(decision, 'reason')}) — {times}"
                )
        verification = self.doc.get("verification")
        if isinstance(verification, dict) and verification.get("caveat"):
            lines.append(f"verification caveat: {_str(verification, 'caveat')}")
        return "".join(f'<p class="extra">{_e(line)}</p>' for line in lines)

    def _op_histogram(self) -> str:
        before = _dict(_dict(self.doc, "before"), "ops")
        after = _dict(_dict(self.doc, "after"), "ops")
        ops = {*before, *after}
        if not ops:
            return ""

        def n(counts: dict[str, Any], op: str) -> int:
            value = counts.get(op, 0)
            return int(value) if isinstance(value, (int, float)) else 0

        order = sorted(ops, key=lambda op: (n(before, op) == n(after, op), -abs(n(after, op) - n(before, op)), -max(n(before, op), n(after, op)), op))
        peak = max(max(n(before, op), n(after, op)) for op in ops) or 1
        rows = []
        for op in order:
            b, a = n(before, op), n(after, op)
            delta = a - b
            cls = "changed" if delta else "same"
            rows.append(
                f'<tr class="{cls}" data-search="{_e(op.lower())}"><td class="op">{_e(op)}</td><td class="num">{b}</td><td class="num">{a}</td>'
                f'<td class="num {"neg" if delta < 0 else "pos" if delta > 0 else ""}">{f"{delta:+d}" if delta else ""}</td>'
                f'<td class="bars"><span class="bar b" style="width:{b / peak * 100:.1f}%"></span>'
                f'<span class="bar a" style="width:{a / peak * 100:.1f}%"></span></td></tr>'
            )
        changed = sum(1 for op in ops if n(before, op) != n(after, op))
        return (
            '<section id="ops"><h2>Ops before and after</h2>'
            f'<p class="muted">{changed} op types changed, {len(ops) - changed} unchanged. '
            '<span class="legend"><span class="bar b"></span> before <span class="bar a"></span> after</span></p>'
            '<table class="ops"><thead><tr><th>op</th><th>before</th><th>after</th><th>change</th><th></th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></section>'
        )

    def _rules(self) -> str:
        tried = [r for r in self.rules if _int(r, "attempts") or _int(r, "applications")]
        tried.sort(key=lambda r: (-_int(r, "applications"), -_int(r, "matches"), -_int(r, "attempts"), _str(r, "name")))
        untried = sorted(_str(r, "name") for r in self.rules if r not in tried)
        rows = []
        for r in tried:
            name = _str(r, "name")
            time_s = r.get("time_s")
            # Found by its name and by the ops it rewrote and inserted.
            ops = {_str(rw, "op") for rw in _list(r, "rewrites")} | {str(a) for rw in _list(r, "rewrites") for a in _list(rw, "added")}
            search = " ".join([name, *sorted(ops)]).lower()
            rows.append(
                f'<tr class="rule-row" data-rule="{_e(name)}" data-search="{_e(search)}">'
                f'<td><a href="#rewrites" class="rule-link" data-rule="{_e(name)}">{_e(name)}</a>'
                f'<div class="doc">{_e(_str(r, "doc"))}</div></td>'
                f'<td class="num">{_int(r, "applications")}</td><td class="num">{_int(r, "matches")}</td>'
                f'<td class="num">{_int(r, "attempts")}</td><td class="num">{_e(_seconds(time_s))}</td>'
                f'<td class="src"><code>{_e(display_source(_str(r, "source")))}</code></td></tr>'
            )
        more = (
            f'<details class="untried"><summary>{len(untried)} more rules loaded but never tried (no node has their root op)</summary>'
            f'<p>{_e(", ".join(untried))}</p></details>'
            if untried
            else ""
        )
        return (
            '<section id="rules"><h2>Rules</h2>'
            '<table class="rules"><thead><tr><th>rule</th><th>applied</th><th>matched</th><th>attempts</th><th>time</th><th>source</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>{more}</section>'
        )

    def _rewrites(self) -> str:
        applied = sorted({_str(rw, "rule") for rw in self.rewrites})
        options = "".join(f'<option value="{_e(name)}">{_e(name)}</option>' for name in applied)
        rows = "".join(self._rewrite(rw) for rw in self.rewrites)
        total = _int(self.doc, "total_rewrites")
        kept_note = f"{total - len(self.rewrites)} more rewrites applied but not listed." if total > len(self.rewrites) else ""
        return (
            '<section id="rewrites"><h2>Rewrites</h2>'
            '<div class="controls">'
            '<input id="filter" type="search" placeholder="Filter by rule, op type or node name" aria-label="filter">'
            f'<select id="rule-filter" aria-label="rule"><option value="">all rules</option>{options}</select>'
            '<button type="button" id="expand">expand shown</button><button type="button" id="collapse">collapse all</button>'
            f'<span id="shown">{len(self.rewrites)} of {len(self.rewrites)} rewrites</span></div>'
            f"{'<p class=muted>' + _e(kept_note) + '</p>' if kept_note else ''}"
            f'<div id="rewrite-list">{rows or "<p class=muted>No rewrite applied.</p>"}</div></section>'
        )

    def _rewrite(self, rw: dict[str, Any]) -> str:
        rule, node, scope, op = _str(rw, "rule"), _str(rw, "node"), _str(rw, "scope") or "main", _str(rw, "op")
        added = [self._lowered(str(a)) for a in _list(rw, "added")]
        before, after = rw.get("before"), rw.get("after")
        matched_nodes = _list(before, "nodes") if isinstance(before, dict) else []
        matched = [(_str(m, "name"), _str(m, "op")) for m in matched_nodes if isinstance(m, dict)]
        if not matched:
            matched = [(str(name), "") for name in _list(rw, "matched")] or [(node, op)]
        search = " ".join([rule, node, scope, op, *added, *map(str, _list(rw, "added")), *(f"{n} {o}" for n, o in matched)]).lower()
        summary = (
            f'<span class="idx">#{_int(rw, "index")}</span> <span class="rule">{_e(rule)}</span> at '
            f'<span class="node">{_e(node)}</span>'
            + (f' <span class="scope">in {_e(scope)}</span>' if scope != "main" else "")
            + f' <span class="delta">−{_int(rw, "removed")} nodes, + {_e(", ".join(added) or "nothing")}</span>'
        )
        where = "".join(f"<li><code>{_e(name)}</code> <span class=\"opname\">{_e(o)}</span></li>" for name, o in matched)
        fused = sorted({str(a) for a in _list(rw, "added") if self._lowered(str(a)) != str(a)})
        lowered = "; ".join(f"{op} is lowered to {self._lowered(op)} for {_str(self.doc, 'target')}" for op in fused)
        caption = "after: replacement" + (f" ({lowered})" if lowered else "")
        figures = self._figure("before: matched", before, "before") + self._figure(caption, after, "after")
        return (
            f'<details class="rw" data-rule="{_e(rule)}" data-search="{_e(search)}"><summary>{summary}</summary>'
            f'<div class="rw-body"><div class="where"><b>scope</b> {_e(scope)} · <b>root</b> <code>{_e(node)}</code> ({_e(op)})'
            f'<div class="matched"><b>matched nodes</b><ol>{where}</ol></div></div>'
            f'<div class="figs">{figures}</div></div></details>'
        )

    def _figure(self, caption: str, snapshot: Any, kind: str) -> str:
        if not isinstance(snapshot, dict):
            return f'<figure class="fig"><figcaption>{_e(caption)}</figcaption><p class="muted">no snapshot recorded</p></figure>'
        template = self.drawings.add(snapshot, kind)
        drawing = f'<div class="svg" data-svg="{template}"></div>' if template else '<p class="muted">no nodes</p>'

        def legend(key: str, label: str) -> str:
            items = []
            for k, value in enumerate(_list(snapshot, key)):
                if not isinstance(value, dict):
                    continue
                tag = "const" if value.get("const") else label
                known = value.get("dtype") is not None or value.get("shape") is not None
                kind_of = format_type(value.get("dtype"), value.get("shape")) if known else ""
                items.append(f"<li><b>{tag} {k}</b> <code>{_e(_str(value, 'name'))}</code> <span class=\"ty\">{_e(kind_of)}</span></li>")
            return "".join(items)

        truncated = _int(snapshot, "truncated")
        more = f'<p class="muted">{truncated} more nodes not drawn</p>' if truncated else ""
        return (
            f'<figure class="fig {kind}"><figcaption>{_e(caption)}</figcaption>{drawing}{more}'
            f'<ul class="io">{legend("inputs", "in")}{legend("outputs", "out")}</ul></figure>'
        )

    def _near_misses(self) -> str:
        # A miss at a node where the same rule applied in a later sweep (after constant
        # folding or another rewrite prepared it) is no candidate any more: left out.
        # A miss at a node that another rule rewrote later stays (why this rule did not
        # apply still matters), saying which rewrite took the node.
        applied_at: set[tuple[str, str, str]] = set()
        taken_by: dict[tuple[str, str], str] = {}
        every = sorted((rw for rule in self.rules for rw in _list(rule, "rewrites") if isinstance(rw, dict)), key=lambda rw: _int(rw, "index"))
        for rw in every:
            matched = [str(name) for name in _list(rw, "matched")]
            if matched:
                applied_at.add((_str(rw, "rule"), _str(rw, "scope"), matched[0]))
            for name in matched:
                taken_by.setdefault((_str(rw, "scope"), name), f"{_str(rw, 'rule')} (#{_int(rw, 'index')})")
        groups, resolved, gaps = [], 0, []
        for rule in self.rules:
            misses = [m for m in _list(rule, "near_misses") if isinstance(m, dict)]
            open_misses = [m for m in misses if (_str(rule, "name"), _str(m, "scope"), _str(m, "node")) not in applied_at]
            resolved += len(misses) - len(open_misses)
            # "target T has no lowering for OP" at every site: one line above the table, no rows.
            gaps += [(_str(rule, "name"), _str(m, "reason")) for m in open_misses if target_gap(_str(m, "reason"))]
            open_misses = [m for m in open_misses if not target_gap(_str(m, "reason"))]
            if open_misses:
                groups.append((rule, open_misses))
        later = f" {resolved} misses at nodes where the rule applied in a later sweep are left out." if resolved else ""
        gap_lines = "".join(f'<p class="gap">{_e(line)}</p>' for line in summarize_target_gaps(gaps))
        if not groups:
            return f'<section id="near-misses"><h2>Near-misses</h2>{gap_lines}<p class="muted">No other rule failed part-way.{_e(later)}</p></section>'
        hints: dict[str, int] = {}  # hint text -> number: each hint is written once, rows point to it
        groups.sort(key=lambda g: (-max(_int(m, "depth") for m in g[1]), _str(g[0], "name")))
        rows = []
        for rule, misses in groups:
            name = _str(rule, "name")
            status = f"applied {_int(rule, 'applications')} of {_int(rule, 'attempts')} tries"
            for m in sorted(misses, key=lambda m: -_int(m, "depth")):
                reason, depth = _str(m, "reason"), _int(m, "depth")
                hint = hint_for(reason)
                number = hints.setdefault(hint, len(hints) + 1) if hint else 0
                node, failed_at = _str(m, "node"), _str(m, "failed_at")
                taken = taken_by.get((_str(m, "scope"), node))
                search = " ".join([name, node, _str(m, "op"), failed_at, reason]).lower()
                rows.append(
                    f'<tr class="miss{" shallow" if depth <= SHALLOW_DEPTH else ""}" data-rule="{_e(name)}" data-search="{_e(search)}">'
                    f'<td>{_e(name)}<div class="doc">{_e(status)}</div></td>'
                    f'<td><code>{_e(node)}</code> <span class="opname">{_e(_str(m, "op"))}</span>'
                    + (f'<div class="doc">failed at <code>{_e(failed_at)}</code></div>' if failed_at and failed_at != node else "")
                    + (f'<div class="doc taken">later rewritten by {_e(taken)}</div>' if taken else "")
                    + f'</td><td class="num">{depth}</td><td class="reason">{_e(reason)}</td>'
                    f'<td class="hint">{f"<a href=#hint-{number}>hint {number}</a>" if hint else ""}</td></tr>'
                )
        deep = sum(1 for _, misses in groups for m in misses if _int(m, "depth") > SHALLOW_DEPTH)
        hint_list = "".join(f'<li id="hint-{number}">{_with_code(text)}</li>' for text, number in hints.items())
        return (
            f'<section id="near-misses"><h2>Near-misses</h2>{gap_lines}'
            '<p class="muted">Where a rule got part of the way and which check stopped it, deepest first (depth: ops matched before the '
            f'failing check).{_e(later)} <label><input type="checkbox" id="shallow"> also show the {len(rows) - deep} misses at the first op</label></p>'
            '<table class="misses"><thead><tr><th>rule</th><th>node</th><th>depth</th><th>why not</th><th>hint</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>'
            + (f'<h3>Hints</h3><ol class="hints">{hint_list}</ol>' if hint_list else "")
            + "</section>"
        )

    def _passes(self) -> str:
        passes = [p for p in _list(self.doc, "passes") if isinstance(p, dict)]
        if not passes:
            return ""
        rows = "".join(
            f'<tr><td>{_e(_str(p, "name"))}</td><td class="num">{_int(p, "runs")}</td><td class="num">{_int(p, "changes")}</td>'
            f'<td class="num">{_e(_seconds(p.get("time_s")))}</td></tr>'
            for p in passes
        )
        return (
            '<section id="passes"><h2>Other passes</h2><table class="passes"><thead><tr><th>pass</th><th>runs</th><th>changes</th>'
            f"<th>time</th></tr></thead><tbody>{rows}</tbody></table></section>"
        )
