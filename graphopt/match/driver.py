"""The rewrite driver: apply a rule set to a graph until nothing more applies.

* Rules are compiled once into `(domain, op) -> [rules]`, best benefit first.
* Each scope's worklist is seeded in topological order and popped from the end,
  so nodes nearer the outputs are tried first (large output-rooted patterns win).
* After a rewrite only what it touched goes back on the worklist: the new nodes,
  the users of replaced values and the producers of the match's leaves (whose use
  counts dropped). Matched nodes left without users are erased at once. No rewrite
  causes a rescan of the graph, so cost grows linearly with its size.
* A rewrite budget bounds the work; reaching it is reported, not fatal.
* Before a commit, the driver proves the rewrite keeps the graph acyclic
  (graphopt.match.cycles); one that would not is declined as a near-miss.
* A rule whose own code fails (its matcher, a native helper, its rewrite) is declined
  at that site with a warning naming rule and node, and counted in the report;
  `strict` makes it fatal instead. One faulty rule never takes the run down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir import provenance
from graphopt.ir.symbolic import SymbolicShapes, static_int
from graphopt.ir.view import GraphView
from graphopt.library import BUILTIN_RULES_DIR
from graphopt.match.cycles import TopoOrder, cycle_through
from graphopt.match.matcher import Failure, Match, Matcher, OpBinding
from graphopt.match.qdq import qdq_unit_problem
from graphopt.match.rewrite import plan_rewrite, target_variants
from graphopt.ops.opspec import UNKNOWN_SHAPE
from graphopt.ops.registry import has_fact
from graphopt.ops.targets import Target
from graphopt.pattern.ir import Rule, required_ops
from graphopt.pattern.native import RewriteDeclined, UserCodeExit
from graphopt.report.model import NearMiss, Report, RewriteRecord

__all__ = ["RuleSet", "DriverOptions", "Attempt", "RuleFailed", "apply_rules"]


class RuleFailed(GraphoptError):
    """A rule's own code raised (with `DriverOptions.strict`): names the rule and the node."""


class RuleSet:
    """Rules indexed by root op (every type a root of alternatives matches), each
    bucket sorted by benefit (highest first), each rule with the op types it needs."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        self.by_op: dict[tuple[str, str], list[Rule]] = {}
        benefit: dict[int, int] = {}  # a variant's is its rule's (the same root and benefit)
        for rule in self.rules:
            for variant in target_variants(rule):  # `first { a, b }`: a, then b if the target refused a
                benefit[id(variant)] = rule.effective_benefit
                for key in rule.root_keys:
                    self.by_op.setdefault(key, []).append(variant)
        for bucket in self.by_op.values():
            bucket.sort(key=lambda r: (-benefit[id(r)], r.name))
        #: Per rule: the op positions every match goes through, each a set of types that can fill it.
        self.needs: dict[str, tuple[frozenset[tuple[str, str]], ...]] = {r.name: required_ops(r.root) for r in self.rules}

    def __len__(self) -> int:
        return len(self.rules)

    def cannot_match(self, rule: Rule, present: set[tuple[str, str]] | frozenset[tuple[str, str]]) -> bool:
        """Early reject: True if the rule cannot match anywhere in a scope holding the op
        types `present` (a superset is fine). Opset guards are left to the matcher, which
        checks them first and says why (a near-miss worth reporting)."""
        return any(present.isdisjoint(types) for types in self.needs[rule.name])


@dataclass
class DriverOptions:
    #: Stop after this many rewrites in one call (None: 4 per node + 100).
    max_rewrites: int | None = None
    #: Applies only while it returns True for (rule name, root output name); used to bisect.
    allow: Callable[[str, str], bool] | None = None
    #: Rewrites to skip, as (rule name, root output name) keys.
    blocked: set[tuple[str, str]] = field(default_factory=set)
    #: Record near-misses (cheap, but can be turned off for speed).
    trace: bool = True
    #: Also keep every failed attempt in `report.trace` (for `graphopt optimize --trace`).
    trace_all: bool = False
    #: Record each rewrite's matched subgraph and replacement (drawn by the HTML report).
    snapshots: bool = True
    #: The precision conversion that follows the rules (a `graphopt.passes.precision_plan.PrecisionPlan`):
    #: new nodes are checked against the target in the type they will run in after it.
    precision: Any = None
    #: Called with every attempt, applied or not (`graphopt explain` listens here).
    observe: Callable[[Attempt], None] | None = None
    #: Record on each inserted node which rule and rewrite made it (graphopt.ir.provenance).
    provenance: bool = True
    #: A rule whose code raises stops the run (RuleFailed) instead of being declined at that site.
    strict: bool = False


@dataclass(frozen=True)
class Attempt:
    """One rule tried at one node, as `DriverOptions.observe` hears of it."""

    rule: str
    scope: str
    node: str  # the root's label
    op: str
    tried: tuple[str, ...]  # labels of the nodes matched (up to the failure, when it failed)
    miss: NearMiss | None = None  # why it did not apply
    rewrite: RewriteRecord | None = None  # what it did, when it applied
    removed: tuple[str, ...] = ()  # labels of the matched nodes the rewrite erased


def rewrite_key(view: GraphView, rule: Rule, root: Any) -> tuple[str, str]:
    """Identifies a rewrite across runs on the same input: rule and root's first output name."""
    outputs = view.outputs(root)
    name = getattr(outputs[0], "name", None) if outputs else None
    return (rule.name, name or view.label(root))


