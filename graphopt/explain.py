"""`graphopt explain`: why each rule did or did not apply at each place it could have.

The optimization runs in memory exactly as `graphopt optimize` would run it (same
rules, target and precision), with an observer on the rewrite driver that hears of
every attempt; nothing is written. A *site* is a rule and a candidate node: a node
whose op is the rule's root op, in the input model or made during the run. Each site
gets one outcome:

* applied: the rewrite's index in the report, the nodes it replaced and the ops it made;
* not applied: the check that failed, the node where it failed, and a hint when one is
  known (graphopt.report.hints);
* not tried: the node was gone before the rule got to it (replaced by another rule's
  rewrite, or removed by a pass such as constant folding).

A site tried in several sweeps is shown once, with its final outcome (applied wins).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir
from rich.console import Console

from graphopt.api import OptimizeOptions, optimize, select_rules
from graphopt.errors import GraphoptError, RuleNameError
from graphopt.errors import escape_markup as escape  # control characters escaped too
from graphopt.ir.onnx_io import load_model
from graphopt.ir.onnx_view import OnnxView
from graphopt.library import display_source
from graphopt.match.driver import Attempt
from graphopt.report.hints import hint_for
from graphopt.report.model import Report

__all__ = [
    "APPLIED",
    "NOT_APPLIED",
    "NOT_TRIED",
    "Site",
    "RuleSites",
    "Explanation",
    "describe",
    "explain",
    "pin_input_shapes",
    "print_explanation",
]

APPLIED = "applied"
NOT_APPLIED = "not applied"
NOT_TRIED = "not tried"
#: Replaced nodes named in one line of output; the rest are counted.
MAX_NAMES_SHOWN = 6


@dataclass
class Site:
    """The outcome of one rule at one candidate node."""

    rule: str
    scope: str  # "main", or the path of a subgraph / function body
    node: str  # the candidate (root) node's name
    op: str
    status: str  # APPLIED, NOT_APPLIED or NOT_TRIED
    reason: str = ""  # the failing check (not applied), or why it was not tried
    failed_at: str = ""  # the node where the check failed, when it is not the root
    rewrite: int | None = None  # index of the rewrite in the report (applied)
    removed: tuple[str, ...] = ()  # nodes the rewrite replaced (applied)
    added: tuple[str, ...] = ()  # op types it inserted (applied)
    tried: tuple[str, ...] = ()  # nodes of the subgraph tried (matched up to the failure)
    attempts: int = 0  # how often the rule was tried here (sweeps retry)
    hint: str | None = None
    afterwards: str = ""  # what became of the node later, when it was not applied here

    def names(self) -> set[str]:
        """Every node this site involves, for --node."""
        return {self.node, *self.tried, *self.removed, *([self.failed_at] if self.failed_at else [])}


@dataclass
class RuleSites:
    name: str
    source: str  # file:line
    doc: str
    op: str  # root op, "domain.Op" outside the default domain
    sites: list[Site] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for site in self.sites if site.status == status)


@dataclass
class Explanation:
    rules: list[RuleSites]  # rules with at least one site (after the filters)
    idle_rules: int  # selected rules with no candidate node at all
    report: Report
    filtered: bool  # --rule or --node narrowed the output


# ------------------------------------------------------------------ run


def explain(
    model_path: str | os.PathLike[str],
    options: OptimizeOptions | None = None,
    *,
    rules: Sequence[str] = (),
    nodes: Sequence[str] = (),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Explanation:
    """Optimize `model_path` in memory and say, per rule and candidate node, what happened.

    `rules` and `nodes` narrow the answer (a node also matches the sites whose tried
    subgraph contains it); unknown names raise GraphoptError with the closest names.
    `input_shapes` pins input dims (and the symbolic dims they name) before the run."""
    options = dataclasses.replace(options or OptimizeOptions())
    selected = select_rules(options)
    _check_names("rule", rules, [r.name for r in selected])
    model = load_model(model_path)
    if input_shapes:
        pin_input_shapes(model, input_shapes)
        options.shape_inference = True  # propagate the pinned dims

    recorder = _Recorder(model, {key for r in selected for key in r.root_keys})
    options.observe = recorder.attempt
    options.progress = recorder.phase
    options.trace = False  # the observer sees every attempt; report.trace is not needed
    _, report = optimize(model, options)
    recorder.phase("end")

    _check_names("node", nodes, recorder.names)
    wanted_rules, wanted_nodes = set(rules), set(nodes)
    explained: list[RuleSites] = []
    idle = 0
    for rule in selected:
        if wanted_rules and rule.name not in wanted_rules:
            continue
        sites = recorder.sites(rule.name, rule.root_keys)
        if not sites and rule.name not in wanted_rules:
            idle += 1
            continue
        if wanted_nodes:
            sites = [s for s in sites if s.names() & wanted_nodes]
            if not sites and rule.name not in wanted_rules:
                continue
        roots = "|".join(f"{domain}.{op_type}" if domain else op_type for domain, op_type in rule.root_keys)
        explained.append(RuleSites(rule.name, str(rule.loc or ""), rule.doc, roots, sites))
    return Explanation(explained, idle, report, bool(rules or nodes))


class _Recorder:
    """Listens to the driver (attempts) and the pipeline (phases) during one run."""

    def __init__(self, model: ir.Model, root_keys: set[tuple[str, str]]) -> None:
        view = OnnxView(model)
        # The input's candidate nodes, held so their removal can be noticed (node.graph becomes None).
        self.candidates: list[tuple[str, ir.Node, str, tuple[str, str]]] = []
        self.names: set[str] = set()
        for scope in view.scopes():
            for node in scope:
                label = view.label(node)
                self.names.add(label)
                key = view.op_key(node)
                if key in root_keys:
                    self.candidates.append((view.scope_label(scope), node, label, key))
        # Per rule, per (scope, node): the final attempt, the number of attempts, and whether one applied.
        self.last: dict[str, dict[tuple[str, str], Attempt]] = {}
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.applied: dict[tuple[str, str, str], Attempt] = {}
        self.replaced_by: dict[tuple[str, str], Attempt] = {}  # (scope, node) -> the applied attempt that erased it
        self.removed_during: dict[int, str] = {}  # id(candidate) -> the phase that removed it
        self.current_phase = "loading"

    def attempt(self, attempt: Attempt) -> None:
        self.last.setdefault(attempt.rule, {})[(attempt.scope, attempt.node)] = attempt
        key = (attempt.rule, attempt.scope, attempt.node)
        self.counts[key] += 1
        if attempt.rewrite is not None:
            self.applied[key] = attempt
            for name in attempt.removed:
                self.replaced_by.setdefault((attempt.scope, name), attempt)
        self.names.update(attempt.tried)
        self.names.add(attempt.node)
        if attempt.miss is not None and attempt.miss.failed_at:
            self.names.add(attempt.miss.failed_at)

    def phase(self, message: str) -> None:
        """The pipeline moves on to `message`: candidates gone since went in the phase that ended."""
        for _, node, _, _ in self.candidates:
            if node.graph is None and id(node) not in self.removed_during:
                self.removed_during[id(node)] = self.current_phase
        self.current_phase = message

    def sites(self, rule: str, root_keys: tuple[tuple[str, str], ...]) -> list[Site]:
        found: dict[tuple[str, str], Site] = {}
        for (scope, node), attempt in self.last.get(rule, {}).items():
            key = (rule, scope, node)
            found[(scope, node)] = self._site(self.applied.get(key, attempt), self.counts[key])
        for scope, candidate, label, op_key in self.candidates:
            if op_key in root_keys and (scope, label) not in found:
                found[(scope, label)] = Site(rule, scope, label, candidate.op_type, NOT_TRIED, reason=self._fate(scope, candidate, label))
        order = {APPLIED: 0, NOT_APPLIED: 1, NOT_TRIED: 2}
        return sorted(found.values(), key=lambda s: (order[s.status], s.rewrite or 0, -len(s.tried), s.scope, s.node))

    def _site(self, attempt: Attempt, count: int) -> Site:
        site = Site(attempt.rule, attempt.scope, attempt.node, attempt.op, APPLIED, tried=attempt.tried, attempts=count)
        if attempt.rewrite is not None:
            site.rewrite = attempt.rewrite.index
            site.removed = attempt.removed
            site.added = tuple(attempt.rewrite.added)
            return site
        miss = attempt.miss
        assert miss is not None, "an attempt either applied or missed"
        site.status = NOT_APPLIED
        site.reason = miss.reason
        site.failed_at = miss.failed_at if miss.failed_at != attempt.node else ""
        site.hint = hint_for(miss.reason)
        later = self.replaced_by.get((attempt.scope, attempt.node))
        if later is not None and later.rewrite is not None:
            site.afterwards = f"later replaced by rewrite #{later.rewrite.index} ({later.rule})"
        return site

    def _fate(self, scope: str, node: ir.Node, label: str) -> str:
        """Why a candidate of the input was never tried: it was gone first."""
        erased_by = self.replaced_by.get((scope, label))
        if erased_by is not None and erased_by.rewrite is not None:
            return f"replaced by rewrite #{erased_by.rewrite.index} ({erased_by.rule}) before this rule was tried here"
        phase = self.removed_during.get(id(node))
        if phase is not None and phase.endswith(": rules"):  # the driver erases what a rewrite left unused
            return f"left unused by a rewrite in {phase.partition(':')[0]} and removed, before this rule was tried here"
        if phase is not None:
            return f"removed during '{phase}' before this rule was tried here"
        return "never reached (the rewrite limit was hit first)"


def _check_names(kind: str, given: Iterable[str], known: Iterable[str]) -> None:
    known = list(known)
    for name in given:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        if close:
            suggestion = "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
        else:
            suggestion = "see `graphopt patterns` for the rules" if kind == "rule" else "no node has a similar name"
        error = RuleNameError if kind == "rule" else GraphoptError
        raise error(f"unknown {kind} '{name}' ({suggestion})")


def pin_input_shapes(model: ir.Model, shapes: Mapping[str, Sequence[int]]) -> dict[str, dict[str, Any]]:
    """Give the named inputs these dims; every symbolic dim they name takes its size everywhere.

    Returns what was fixed, for the report: {"inputs": {name: dims}, "symbols": {dim name: size}}."""
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs if v.name and v.name not in graph.initializers}
    symbols: dict[str, int] = {}
    for name, dims in shapes.items():
        value = inputs.get(name)
        if value is None:
            raise GraphoptError(f"--input-shape names '{name}', which is not a model input (inputs: {', '.join(inputs) or 'none'})")
        shape = value.shape
        if shape is not None and len(shape) != len(dims):
            raise GraphoptError(f"--input-shape {name}: the input has rank {len(shape)}, not {len(dims)}")
        for i, (have, want) in enumerate(zip(shape or [], dims)):
            if isinstance(have, int) and have != want:
                raise GraphoptError(f"--input-shape {name}: dimension {i} is fixed at {have}, not {want}")
            if isinstance(have, ir.SymbolicDim) and have.value is not None:
                symbols.setdefault(have.value, int(want))
        value.shape = ir.Shape([int(d) for d in dims])
    values = [*graph.inputs, *graph.outputs, *(out for node in ir.traversal.RecursiveGraphIterator(graph) for out in node.outputs)]
    for value in values:
        if value.shape is not None and any(isinstance(d, ir.SymbolicDim) and d.value in symbols for d in value.shape):
            value.shape = ir.Shape([symbols.get(d.value, d) if isinstance(d, ir.SymbolicDim) and d.value else d for d in value.shape])
    return {"inputs": {name: [int(d) for d in dims] for name, dims in shapes.items()}, "symbols": symbols}


# ------------------------------------------------------------------ rendering


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_SHOWN])
    return shown + (f", … {len(names) - MAX_NAMES_SHOWN} more" if len(names) > MAX_NAMES_SHOWN else "")


def _ops(ops: Sequence[str]) -> str:
    """Op types in order of first appearance, repeats counted: "Transpose x3, Attention"."""
    counts = Counter(ops)
    return ", ".join(op if counts[op] == 1 else f"{op} x{counts[op]}" for op in counts)


def _short(location: str) -> str:
    """file:line[:col], relative to the current folder when under it."""
    path, _, rest = location.partition(":")
    try:
        relative = os.path.relpath(path) if path else "?"
    except ValueError:  # another drive (Windows)
        return location
    return f"{relative}:{rest}" if rest and not relative.startswith("..") else location or "?"


def describe(site: Site) -> str:
    """The outcome in plain words, one line (no markup)."""
    if site.status == APPLIED:
        count = len(site.removed)
        replaced = f"replaced {count} node{'s' if count != 1 else ''}" + (f" ({_names(site.removed)})" if count else "")
        return f"rewrite #{site.rewrite}: {replaced} with {_ops(site.added) or 'nothing'}"
    if site.status == NOT_APPLIED:
        where = f", at {site.failed_at}" if site.failed_at else ""
        matched = f" (after matching {_names(site.tried)})" if len(site.tried) > 1 else ""
        return f"{site.reason}{where}{matched}"
    return site.reason


_STYLE = {APPLIED: "green", NOT_APPLIED: "red", NOT_TRIED: "dim"}


def _where(site: Site) -> str:
    return site.node if site.scope == "main" else f"{site.node} (in {site.scope})"


def _lines(sites: Sequence[Site]) -> list[tuple[str, str, str, Site | None]]:
    """(status, where, text, site) per output line. Sites not tried for the same reason share
    a line: they are many (a big rewrite takes nodes several rules start at) and say little."""
    lines: list[tuple[str, str, str, Site | None]] = []
    untried: dict[str, list[str]] = {}
    for site in sites:
        if site.status == NOT_TRIED:
            untried.setdefault(site.reason, []).append(_where(site))
        else:
            lines.append((site.status, _where(site), describe(site), site))
    for reason, where in untried.items():
        lines.append((NOT_TRIED, _names(where), reason, None))
    return lines


def _grouped(sites: Sequence[Site]) -> list[tuple[str, str, str, str | None]]:
    """(status, where, text, hint) per output line, sites with the same outcome on one line:
    the rewrites a rule made, and each failing check with the nodes it failed at."""
    groups: dict[tuple[str, str], list[Site]] = {}
    for site in sites:
        what = site.reason
        if site.status == APPLIED:
            what = _ops(site.added)
        elif site.status == NOT_TRIED:  # "replaced by rewrite #7 (FoldConvBatchNorm) ...": the same for every #
            what = re.sub(r"rewrite #\d+ \(([^)]*)\)", r"\1", what)
        key = (site.status, what)
        groups.setdefault(key, []).append(site)
    lines: list[tuple[str, str, str, str | None]] = []
    for (status, what), members in groups.items():
        where = _names([_where(site) for site in members])
        if status == APPLIED:
            removed = sum(len(site.removed) for site in members)
            numbers = _names([f"#{site.rewrite}" for site in members])
            text = f"{len(members)} rewrite{'s' if len(members) != 1 else ''} ({numbers}): replaced {removed} nodes with {what or 'nothing'}"
        else:
            text = what
        lines.append((status, where, text, members[0].hint))
    return lines


def print_explanation(explanation: Explanation, console: Console, *, details: bool | None = None) -> None:
    """Per rule: a heading, then its sites. `details`: one line per site, with its hint and later
    fate; otherwise sites with the same outcome share a line and each hint is said once. By
    default, details only when --rule or --node narrowed the answer."""
    if details is None:
        details = explanation.filtered
    width = max(len(status) for status in _STYLE)
    hinted: set[str] = set()
    # In the summary, rules whose every candidate was rewritten by another rule first get one line at the end.
    preempted = [] if details else [rule.name for rule in explanation.rules if rule.sites and all(s.status == NOT_TRIED for s in rule.sites)]
    for rule in explanation.rules:
        if rule.name in preempted:
            continue
        console.print()
        heading = f"[bold]{escape(rule.name)}[/]" + (f" — {escape(rule.doc)}" if rule.doc else "")
        console.print(heading, highlight=False, soft_wrap=True)
        tallies = ", ".join(f"{n} {status}" for status in _STYLE if (n := rule.count(status)))
        tallies = tallies or f"no candidate: the model has no {rule.op} node"
        console.print(f"  [dim]{escape(display_source(rule.source))} · root op {escape(rule.op)} · {tallies}[/]", highlight=False, soft_wrap=True)
        pad = " " * (width + 4)
        if not details:
            for status, where, text, hint in _grouped(rule.sites):
                console.print(f"  [{_STYLE[status]}]{status:<{width}}[/]  {escape(where)}: {escape(text)}", highlight=False, soft_wrap=True)
                if hint and hint not in hinted:
                    hinted.add(hint)
                    console.print(f"{pad}[yellow]hint:[/] {escape(hint)}", highlight=False, soft_wrap=True)
            continue
        for status, where, text, site in _lines(rule.sites):
            console.print(f"  [{_STYLE[status]}]{status:<{width}}[/]  {escape(where)}: {escape(text)}", highlight=False, soft_wrap=True)
            if site is not None and site.hint:
                console.print(f"{pad}[yellow]hint:[/] {escape(site.hint)}", highlight=False, soft_wrap=True)
            if site is not None and site.afterwards:
                console.print(f"{pad}[dim]{escape(site.afterwards)}[/]", highlight=False, soft_wrap=True)
    sites = [site for rule in explanation.rules for site in rule.sites]
    console.print()
    if not sites:
        console.print("No rule has a candidate site here" + (" that matches --rule / --node." if explanation.filtered else "."), highlight=False)
    counts = ", ".join(f"{sum(1 for s in sites if s.status == status)} {status}" for status in _STYLE)
    summary = f"{len(explanation.rules)} rules, {len(sites)} sites: {counts}"
    if explanation.idle_rules and not explanation.filtered:
        summary += f"; {explanation.idle_rules} more rules have no candidate node (no node with their root op)"
    if preempted:
        console.print(
            f"Not tried anywhere (another rule rewrote each candidate node first): {', '.join(preempted)}.", highlight=False, soft_wrap=True
        )
    console.print(summary, highlight=False, soft_wrap=True)
    if not details and sites:
        console.print("Sites with the same outcome share a line; --details lists each one.", highlight=False, soft_wrap=True)
    for warning in explanation.report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)

