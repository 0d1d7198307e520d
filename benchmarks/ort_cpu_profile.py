"""Why is graphopt's ort-cpu output of a zoo model slower than the original on onnxruntime's CPU
provider? Per-node time from onnxruntime's own profiler, summed by op type, side by side.

    python benchmarks/ort_cpu_profile.py --models unet-block-dynamo,tf-resnet --threads 4 --out DIR
    python benchmarks/ort_cpu_profile.py --models tf-resnet --variants original,graphopt --rules-off FuseConvAdd
    python benchmarks/ort_cpu_profile.py --models all --variants original,graphopt,onnxscript --graphs-only   # no timing

Per model and variant (original; graphopt --target ort-cpu; onnxruntime's offline output at
ENABLE_ALL; ``original-again``, the original in a second session: the spread of the measurement
itself; on request ``ort-offline-extended`` and ``onnxscript``), all run in a CPU session at
ORT_ENABLE_ALL:

* the op types of the graph onnxruntime actually runs (``optimized_model_filepath``), so a
  fusion onnxruntime makes on the original but not on graphopt's output shows as a count;
  and whether that graph is the original's (same kernels, attributes, weights' shapes and
  wiring): a variant onnxruntime runs as the original cannot be slower by any rewrite;
* the median wall time (runs interleaved between variants, so a busy machine hurts all alike);
* from ``enable_profiling``: the kernel time per run summed by op type (``op_name`` of each
  node's ``kernel_time`` event), the top nodes, and the total.

``--rules-off`` adds a variant ``graphopt-no-RULE`` per named rule (graphopt with that rule
turned off), to bisect which rewrite costs time. Output: ``DIR/ort_cpu_profile.json`` and a
short table per model.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zoo import CACHE_DIR, cached_models, load_inputs  # noqa: E402

VARIANTS = ("original", "graphopt", "ort-offline-all", "original-again")
#: Every variant this script can make.
KNOWN = (*VARIANTS, "ort-offline-extended", "onnxscript")


def _make(variant: str, src: Path, dst: Path) -> Path:
    from zoo_bench import _onnxscript, _ort_offline

    import graphopt

    if variant in ("original", "original-again"):  # the second: the measurement's own spread
        return src
    if variant.startswith("graphopt"):
        off = variant.split("-no-")[1:]
        kwargs: dict[str, Any] = {"disable": off} if off else {}
        graphopt.optimize_file(src, dst, target="ort-cpu", **kwargs)
        return dst
    if variant.startswith("ort-offline-"):
        _ort_offline(src, dst, "cpu", variant.rsplit("-", 1)[1])
        return dst
    if variant == "onnxscript":
        _onnxscript(src, dst)
        return dst
    raise ValueError(variant)


def _wiring(path: Path) -> list[tuple[str, str, list[str]]]:
    """The graph onnxruntime runs, without names: per node (op, attributes, inputs as the
    producing node's index or a weight's shape). Equal lists: the same kernels on the same data."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    weights = {i.name: tuple(i.dims) for i in model.graph.initializer}
    producer = {i.name: "input" for i in model.graph.input}
    nodes = []
    for k, node in enumerate(model.graph.node):
        attrs = repr(sorted((a.name, repr(helper.get_attribute_value(a))) for a in node.attribute))
        ins = [f"w{weights[i]}" if i in weights else producer.get(i, "?") for i in node.input]
        nodes.append((f"{node.domain}.{node.op_type}", attrs, ins))
        for j, out in enumerate(node.output):
            producer[out] = f"n{k}.{j}"
    return nodes


#: `--pin`: the worker threads' affinities (zoo_bench.pin_threads), the same for every session.
_AFFINITIES: str | None = None