def apply_rules(view: GraphView, rules: RuleSet, target: Target, report: Report, options: DriverOptions | None = None) -> int:
    """Apply `rules` to every scope of `view`; returns the number of rewrites applied."""
    options = options or DriverOptions()
    matcher = Matcher(view)
    applied = 0
    total_nodes = sum(len(view.nodes(s)) for s in view.scopes())
    budget = options.max_rewrites if options.max_rewrites is not None else 4 * total_nodes + 100
    for rule in rules.rules:
        report.rule(rule.name, str(rule.loc or ""), rule.effective_benefit, rule.doc)

    for scope in view.scopes():
        scope_label = view.scope_label(scope)
        worklist = _Worklist(view, scope)
        order = TopoOrder(view, scope)
        push = worklist.push
        # The op types of the scope, for early reject; rewrites only add to it (a superset is safe).
        present = {view.op_key(n) for n in view.nodes(scope)}
        while worklist:
            node = worklist.pop()
            if view.scope_of(node) is not scope:
                continue  # erased since it was queued
            bucket = rules.by_op.get(view.op_key(node))
            if not bucket:
                continue
            unmatched = None  # a rule that did not match here: its other `first` variants would not either
            for rule in bucket:
                stats = report.rules[rule.name]
                if rule.name == unmatched:
                    continue
                if rules.cannot_match(rule, present):
                    stats.skipped += 1
                    continue
                started = time.perf_counter()
                trace_into = report if options.trace_all else None
                try:
                    try:
                        outcome = matcher.attempt(rule, node)
                    except Exception as error:  # a bug in the rule's match or a constraint helper
                        _rule_failed(view, report, stats, rule, node, scope_label, "matching", error, options, trace_into)
                        continue
                    stats.attempts += 1
                    if isinstance(outcome, Failure):
                        unmatched = rule.name
                        if options.trace or options.observe is not None:
                            _near_miss(view, stats, rule, node, scope_label, outcome, trace_into, options.observe)
                        continue
                    stats.matches += 1
                    key = rewrite_key(view, rule, node)
                    if key in options.blocked or (options.allow is not None and not options.allow(*key)):
                        if options.observe is not None:
                            left_out = Failure(len(outcome.nodes) + 2, node, "matched, but left out (blocked by --verify)", outcome.nodes)
                            miss = _miss(view, rule, node, scope_label, left_out)
                            options.observe(_attempt(view, rule, node, scope_label, outcome.nodes, miss=miss))
                        continue
                    if applied >= budget:
                        report.limit_reached = True
                        return applied
                    qdq_problem = qdq_unit_problem(view, outcome.nodes)
                    if qdq_problem is not None:
                        refused = Failure(len(outcome.nodes) + 2, node, qdq_problem, outcome.nodes)
                        _near_miss(view, stats, rule, node, scope_label, refused, trace_into, options.observe)
                        continue
                    try:
                        planned = plan_rewrite(view, outcome)
                        problem = _target_problem(view, target, planned.new_nodes, options.precision, outcome.nodes)
                        if problem is None:
                            problem = cycle_through(view, order, planned.new_nodes, planned.replacements)
                    except RewriteDeclined as declined:
                        view.discard_pending()
                        declined_at = Failure(len(outcome.nodes) + 2, node, str(declined), outcome.nodes)
                        _near_miss(view, stats, rule, node, scope_label, declined_at, trace_into, options.observe)
                        continue
                    except Exception as error:  # a bug in the rule's rewrite or a native rewrite helper
                        view.discard_pending()
                        _rule_failed(view, report, stats, rule, node, scope_label, "rewriting", error, options, trace_into, outcome.nodes)
                        continue
                    if problem is not None:
                        view.discard_pending()
                        refused = Failure(len(outcome.nodes) + 2, node, problem, outcome.nodes)
                        _near_miss(view, stats, rule, node, scope_label, refused, trace_into, options.observe)
                        continue
                    leaves = _leaf_producers(view, outcome)
                    # The matched nodes are erased by the commit: picture them first.
                    before = _snapshot(view, outcome.nodes) if options.snapshots else None
                    matched = list(dict.fromkeys(view.label(n) for n in outcome.nodes))
                    tried = tuple(view.label(n) for n in outcome.nodes) if options.observe is not None else ()
                    index = report.next_index()
                    made_by = {provenance.RULE_KEY: rule.name, provenance.REWRITE_KEY: str(index)} if options.provenance else None
                    root_outputs = set(map(id, view.outputs(node)))
                    resorted = any(id(old) not in root_outputs for old, _ in planned.replacements)
                    touched = view.commit(node, planned.new_nodes, planned.replacements, outcome.nodes, provenance=made_by)
                    order.place(node, planned.new_nodes, resorted)
                    present.update(view.op_key(n) for n in planned.new_nodes)
                    applied += 1
                    stats.applications += 1
                    stats.rewrites.append(
                        RewriteRecord(
                            index=index,
                            rule=rule.name,
                            scope=scope_label,
                            node=key[1],
                            op=view.op_key(node)[1],
                            removed=sum(1 for n in outcome.nodes if view.scope_of(n) is not scope),
                            added=[_op_name(view.op_key(n)) for n in planned.new_nodes],
                            matched=matched,
                            before=before,
                            after=_snapshot(view, planned.new_nodes, [new for _, new in planned.replacements])
                            if options.snapshots
                            else None,
                        )
                    )
                    if options.observe is not None:
                        erased = tuple(label for n, label in zip(outcome.nodes, tried) if view.scope_of(n) is not scope)
                        record = stats.rewrites[-1]
                        options.observe(_attempt(view, rule, node, scope_label, outcome.nodes, tried, rewrite=record, removed=erased))
                finally:
                    stats.time_s += time.perf_counter() - started
                push(leaves)
                push(touched)
                push(reversed(planned.new_nodes))  # pushed last: tried first
                if view.scope_of(node) is scope:
                    push([node])
                break
    return applied


