"""The skip_norm decision on whole zoo models, CPU provider: the original, graphopt's ort-cpu output
with the residual norms fused (what it emitted before the decision: a cost table in which the fused
ops win) and graphopt's default ort-cpu output (the shipped table decides), timed interleaved.

    python benchmarks/skip_norm_zoo.py --zoo benchmarks/.zoo --models unet-block-dynamo,bert-dynamo --threads 1 \\
        --out benchmarks/results/skip_norm_zoo-DATE-MACHINE.json

The zoo is built by `python -m benchmarks.zoo` (benchmarks/README.md); each model's inputs.npz
are its feeds. ORT_ENABLE_ALL, inter_op 1; per variant the minimum and the median over rounds of
the mean of a batch of runs (the minimum is the figure least moved by other processes). On a shared
machine `--threads 1 --clock thread` times this thread's CPU time instead of the wall clock.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import graphopt  # noqa: E402
from graphopt.decisions import CostTable, Entry, default_table  # noqa: E402

SKIP_OPS = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")


def fused_wins_table() -> CostTable:
    """The shipped table with the skip_norm entries replaced by 'fused wins everywhere'."""
    kept = [e for e in default_table().entries if e.decision != "skip_norm"]
    forced = [Entry("CPUExecutionProvider", "skip_norm", op, dtype, {}, {"fused": 0.5, "unfused": 1.0}, source="forced")
              for op in SKIP_OPS for dtype in ("f32", "f16")]
    return CostTable(kept + forced)


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def bench(name: str, zoo: Path, threads: int, rounds: int, batch_s: float, clock: str = "wall") -> dict[str, Any]:
    original = onnx.load(str(zoo / name / "model.onnx"))
    with np.load(zoo / name / "inputs.npz") as data:
        feeds = {k: data[k] for k in data.files}
    fused, _ = graphopt.optimize(original, target="ort-cpu", cost_table=fused_wins_table())
    default, report = graphopt.optimize(original, target="ort-cpu")
    variants = {"original": original, "graphopt-fused-norms": fused, "graphopt": default}
    sessions = {k: _session(m.SerializeToString(), threads) for k, m in variants.items()}
    reference = sessions["original"].run(None, feeds)
    max_diff = {k: max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) for a, b in zip(s.run(None, feeds), reference))
                for k, s in sessions.items()}
    t0 = time.perf_counter()
    for s in sessions.values():
        s.run(None, feeds)
    n = max(1, int(batch_s / max(1e-6, (time.perf_counter() - t0) / len(sessions))))
    samples: dict[str, list[float]] = {k: [] for k in sessions}
    order = list(sessions)
    # "thread": the CPU time of this thread, which runs the whole graph at one intra-op thread:
    # time the process spent waiting for a core held by another process is not counted.
    now = time.thread_time if clock == "thread" else time.perf_counter
    for r in range(rounds):
        random.Random(r).shuffle(order)
        for k in order:
            t0 = now()
            for _ in range(n):
                sessions[k].run(None, feeds)
            samples[k].append((now() - t0) / n * 1e3)
    ms = {k: min(v) for k, v in samples.items()}
    skip = [d for d in report.decisions if d.kind == "skip_norm"]
    return {
        "model": name, "threads": threads, "clock": clock, "runs_per_round": n, "rounds": rounds, "ms": ms,
        "ms_median": {k: statistics.median(v) for k, v in samples.items()},
        "vs_original": {k: v / ms["original"] for k, v in ms.items()}, "max_abs_diff_vs_original": max_diff,
        "skip_norm_decisions": {c: sum(d.chosen == c for d in skip) for c in ("fused", "unfused", "unfused-2d")},
        "fused_norm_nodes": {k: sum(n.op_type in SKIP_OPS for n in m.graph.node) for k, m in variants.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zoo", type=Path, default=Path("benchmarks/.zoo"))
    p.add_argument("--models", required=True, help="comma-separated zoo model names")
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--batch-s", type=float, default=0.05)
    p.add_argument("--clock", choices=["wall", "thread"], default="wall",
                   help="thread: this thread's CPU time (only with --threads 1; robust on a shared machine)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.clock == "thread" and args.threads != [1]:
        print("error: --clock thread needs --threads 1 (other threads' time is not counted)", file=sys.stderr)
        return 2
    import onnxruntime as ort

    missing = [m for m in args.models.split(",") if not (args.zoo / m / "model.onnx").exists()]
    if missing:
        print(f"error: not in the zoo at {args.zoo}: {', '.join(missing)}", file=sys.stderr)
        return 2
    results = []
    print(f"{'model':28} {'thr':>3} {'original ms':>11} {'fused norms':>11} {'graphopt':>9}  decisions (fused/unfused/unfused-2d)")
    for threads in args.threads:
        for name in args.models.split(","):
            row = bench(name, args.zoo, threads, args.rounds, args.batch_s, args.clock)
            results.append(row)
            ms, ratio, dec = row["ms"], row["vs_original"], row["skip_norm_decisions"]
            print(f"{name:28} {threads:3d} {ms['original']:11.3f} {ms['graphopt-fused-norms']:7.3f} {ratio['graphopt-fused-norms']:.2f}x "
                  f"{ms['graphopt']:7.3f} {ratio['graphopt']:.2f}x  {dec['fused']}/{dec['unfused']}/{dec['unfused-2d']}", flush=True)
    if args.out:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor())
        doc = {
            "benchmark": "skip_norm_zoo", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
            "machine": {"cpu": cpu, "cores": os.cpu_count(), "onnxruntime": ort.__version__, "load_average_at_end": os.getloadavg()},
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