def _options(threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if _AFFINITIES:
        options.add_session_config_entry("session.intra_op_thread_affinities", _AFFINITIES)
    return options


def _op_counts(path: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts = collections.Counter(f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    return dict(sorted(counts.items()))


def _kernel_profile(path: Path, feeds: dict[str, np.ndarray], work: Path, runs: int, threads: int) -> dict[str, Any]:
    """Per op type: microseconds per run (median over runs of the summed node times), nodes."""
    import onnxruntime as ort

    options = _options(threads)
    options.enable_profiling = True
    options.profile_file_prefix = str(work / "prof")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(3 + runs):  # the first 3: warm-up, left out below
        session.run(None, feeds)
    trace = json.loads(Path(session.end_profiling()).read_text())
    # A node's kernel event belongs to the model_run event whose span holds it (a node inside a
    # Loop body runs many times in one run).
    starts = sorted(float(e["ts"]) for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run")
    per_run: list[dict[str, float]] = [{} for _ in starts]
    nodes: dict[str, set[str]] = collections.defaultdict(set)
    by_node: dict[str, list[float]] = collections.defaultdict(list)
    for event in trace:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time") or not starts:
            continue
        op = event["args"].get("op_name", "?")
        node = event["name"][: -len("_kernel_time")]
        run = per_run[max(0, bisect.bisect_right(starts, float(event["ts"])) - 1)]
        run[op] = run.get(op, 0.0) + float(event["dur"])
        nodes[op].add(node)
        by_node[f"{op}:{node}"].append(float(event["dur"]))
    per_run = per_run[3:] or per_run  # the warm-up runs
    ops = sorted({op for run in per_run for op in run})
    per_op = {op: statistics.median(run.get(op, 0.0) for run in per_run) for op in ops}
    top = sorted(((statistics.median(v), k) for k, v in by_node.items()), reverse=True)[:12]
    return {
        "us_per_op": dict(sorted(per_op.items(), key=lambda kv: -kv[1])),
        "nodes_per_op": {op: len(nodes[op]) for op in ops},
        "total_us": sum(per_op.values()),
        "top_nodes_us": [[k, round(us, 1)] for us, k in top],
        "runs": len(per_run),
    }


def _wall(paths: dict[str, Path], feeds: dict[str, np.ndarray], rounds: int, runs: int, threads: int) -> dict[str, dict[str, float]]:
    import onnxruntime as ort

    sessions = {v: ort.InferenceSession(str(p), _options(threads), providers=["CPUExecutionProvider"]) for v, p in paths.items()}
    for s in sessions.values():
        for _ in range(5):
            s.run(None, feeds)
    samples: dict[str, list[float]] = {v: [] for v in sessions}
    order = list(sessions)
    for r in range(rounds):
        for v in order[r % len(order):] + order[: r % len(order)]:
            for _ in range(runs):
                t = time.perf_counter()
                sessions[v].run(None, feeds)
                samples[v].append((time.perf_counter() - t) * 1e3)
    return {v: {"median_ms": statistics.median(s), "p10_ms": float(np.percentile(s, 10)), "p90_ms": float(np.percentile(s, 90))}
            for v, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True, help="comma-separated zoo model names")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rules-off", default="", help="comma-separated graphopt rules: a graphopt-no-RULE variant each")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20, help="profiled runs per variant")
    parser.add_argument("--rounds", type=int, default=10, help="wall-time rounds (variants interleaved)")
    parser.add_argument("--pin", action="store_true",
                        help="pin every session's threads to the same cores (see zoo_bench --pin: unpinned, sessions of one "
                             "model in one process can run far apart at more than one thread)")
    parser.add_argument("--graphs-only", action="store_true",
                        help="no timing: only the ops onnxruntime runs per variant and whether they are the original's graph")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m and m != "all"]
    entries = cached_models(args.cache, names or None)
    missing = set(names) - {e.name for e in entries}
    if missing:
        print(f"error: not in the zoo cache {args.cache}: {', '.join(sorted(missing))}", file=sys.stderr)
        return 2
    variants = [v for v in args.variants.split(",") if v] + [f"graphopt-no-{r}" for r in args.rules_off.split(",") if r]
    unknown = [v for v in variants if v not in KNOWN and not v.startswith("graphopt-no-")]
    if unknown or "original" not in variants:
        print(f"error: unknown variants {', '.join(unknown)} (known: {', '.join(KNOWN)}, graphopt-no-RULE; original is needed)"
              if unknown else "error: --variants needs original", file=sys.stderr)
        return 2
    if args.pin:
        global _AFFINITIES
        from zoo_bench import pin_threads

        _AFFINITIES = pin_threads(args.threads)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for entry in entries:
            work = Path(tmp) / entry.name
            work.mkdir()
            feeds = load_inputs(entry)
            paths: dict[str, Path] = {}
            model_result: dict[str, Any] = {"variants": {}}
            for v in variants:
                try:
                    paths[v] = _make(v, entry.path, work / f"{v}.onnx")
                except Exception as error:  # noqa: BLE001 - an anchor that fails on a model is recorded, the run goes on
                    model_result.setdefault("errors", {})[v] = f"{type(error).__name__}: {str(error)[:200]}"
            for v, p in list(paths.items()):
                import onnxruntime as ort

                options = _options(args.threads)
                options.optimized_model_filepath = str(work / f"{v}.ort-optimized.onnx")
                try:
                    ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
                except Exception as error:  # noqa: BLE001 - e.g. an anchor's invalid model
                    model_result.setdefault("errors", {})[v] = f"session: {str(error).strip().splitlines()[0][:200]}"
                    del paths[v]
            if "original" not in paths:
                results[entry.name] = model_result
                _write(args, results, _AFFINITIES is not None)
                continue
            if not args.graphs_only:
                model_result["wall"] = _wall(paths, feeds, args.rounds, 10, args.threads)
            for v, p in paths.items():
                model_result["variants"][v] = {"ops_run": _op_counts(work / f"{v}.ort-optimized.onnx")}
                if not args.graphs_only:
                    vdir = work / f"prof-{v}"
                    vdir.mkdir()
                    model_result["variants"][v]["profile"] = _kernel_profile(p, feeds, vdir, args.runs, args.threads)
            runs_like_original = _wiring(work / "original.ort-optimized.onnx")
            for v in paths:
                model_result["variants"][v]["same_graph_as_original"] = _wiring(work / f"{v}.ort-optimized.onnx") == runs_like_original
            results[entry.name] = model_result
            _write(args, results, _AFFINITIES is not None)  # after every model: a run cut short keeps what it measured
            if args.graphs_only:
                same = [v for v in paths if v != "original" and model_result["variants"][v]["same_graph_as_original"]]
                print(f"{entry.name:30s} runs the original's graph: {', '.join(same) or 'none'}", flush=True)
            else:
                _print(entry.name, model_result)
    return 0


def _write(args: argparse.Namespace, results: dict[str, Any], pinned: bool) -> None:
    if not args.out:
        return
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
           "threads": args.threads, "pinned": pinned, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ort_cpu_profile.json").write_text(json.dumps(out, indent=1))


def _print(name: str, result: dict[str, Any]) -> None:
    variants = list(result["variants"])
    base = result["wall"]["original"]["median_ms"]
    print(f"\n== {name}: wall median ms (/ original) " + ", ".join(
        f"{v} {result['wall'][v]['median_ms']:.3f} ({result['wall'][v]['median_ms'] / base:.3f})" for v in variants))
    print("onnxruntime runs the original's graph (same kernels, same wiring) for: "
          + (", ".join(v for v in variants if v != "original" and result["variants"][v]["same_graph_as_original"]) or "none"))
    ops = sorted({op for v in variants for op in result["variants"][v]["profile"]["us_per_op"]},
                 key=lambda op: -max(result["variants"][v]["profile"]["us_per_op"].get(op, 0) for v in variants))
    print(f"{'op (us/run, nodes)':34s}" + "".join(f"{v[:22]:>24s}" for v in variants))
    for op in ops:
        cells = []
        for v in variants:
            prof = result["variants"][v]["profile"]
            us = prof["us_per_op"].get(op)
            cells.append(f"{us:10.1f} ({prof['nodes_per_op'].get(op, 0):3d})" if us is not None else f"{'-':>16s}")
        print(f"{op:34s}" + "".join(f"{c:>24s}" for c in cells))
    print(f"{'total kernel us':34s}" + "".join(f"{result['variants'][v]['profile']['total_us']:24.1f}" for v in variants))


if __name__ == "__main__":
    raise SystemExit(main())