class _Worklist:
    """A stack of one scope's nodes, each queued at most once. Seeded in topological
    order and popped from the end, so nodes nearer the outputs come first."""

    def __init__(self, view: GraphView, scope: Any) -> None:
        self.view, self.scope = view, scope
        self.stack = list(view.nodes(scope))
        self.queued = set(map(id, self.stack))

    def __bool__(self) -> bool:
        return bool(self.stack)

    def pop(self) -> Any:
        node = self.stack.pop()
        self.queued.discard(id(node))
        return node

    def push(self, nodes: Iterable[Any]) -> None:
        for node in nodes:
            if node is not None and id(node) not in self.queued and self.view.scope_of(node) is self.scope:
                self.queued.add(id(node))
                self.stack.append(node)


def _op_name(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}" if key[0] else key[1]


def _leaf_producers(view: GraphView, match: Match) -> list[Any]:
    """Producers of the values feeding the match from outside: their use counts drop."""
    inside = set(map(id, match.nodes))
    result = []
    for node in match.nodes:
        for value in view.inputs(node):
            if value is None:
                continue
            producer = view.producer(value)
            if producer is not None and id(producer) not in inside:
                result.append(producer)
    return result


def _first_dtype(view: GraphView, node: Any) -> str | None:
    inputs = list(view.inputs(node))
    # The kernel tables key on the data type: Where's is its second input, not the condition.
    domain, op_type = view.op_key(node)
    typed = inputs[1:] if op_type == "Where" and not domain else inputs
    first = next((v for v in typed if v is not None), None)
    for _ in range(8):   # e.g. MultiHeadAttention of a Reshape the same rewrite made
        if first is None or view.dtype(first) is not None:
            break
        producer = view.producer(first)
        # ops that only move data have their first input's type: a value a rewrite just
        # made (no type recorded yet) takes its type from there
        if producer is None or not has_fact(*view.op_key(producer), "moves_data"):
            break
        first = next(iter(view.inputs(producer)), None)
    return view.dtype(first) if first is not None else None


def _contract_shapes(view: GraphView, node: Any) -> list[Any]:
    """A contract's `shapes` for the node: None for an omitted input (trailing ones left out, as the
    lowering does), the recorded shape, else, for a value a rewrite just made, the dims derived
    through the graph (the padded rotary caches), else UNKNOWN_SHAPE."""
    inputs = list(view.inputs(node))
    while inputs and inputs[-1] is None:
        inputs.pop()
    symbolic: SymbolicShapes | None = None
    shapes: list[Any] = []
    for value in inputs:
        shape: Any = None if value is None else view.shape(value)
        if value is not None and shape is None:
            symbolic = symbolic or SymbolicShapes(view)
            dims = symbolic.dims(value)
            shape = UNKNOWN_SHAPE if dims is None else tuple(static_int(d) for d in dims)  # symbolic dims: unknown
        shapes.append(shape)
    return shapes


