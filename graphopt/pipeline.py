"""The rewrite pipeline both front doors run: `graphopt.optimize` (ONNX) and the
torch.compile backend (FX).

    [prepare passes] -> ( [fold passes] -> rule sweep )* until a fixpoint or the sweep limit -> [finish passes]

What differs between the graph kinds is handed in, never tested for here: the graph
view the rules run on, the passes that fold constants before each rule sweep, how a
pass's new nodes are tagged (ONNX keeps provenance in node metadata) and how the view
learns that a pass changed the graph behind its back (the FX view caches its
presentations). The passes before and after the sweeps are the front door's own; it
runs them through `Pipeline.run_pass`, so every pass is timed and counted in the
report the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from graphopt.ir.view import GraphView
from graphopt.match.driver import DriverOptions, RuleSet, apply_rules
from graphopt.ops.targets import Target
from graphopt.report.model import Report

__all__ = ["GraphKind", "Pipeline", "Pass", "run_pass"]

#: A pass: a name (its entry in the report's pass table) and a function returning how many changes it made.
Pass = tuple[str, Callable[[], int]]


def _untagged(pass_name: str) -> AbstractContextManager[Any]:
    return nullcontext()


def _nothing() -> None:
    return None


@dataclass
class GraphKind:
    """What the pipeline needs to know about one kind of graph."""

    #: The view the rules run on.
    view: GraphView
    #: Passes that fold constants, run (in order) before every rule sweep.
    fold: Sequence[Pass] = ()
    #: Marks the nodes a pass makes with its name while the pass runs (ONNX provenance).
    tag: Callable[[str], AbstractContextManager[Any]] = _untagged
    #: Called after every pass: the view forgets what it cached about the graph.
    refresh: Callable[[], None] = _nothing


def run_pass(report: Report, name: str, fn: Callable[[], int], tag: Callable[[str], AbstractContextManager[Any]] = _untagged) -> int:
    """Run one pass, timed and counted under `name` in `report`; returns its changes.
    (Also for a pass that runs before there is a view, such as ONNX shape inference.)"""
    stats = report.pass_stats(name)
    with tag(name):
        started = time.perf_counter()
        changes = fn()
        elapsed = time.perf_counter() - started
    stats.runs += 1
    stats.changes += changes
    stats.time_s += elapsed
    return changes


@dataclass
class Pipeline:
    """The rule sweeps over one graph, and the passes its front door runs around them."""

    kind: GraphKind
    rules: RuleSet
    target: Target
    report: Report
    #: The driver's options; `max_rewrites` is the budget of all sweeps together.
    driver: DriverOptions = field(default_factory=DriverOptions)
    max_sweeps: int = 8
    say: Callable[[str], None] = lambda message: None

    def run_pass(self, name: str, fn: Callable[[], int]) -> int:
        """Run one pass, timed and counted under `name` in the report; returns its changes."""
        changes = run_pass(self.report, name, fn, self.kind.tag)
        self.kind.refresh()
        return changes

    def sweep(self) -> None:
        """Fold constants, apply the rules; again until neither changes anything or a limit is reached.

        Reaching the sweep limit or the rewrite budget is reported as a warning, never fatal."""
        report, driver = self.report, self.driver
        if driver.trace_all:
            report.trace = []
        for sweep in range(1, self.max_sweeps + 1):
            report.sweeps = sweep
            self.say(f"sweep {sweep}: constant folding")
            folded = sum(self.run_pass(name, fn) for name, fn in self.kind.fold)
            self.say(f"sweep {sweep}: rules")
            started = time.perf_counter()
            rewritten = apply_rules(self.kind.view, self.rules, self.target, report, driver)
            report.times_s["rules"] = report.times_s.get("rules", 0.0) + time.perf_counter() - started
            if report.limit_reached or (folded == 0 and rewritten == 0):
                break
            if driver.max_rewrites is not None:  # one budget for all sweeps
                driver.max_rewrites = max(0, driver.max_rewrites - rewritten)
        else:
            report.limit_reached = True
            report.warnings.append(f"stopped after {self.max_sweeps} sweeps without reaching a fixpoint")
        if report.limit_reached and not report.warnings:
            report.warnings.append("rewrite limit reached; the result is valid but may not be fully optimized")

    def run_passes(self, passes: Sequence[Pass]) -> int:
        return sum(self.run_pass(name, fn) for name, fn in passes)
