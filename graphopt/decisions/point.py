"""The decision point: every rewrite that can cost time is chosen here.

A pass proposes a decision: its candidates (one of them the *baseline*, the form that
changes nothing at run time), the shape classes of the ops it is about, and, for
`--tune`, a way to build each candidate as a runnable model. The decision point chooses:

1. a forced choice (an explicit user option) is taken as it is;
2. with `tune` on and the target's execution provider present, every candidate is timed
   there (`graphopt.decisions.tune`; cached) and the fastest wins, if it beats the
   baseline by more than the noise margin;
3. otherwise the shipped cost table predicts each candidate's time from its shape classes;
   a candidate replaces the baseline only when it is predicted faster, by more than the
   margin, for every op it touches and every batch size the model allows. A class the
   table has no entry for predicts nothing, and the baseline stays.

The baseline is the model as it came in (or as the decisions before this one left it):
a decision never needs evidence to leave the model alone, only to change it.

Each choice becomes a `DecisionRecord` in the report, with every candidate's predicted
and measured time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from graphopt.decisions.shapes import OpClass
from graphopt.decisions.table import CostTable, Entry, default_table
from graphopt.decisions.tune import EP_OF_TARGET, OrtTimer, Timer, TuneCache, device_name, provider_present
from graphopt.report.sections import Alternative, DecisionRecord

__all__ = ["DecisionPoint", "Build", "NOISE_MARGIN", "signature_of"]

#: A change must be predicted (or measured) this much faster than the baseline: the
#: run-to-run noise of the GPU measurements (about 2-3 %) is no evidence.
NOISE_MARGIN = 0.03

#: Builds one candidate as a runnable model: candidate -> (model bytes, feeds).
Build = Callable[[str], tuple[bytes, Mapping[str, np.ndarray]]]

#: Where the table's time of (one op's class, candidate) is read: (decision, candidate) pairs,
#: tried in order. By default a decision reads its own entries; the layout decision reads an
#: NCHW convolution's time in the form the fused_conv decision left it (see passes/layout.py).
Readings = Callable[[OpClass, str], Sequence[tuple[str, str]]]


def signature_of(*parts: Any) -> str:
    """A short stable key for a decision's site (op, attributes, shapes, dtype; or a model's bytes)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