def _target_problem(view: GraphView, target: Target, new_nodes: list[Any], precision: Any = None, matched: Iterable[Any] = ()) -> str | None:
    replaced: list[tuple[str, str, str | None]] | None = None
    matched = tuple(matched)
    for node in new_nodes:
        domain, op_type = view.op_key(node)
        dtype = _first_dtype(view, node)
        if precision is None:
            reason = target.why_not(domain, op_type, dtype, view.opset(""))
        else:  # checked in the type it will run in after the precision conversion
            if replaced is None:
                replaced = [(*view.op_key(m), _first_dtype(view, m)) for m in matched]
            reason = precision.fusion_problem(target, domain, op_type, dtype, view.opset(""), replaced)
        if reason is None and target.has_contract(domain, op_type):  # the kernel's own limits (activations, shapes)
            reason = target.contract_problem(domain, op_type, view.attrs(node), _contract_shapes(view, node))
        if reason is None and not any(view.op_key(m) == (domain, op_type) for m in matched):
            # new to the graph here: not if slower than what it replaces, nor if the target's
            # provider would hand it to another one (ort-cuda has no Mish kernel)
            reason = target.slower_kernel(domain, op_type) or target.missing_kernel(domain, op_type, view.opset(""))
        if reason is not None:
            return reason
    return None



def _rule_failed(
    view: GraphView,
    report: Report,
    stats: Any,
    rule: Rule,
    root: Any,
    scope_label: str,
    stage: str,
    error: Exception,
    options: DriverOptions,
    trace_into: Report | None,
    nodes: tuple[Any, ...] = (),
) -> None:
    """A rule's own code raised at `root`: decline it there, say so, count it (or stop, when
    strict, for a user's rule, or when user code called sys.exit)."""
    if isinstance(error, UserCodeExit) or (isinstance(error, GraphoptError) and not is_builtin(rule)):
        raise error
    where = f"{rule.name} at {view.label(root)} ({scope_label})"
    message = f"{type(error).__name__}: {error}".splitlines()[0] if str(error) else type(error).__name__
    if options.strict:
        raise RuleFailed(f"rule {where} failed while {stage}: {message} (from {rule.loc or 'an unknown file'})") from error
    stats.errors += 1
    report.warnings.append(f"rule {where} failed while {stage} and was skipped there: {message}")
    failure = Failure(len(nodes) + 2, root, f"the rule's code failed while {stage}: {message}", nodes)
    _near_miss(view, stats, rule, root, scope_label, failure, trace_into, options.observe)


def is_builtin(rule: Rule) -> bool:
    """Whether the rule comes from graphopt's own library (not from the user's --patterns)."""
    return rule.loc is not None and os.path.abspath(rule.loc.file).startswith(os.path.abspath(BUILTIN_RULES_DIR) + os.sep)


def _near_miss(
    view: GraphView,
    stats: Any,
    rule: Rule,
    root: Any,
    scope_label: str,
    failure: Failure,
    trace_into: Report | None = None,
    observe: Callable[[Attempt], None] | None = None,
) -> None:
    miss = _miss(view, rule, root, scope_label, failure)
    stats.add_near_miss(miss)
    if trace_into is not None:
        if trace_into.trace is None:
            trace_into.trace = []
        trace_into.trace.append(miss)
    if observe is not None:
        observe(_attempt(view, rule, root, scope_label, failure.nodes, miss=miss))


def _miss(view: GraphView, rule: Rule, root: Any, scope_label: str, failure: Failure) -> NearMiss:
    failed_at = failure.node
    return NearMiss(
            rule=rule.name,
            scope=scope_label,
            node=view.label(root),
            op=view.op_key(root)[1],
            failed_at=view.label(failed_at) if failed_at is not None and not isinstance(failed_at, OpBinding) else "",
            reason=failure.reason,
            depth=failure.depth,
    )


def _attempt(
    view: GraphView, rule: Rule, root: Any, scope_label: str, nodes: Iterable[Any], labels: tuple[str, ...] | None = None, **outcome: Any
) -> Attempt:
    tried = labels if labels is not None else tuple(view.label(n) for n in nodes)
    return Attempt(rule.name, scope_label, tried[0] if tried else view.label(root), view.op_key(root)[1], tried, **outcome)


def _snapshot(view: GraphView, nodes: Sequence[Any], passthrough: Iterable[Any] = ()) -> Any:
    """The rewrite's picture for the HTML report; its module and classes are imported only when
    snapshots are asked for (not by the command line without --report)."""
    from graphopt.report.snapshot import capture_snapshot

    return capture_snapshot(view, nodes, passthrough)
