"""How far apart do sessions of the *same* model run in one process on onnxruntime's CPU provider?

zoo_bench times every variant of a model in its own session, all in one process. If two
sessions of one model already differ, a ratio between variants that small is no result. For
each model, `--sessions` sessions of the original are made and timed interleaved (blocks of
runs in a new order each round), in each configuration of intra-op thread spinning
(`session.intra_op.allow_spinning`) and pinning (`--pin` of zoo_bench: the calling thread on the
first CPU, every session's worker threads on the same next ones):

    python benchmarks/ort_session_spread.py --models resnet-dynamo,tf-resnet --threads 4 --out DIR

Prints per configuration the median of each session and max/min, and writes
DIR/ort_session_spread.json. Pinning is set once per process, so each configuration runs in a
subprocess of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from zoo import CACHE_DIR, cached_models, load_inputs  # noqa: E402

CONFIGS = (("spin", False), ("no-spin", False), ("spin", True), ("no-spin", True))


def measure(model: str, cache: Path, threads: int, spin: bool, pin: bool, sessions: int, rounds: int, block_s: float) -> dict[str, Any]:
    import onnxruntime as ort
    from zoo_bench import pin_threads

    entry = cached_models(cache, [model])[0]
    feeds = load_inputs(entry)
    affinities = pin_threads(threads) if pin else None

    def session() -> Any:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        if affinities:
            options.add_session_config_entry("session.intra_op_thread_affinities", affinities)
        return ort.InferenceSession(str(entry.path), options, providers=["CPUExecutionProvider"])

    made = [session() for _ in range(sessions)]
    for s in made:
        for _ in range(5):
            s.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(5):
        made[0].run(None, feeds)
    runs = max(5, int(block_s / max((time.perf_counter() - t0) / 5, 1e-6)))
    samples: list[list[float]] = [[] for _ in made]
    order = np.random.default_rng(0)
    for _ in range(rounds):
        for k in order.permutation(sessions):
            for _ in range(runs):
                t = time.perf_counter()
                made[k].run(None, feeds)
                samples[k].append((time.perf_counter() - t) * 1e3)
    medians = [statistics.median(s) for s in samples]
    return {"model": model, "threads": threads, "spin": spin, "pin": pin, "pinned": affinities is not None,
            "runs_per_block": runs, "rounds": rounds, "median_ms": medians, "max_over_min": max(medians) / min(medians)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block-s", type=float, default=0.02, help="seconds of runs of one session in a row")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: model,spin,pin -> JSON on stdout
    args = parser.parse_args(argv)
    if args.one:
        model, spin, pin = args.one.split(",")
        row = measure(model, args.cache, args.threads, spin == "spin", pin == "pin", args.sessions, args.rounds, args.block_s)
        print("@@ROW@@" + json.dumps(row))
        return 0
    models = [m for m in args.models.split(",") if m]
    missing = set(models) - {e.name for e in cached_models(args.cache, models)}
    if missing:
        print(f"error: not in the zoo cache {args.cache}: {', '.join(sorted(missing))}", file=sys.stderr)
        return 2
    rows = []
    for model in models:
        for spin, pin in CONFIGS:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--models", model, "--cache", str(args.cache), "--threads", str(args.threads),
                   "--sessions", str(args.sessions), "--rounds", str(args.rounds), "--block-s", str(args.block_s),
                   "--one", f"{model},{spin},{'pin' if pin else 'free'}"]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            found = [line for line in proc.stdout.splitlines() if line.startswith("@@ROW@@")]
            if not found:
                print(f"{model} {spin} pin={pin}: failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
                continue
            row = json.loads(found[-1][len("@@ROW@@"):])
            rows.append(row)
            print(f"{model:28s} threads={args.threads} {spin:8s} {'pinned' if row['pinned'] else 'free':6s} sessions: "
                  + " ".join(f"{m:.3f}" for m in row["median_ms"]) + f"  max/min {row['max_over_min']:.3f}", flush=True)
            if args.out:  # after every row: a run cut short keeps what it measured
                args.out.mkdir(parents=True, exist_ok=True)
                doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv), "rows": rows}
                (args.out / "ort_session_spread.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