@dataclass
class DecisionPoint:
    target: str
    table: CostTable = field(default_factory=default_table)
    tune: bool = False
    timer: Timer | None = None
    cache: TuneCache | None = None
    margin: float = NOISE_MARGIN
    records: list[DecisionRecord] = field(default_factory=list)
    #: How many candidates were timed (not found in the cache) in this run.
    timed: int = 0

    @property
    def ep(self) -> str | None:
        return EP_OF_TARGET.get(self.target)

    @cached_property
    def can_tune(self) -> bool:
        return bool(self.tune and self.ep and provider_present(self.ep))

    def choose(
        self,
        kind: str,
        site: str,
        candidates: Sequence[str],
        baseline: str,
        worlds: Sequence[Sequence[OpClass]] | None,
        *,
        forced: str | None = None,
        build: Build | None = None,
        signature: str = "",
        readings: Readings | None = None,
    ) -> DecisionRecord:
        """Choose among `candidates` (baseline included); `worlds` are the shape classes of the
        ops concerned, once per batch size the model allows (None: unknown). Returns the
        record (also kept in `records`); its `chosen` is the answer."""
        assert baseline in candidates
        predicted, sources, missing = self._predict(kind, candidates, worlds, readings)
        alternatives = [Alternative(c, predicted.get(c), None, sources.get(c, "")) for c in candidates]
        record = DecisionRecord(kind, site, baseline, baseline, "no_entry", "", alternatives)
        self.records.append(record)
        if forced is not None:
            record.chosen, record.basis, record.reason = forced, "forced", "chosen by an explicit option"
            return record
        if self.can_tune and build is not None:
            self._measure(record, kind, candidates, baseline, build, signature)
            return record
        self._from_table(record, candidates, baseline, worlds, missing, readings)
        if self.tune and not self.can_tune:
            record.reason += f" (--tune: {self.ep or 'no execution provider'} is not available here, so nothing was timed)"
        return record

    # ------------------------------------------------------------------ the table
    def _predict(
        self, kind: str, candidates: Sequence[str], worlds: Sequence[Sequence[OpClass]] | None, readings: Readings | None = None
    ) -> tuple[dict[str, float], dict[str, str], list[str]]:
        """Per candidate: the predicted time in the first world (if every world has one), the
        entries' sources; and the classes no entry covers."""
        predicted: dict[str, float] = {}
        sources: dict[str, str] = {}
        missing: list[str] = []
        if not worlds or self.ep is None:
            return predicted, sources, missing
        for candidate in candidates:
            totals: list[float] = []
            used: list[Entry] = []
            for world in worlds:
                total, entries = self._predict_world(kind, world, candidate, readings)
                used.extend(e for e in entries if e not in used)
                if total is None:
                    break
                totals.append(total)
            if len(totals) == len(worlds):
                predicted[candidate] = totals[0]
            if used:
                sources[candidate] = "; ".join(dict.fromkeys(e.source for e in used))
        for world in worlds:
            for cls in world:
                if self.table.lookup(self.ep, kind, cls) is None and cls.key() not in missing:
                    missing.append(cls.key())
        return predicted, sources, missing

    def _predict_world(
        self, kind: str, world: Sequence[OpClass], candidate: str, readings: Readings | None
    ) -> tuple[float | None, list[Entry]]:
        """The candidate's predicted time for one world's ops (None if an op has no reading)."""
        assert self.ep is not None
        if readings is None:
            return self.table.predict(self.ep, kind, world, candidate)
        total = 0.0
        used: list[Entry] = []
        for cls in world:
            for decision, name in readings(cls, candidate):
                t, entries = self.table.predict(self.ep, decision, [cls], name)
                if t is not None:
                    break
            else:
                return None, used
            total += t
            used.extend(e for e in entries if e not in used)
        return total, used

    def _world_totals(
        self, kind: str, worlds: Sequence[Sequence[OpClass]], candidate: str, readings: Readings | None
    ) -> list[float] | None:
        assert self.ep is not None
        totals = []
        for world in worlds:
            total, _ = self._predict_world(kind, world, candidate, readings)
            if total is None:
                return None
            totals.append(total)
        return totals

    def _from_table(
        self,
        record: DecisionRecord,
        candidates: Sequence[str],
        baseline: str,
        worlds: Sequence[Sequence[OpClass]] | None,
        missing: list[str],
        readings: Readings | None,
    ) -> None:
        ops = sum(len(w) for w in worlds[:1]) if worlds else 0
        if not worlds or self.ep is None:
            record.reason = "the shape classes of the ops concerned are unknown: keeping the model as it is"
            return
        base = self._world_totals(record.kind, worlds, baseline, readings)
        if base is None:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            record.reason = f"no measured entry for {shown or 'these ops'} on {self.ep}: keeping the model as it is"
            return
        record.basis = "table"
        best, best_total = baseline, base[0]
        losers = []
        for candidate in candidates:
            if candidate == baseline:
                continue
            totals = self._world_totals(record.kind, worlds, candidate, readings)
            if totals is None:
                continue
            if all(t < b * (1 - self.margin) for t, b in zip(totals, base)):
                if totals[0] < best_total:
                    best, best_total = candidate, totals[0]
            else:
                losers.append(candidate)
        record.chosen = best
        batches = " in every shape class the model's symbolic dimensions allow" if len(worlds) > 1 else ""
        if best != baseline:
            record.reason = f"predicted {best_total:.3g} ms against {base[0]:.3g} ms for {baseline} over {ops} op(s){batches}"
        elif losers:
            record.reason = f"{', '.join(losers)} predicted no faster than {baseline} (by more than {self.margin:.0%}){batches}"
        else:
            record.reason = f"no other candidate has a measured entry for these ops: keeping {baseline}"

    # ------------------------------------------------------------------ --tune
    def _measure(self, record: DecisionRecord, kind: str, candidates: Sequence[str], baseline: str, build: Build, signature: str) -> None:
        import onnxruntime as ort

        assert self.ep is not None
        timer = self.timer or OrtTimer()
        cache = self.cache or TuneCache()
        device = device_name(self.ep)
        measured: dict[str, float] = {}
        failed: list[str] = []
        hits = 0
        for alt in record.alternatives:
            key = f"{kind}|{signature}|{alt.candidate}|{self.ep}|{device}|onnxruntime {ort.__version__}"
            found = cache.get(key) if signature else None
            cached = found is not None
            ms = found if found is not None else 0.0
            if cached:
                hits += 1
            else:
                try:
                    model, feeds = build(alt.candidate)
                    ms = timer(model, feeds, self.ep)
                except Exception as error:  # noqa: BLE001 - a candidate that cannot run simply loses
                    failed.append(f"{alt.candidate} ({str(error).splitlines()[0][:120] if str(error) else type(error).__name__})")
                    continue
                self.timed += 1
                if signature:
                    cache.put(key, ms)
            alt.measured_ms = ms
            alt.source = f"measured on {self.ep} ({device})" + (", from the cache" if cached else "")
            measured[alt.candidate] = ms
        record.basis = "measured"
        base = measured.get(baseline)
        if base is None:
            record.chosen = baseline
            record.reason = f"the baseline {baseline} could not be timed: keeping it" + (f"; failed: {'; '.join(failed)}" if failed else "")
            return
        best = min(measured, key=lambda c: measured[c])
        record.chosen = best if measured[best] < base * (1 - self.margin) else baseline
        where = f"on {self.ep} ({device})" + (f", {hits} from the cache" if hits else "")
        if record.chosen != baseline:
            record.reason = f"measured {measured[best]:.3g} ms against {base:.3g} ms for {baseline} {where}"
        else:
            record.reason = f"nothing measured faster than {baseline} ({base:.3g} ms) by more than {self.margin:.0%} {where}"
        if failed:
            record.reason += f"; could not run: {'; '.join(failed)}"
