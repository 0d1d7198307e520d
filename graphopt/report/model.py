"""The rewrite report: one data model, filled by the driver and passes, rendered as
JSON (schema in docs/report-schema.md), in the terminal, and as self-contained HTML.

Bump `SCHEMA_VERSION` on any change that removes or renames a field; adding a
field is compatible.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphopt.report.sections import (
        Alternative,
        DecisionRecord,
        GraphSnapshot,
        Latency,
        LayoutSummary,
        PrecisionSummary,
        RangeKeep,
        SnapshotEdge,
        SnapshotNode,
        SnapshotValue,
        Verification,
        WeightLayer,
        WeightQuantSummary,
    )

__all__ = [
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "RewriteRecord",
    "NearMiss",
    "RuleStats",
    "PassStats",
    "GraphSummary",
    "Verification",
    "LayoutSummary",
    "PrecisionSummary",
    "Latency",
    "Alternative",
    "DecisionRecord",
    "RangeKeep",
    "WeightLayer",
    "WeightQuantSummary",
    "SnapshotNode",
    "SnapshotValue",
    "SnapshotEdge",
    "GraphSnapshot",
    "Report",
    "MAX_NEAR_MISSES",
    "MAX_LOCATIONS",
]

SCHEMA_NAME = "graphopt.report"
SCHEMA_VERSION = 1
#: Near-misses kept per rule (the deepest ones).
MAX_NEAR_MISSES = 10
#: Rewrite locations kept per rule (counts are always exact).
MAX_LOCATIONS = 1000

_tiebreak = itertools.count()

#: The optional sections' classes, in graphopt.report.sections: imported when first asked for here.
_SECTIONS = frozenset({"Verification", "PrecisionSummary", "WeightLayer", "WeightQuantSummary", "LayoutSummary", "Alternative",
                       "DecisionRecord", "RangeKeep", "Latency", "SnapshotNode", "SnapshotValue", "SnapshotEdge", "GraphSnapshot"})


def __getattr__(name: str) -> Any:
    if name in _SECTIONS:
        from graphopt.report import sections

        return getattr(sections, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class RewriteRecord:
    """One applied rewrite: which rule, at which node, what it replaced."""

    index: int  # order of application across the whole run
    rule: str
    scope: str  # "main", or the path of a subgraph / function body
    node: str  # the root node's name
    op: str
    removed: int  # nodes erased
    added: list[str]  # op types of the nodes inserted
    matched: list[str] = field(default_factory=list)  # names of the matched nodes, root first
    before: GraphSnapshot | None = None  # the matched subgraph just before the rewrite
    after: GraphSnapshot | None = None  # the inserted nodes just after it


@dataclass
class NearMiss:
    """A rule that got part of the way at a node, and the check that stopped it."""

    rule: str
    scope: str
    node: str  # root node the rule was tried at
    op: str
    failed_at: str  # node where the failing check was, if any
    reason: str
    depth: int  # ops matched before the failure


@dataclass
class RuleStats:
    name: str
    source: str  # file:line
    benefit: int
    doc: str = ""
    attempts: int = 0
    #: Times it would have been tried but the graph lacked an op it needs (early reject).
    skipped: int = 0
    matches: int = 0
    applications: int = 0
    #: Sites where the rule's own code (matcher, native helper, rewrite) raised and the rule was skipped.
    errors: int = 0
    time_s: float = 0.0
    rewrites: list[RewriteRecord] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    # heap of (depth, tiebreak, NearMiss): the deepest misses survive
    _heap: list[tuple[int, int, NearMiss]] = field(default_factory=list, repr=False)
    _seen: set[tuple[str, str, str]] = field(default_factory=set, repr=False)

    def add_near_miss(self, miss: NearMiss) -> None:
        key = (miss.scope, miss.node, miss.reason)
        if key in self._seen:  # the same miss found again in a later sweep
            return
        self._seen.add(key)
        item = (miss.depth, -next(_tiebreak), miss)
        if len(self._heap) < MAX_NEAR_MISSES:
            heapq.heappush(self._heap, item)
        elif item[:2] > self._heap[0][:2]:
            heapq.heapreplace(self._heap, item)

    def finalize(self) -> None:
        self.near_misses = [m for _, _, m in sorted(self._heap, key=lambda t: (-t[0], -t[1]))]


@dataclass
class PassStats:
    name: str
    runs: int = 0
    changes: int = 0
    time_s: float = 0.0


@dataclass
class GraphSummary:
    nodes: int
    ops: dict[str, int]
    initializers: int = 0
    parameters: int = 0  # elements in the main graph's initializers

    @classmethod
    def of(cls, op_types: list[str], initializers: int = 0, parameters: int = 0) -> GraphSummary:
        counts = Counter(op_types)
        return cls(len(op_types), dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), initializers, parameters)


@dataclass
class Report:
    target: str
    input_path: str | None = None
    output_path: str | None = None
    before: GraphSummary | None = None
    after: GraphSummary | None = None
    rules: dict[str, RuleStats] = field(default_factory=dict)
    passes: dict[str, PassStats] = field(default_factory=dict)
    sweeps: int = 0
    limit_reached: bool = False
    times_s: dict[str, float] = field(default_factory=dict)
    verification: Verification | None = None
    warnings: list[str] = field(default_factory=list)
    #: Every failed attempt, in order, when tracing was asked for (None otherwise).
    trace: list[NearMiss] | None = None
    #: The precision asked for ("fp16", "bf16"); None when the model kept its own.
    precision: str | None = None
    precision_conversion: PrecisionSummary | None = None
    #: What --weights did (None without it).
    weight_quantization: WeightQuantSummary | None = None
    #: The NHWC layout pass's summary (ort-cuda only; None when it did not run).
    layout: LayoutSummary | None = None
    #: Run time before and after, when something measured it (None otherwise).
    latency: Latency | None = None
    #: Every choice made by graphopt.decisions (layout, conv bias form, FusedConv, ...).
    decisions: list[DecisionRecord] = field(default_factory=list)
    #: Input shapes fixed before optimizing (--input-shape): {"inputs": {name: dims},
    #: "symbols": {dim name: size}}; None when none were.
    input_shapes: dict[str, Any] | None = None
    _applied: int = 0

    # ----------------------------------------------------------- recording
    def rule(self, name: str, source: str = "", benefit: int = 0, doc: str = "") -> RuleStats:
        stats = self.rules.get(name)
        if stats is None:
            stats = self.rules[name] = RuleStats(name, source, benefit, doc)
        return stats

    def pass_stats(self, name: str) -> PassStats:
        stats = self.passes.get(name)
        if stats is None:
            stats = self.passes[name] = PassStats(name)
        return stats

    def next_index(self) -> int:
        self._applied += 1
        return self._applied

    @property
    def applied(self) -> list[RewriteRecord]:
        return sorted((r for s in self.rules.values() for r in s.rewrites), key=lambda r: r.index)

    @property
    def total_rewrites(self) -> int:
        return sum(s.applications for s in self.rules.values())

    def finalize(self) -> None:
        for stats in self.rules.values():
            stats.finalize()

    # ----------------------------------------------------------- output
    def __str__(self) -> str:
        """The terminal summary as text: `print(graphopt.last_report())`."""
        from graphopt.report.render import render_summary

        return render_summary(self)

    def one_line(self) -> str:
        """`target ort-cpu: 47 -> 31 nodes, 16 rewrites (FoldConvBatchNorm 11, MatMulAddToGemm 1, ...)`."""
        rules = sorted((s for s in self.rules.values() if s.applications), key=lambda s: (-s.applications, s.name))
        shown = ", ".join(f"{s.name} {s.applications}" for s in rules[:4]) + (", ..." if len(rules) > 4 else "")
        nodes = f"{self.before.nodes} -> {self.after.nodes} nodes, " if self.before and self.after else ""
        return f"target {self.target}: {nodes}{self.total_rewrites} rewrites" + (f" ({shown})" if shown else "")

    def to_dict(self) -> dict[str, Any]:
        from graphopt._version import __version__

        def plain(obj: Any) -> Any:
            if dataclasses.is_dataclass(obj):
                return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
            if isinstance(obj, dict):
                return {k: plain(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [plain(v) for v in obj]
            if isinstance(obj, float):
                return round(obj, 6)
            return obj

        self.finalize()
        body = plain(self)
        body["rules"] = [plain(s) for s in sorted(self.rules.values(), key=lambda s: (-s.applications, s.name))]
        body["passes"] = [plain(p) for p in self.passes.values()]
        body["total_rewrites"] = self.total_rewrites
        return {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION, "tool": {"name": "graphopt", "version": __version__}, **body}
