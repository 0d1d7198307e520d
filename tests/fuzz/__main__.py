"""Keep-going fuzzing: run many examples, keep every failure, print a summary.

The pytest long profile (tests/test_fuzz_differential.py, GRAPHOPT_FUZZ=long) stops at
the first failure and shrinks it; this runner keeps going, so one long run finds every
kind of failure at once, and saves each failing model (ONNX file and text) for study:

    PYTHONPATH=.:tests python -m fuzz --examples 4000 --out /tmp/fuzz-failures [--motif attention]

It prints one line per failure as it happens, then the counts (examples, targets
compared, rules fired) and the distinct failure messages. Exit status 1 if anything failed.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path

import onnx
from hypothesis import HealthCheck, Phase, given, settings

from fuzz.differential import TARGETS, check_target, reference_outputs
from fuzz.graphs import MOTIFS, FuzzCase, fuzz_cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"), help="folder for failing models")
    parser.add_argument("--motif", action="append", choices=sorted(MOTIFS), help="only these motifs (repeatable)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stats: Counter[str] = Counter()
    fired: Counter[str] = Counter()
    failures: dict[str, int] = {}
    started = time.perf_counter()

    @settings(max_examples=args.examples, database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(fuzz_cases(args.motif))
    def run(case: FuzzCase) -> None:
        stats["examples"] += 1
        reference = reference_outputs(case)
        if reference is None:
            stats["invalid (discarded)"] += 1
            return
        for target in TARGETS:
            try:
                outcome = check_target(case, target, reference)
            except AssertionError as error:
                message = str(error)
                first = message.splitlines()[0]
                kind = re.sub(r"graphopt-fuzz-\w+|\d+", "#", first)[:200]  # one entry per kind, not per node name
                failures[kind] = failures.get(kind, 0) + 1
                stem = args.out / f"{len(failures):03d}-{sum(failures.values()):04d}-{target}"
                onnx.save(case.model, f"{stem}.onnx")
                Path(f"{stem}.txt").write_text(message)
                print(f"FAIL {stem.name}: {first[:300]}", flush=True)
                continue
            stats[f"{target}: {'refused (GraphoptError)' if outcome.rejected else 'compared' if outcome.compared else 'structural checks only'}"] += 1
            if outcome.known_issue:
                stats[f"{target}: known issue {outcome.known_issue}"] += 1
            if outcome.runtime_deviation:
                stats[f"{target}: onnxruntime departs from the ONNX reference (rewrites spec-correct)"] += 1
                print(f"DEVIATION [{target}] {outcome.runtime_deviation[:200]} (rewrites: {outcome.applied})", flush=True)
            fired.update(set(outcome.applied))

    run()
    print(f"{stats['examples']} examples in {time.perf_counter() - started:.0f} s")
    for key, count in sorted(stats.items()):
        print(f"  {key}: {count}")
    print(f"rules fired (in how many of the example x target runs): {dict(fired.most_common())}")
    for first, count in failures.items():
        print(f"FAILED x{count}: {first}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
