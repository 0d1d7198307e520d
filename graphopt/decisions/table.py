"""The cost table shipped with graphopt: measured times of a decision's candidates, per
execution provider, decision, op, element type and shape class.

An entry says: on this provider, for ops of this type and dtype whose shape class matches
`match` (feature -> allowed labels; a feature not named matches anything), candidate c
took `times_ms[c]` milliseconds for `per` such ops (a whole model of `per` convolutions,
or one op of a microbenchmark). A candidate an entry does not list is unknown there: it
is never predicted to win. Every entry says where its figures come from (`source`), and
entries nobody measured are simply absent.

The file is cost_table.json beside this module; benchmarks/decisions_bench.py writes
entries in the same format (`--out DIR` -> DIR/cost_table.json) to be merged into it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from graphopt.decisions.shapes import OpClass

__all__ = ["Entry", "CostTable", "DEFAULT_TABLE_PATH", "default_table", "TABLE_FORMAT"]

DEFAULT_TABLE_PATH = Path(__file__).parent / "cost_table.json"
TABLE_FORMAT = "graphopt.cost_table/1"
_ANY = 1000  # the specificity weight of a feature an entry does not restrict


@dataclass(frozen=True)
class Entry:
    ep: str  # "CUDAExecutionProvider", "CPUExecutionProvider"
    decision: str  # "layout", "fused_conv", ...
    op: str
    dtype: str
    match: Mapping[str, Sequence[str]]
    times_ms: Mapping[str, float]
    per: int = 1
    source: str = ""
    device: str = ""

    def covers(self, cls: OpClass) -> bool:
        if cls.op != self.op or cls.dtype != self.dtype:
            return False
        features = dict(cls.features)
        return all(features.get(name) in allowed for name, allowed in self.match.items())

    @property
    def specificity(self) -> int:
        """Lower is more specific: the most specific covering entry wins."""
        return sum(len(v) for v in self.match.values()) + _ANY * (4 - len(self.match))

    def per_op_ms(self, candidate: str) -> float | None:
        t = self.times_ms.get(candidate)
        return None if t is None else float(t) / max(1, self.per)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ep": self.ep, "decision": self.decision, "op": self.op, "dtype": self.dtype,
            "match": {k: list(v) for k, v in self.match.items()}, "times_ms": dict(self.times_ms),
            "per": self.per, "source": self.source, "device": self.device,
        }


@dataclass
class CostTable:
    entries: list[Entry] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostTable:
        if data.get("format") != TABLE_FORMAT:
            raise ValueError(f"not a graphopt cost table (format {data.get('format')!r}, expected {TABLE_FORMAT!r})")
        return cls([_entry(e) for e in data.get("entries", [])])

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict[str, Any]:
        return {"format": TABLE_FORMAT, "entries": [e.to_dict() for e in self.entries]}

    def lookup(self, ep: str, decision: str, cls: OpClass) -> Entry | None:
        covering = [e for e in self.entries if e.ep == ep and e.decision == decision and e.covers(cls)]
        return min(covering, key=lambda e: e.specificity) if covering else None

    def predict(self, ep: str, decision: str, classes: Iterable[OpClass], candidate: str) -> tuple[float | None, list[Entry]]:
        """Predicted time of `candidate` for all these ops (the sum of their per-op times),
        and the entries used; None when any op's class has no entry that lists it."""
        total = 0.0
        used: list[Entry] = []
        for cls in classes:
            entry = self.lookup(ep, decision, cls)
            t = entry.per_op_ms(candidate) if entry is not None else None
            if t is None:
                return None, used
            total += t
            if entry not in used:
                used.append(entry)  # type: ignore[arg-type]
        return total, used


def _entry(data: Mapping[str, Any]) -> Entry:
    return Entry(
        ep=str(data["ep"]), decision=str(data["decision"]), op=str(data["op"]), dtype=str(data["dtype"]),
        match={k: tuple(v) for k, v in dict(data.get("match", {})).items()},
        times_ms={k: float(v) for k, v in dict(data["times_ms"]).items()},
        per=int(data.get("per", 1)), source=str(data.get("source", "")), device=str(data.get("device", "")),
    )


@lru_cache(maxsize=1)
def default_table() -> CostTable:
    return CostTable.load(DEFAULT_TABLE_PATH)
