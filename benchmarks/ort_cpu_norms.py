"""onnxruntime's fused residual norms against the ops they replace (the `skip_norm` decision).

For every shape [1, rows, hidden] of the grid and every variant, single-op models are built
with onnx.helper in each form and timed in onnxruntime (ORT_ENABLE_ALL, as users run them):

* `ln`       com.microsoft.SkipLayerNormalization(a, b, gamma, beta) against Add + LayerNormalization
             (which onnxruntime fuses into the same op) and against Add + Reshape to [rows, hidden] +
             LayerNormalization + Reshape back (`unfused-2d`, which it does not fuse);
* `ln_bias`  ... with the bias input, against Add(a, bias) + Add(., b) + LayerNormalization;
* `ln_sum`   ... with the input+skip sum also used by a later node (the fused op's 4th output), as in
             pre-LN residual streams: both forms end in Add(sum, y), the next residual's Add;
* `ln_bias_sum` both;
* `rms`      com.microsoft.SkipSimplifiedLayerNormalization(a, b, gamma) against Add +
             SimplifiedLayerNormalization (graphopt's unfused form: graphopt.RMSNorm lowered) and
             against Add + the decomposed RMSNorm (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul);
* `rms_sum`  ... with the sum also used by a later node (Add(sum, y)).

Forms are timed interleaved (round-robin, in a new order each round) so that load from other
processes falls on all of them alike; each form's figure is the median over rounds of the
mean of a batch of runs, and the minimum (this machine is shared: the minimum over many short
batches is the figure least moved by other processes, and the one the cost table takes). The ops onnxruntime actually ran after its own optimizer are recorded
per form (so a form that onnxruntime fuses back is visible). Outputs of every form are checked
against the fused one.

    python benchmarks/ort_cpu_norms.py --threads 1 2 --out benchmarks/results/ort_cpu_norms-DATE-MACHINE.json
    python benchmarks/ort_cpu_norms.py --rows 128 --hidden 768 --variants ln --threads 1   # one point
    python benchmarks/ort_cpu_norms.py --provider cuda --threads 1 --out $OUT/ort_cpu_norms-cuda.json   # CUDA provider, io-binding

The `skip_norm` cost-table entries (graphopt/decisions/cost_table.json; classes from
graphopt.decisions.shapes.norm_class) are made from a results file, replacing the table's entries
of the same provider and decision; per class, of the thread counts measured, the figures least
favourable to a change (the decision changes the model only where a change wins at all of them); a
later file's figures replace an earlier one's:

    python benchmarks/ort_cpu_norms.py --entries-from RESULTS.json [MORE.json] --into graphopt/decisions/cost_table.json
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
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphopt.decisions.tune import device_name  # noqa: E402

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
MS = "com.microsoft"
VARIANTS = ("ln", "ln_bias", "ln_sum", "ln_bias_sum", "rms", "rms_sum")
EPS = 1e-5


def _forms(variant: str) -> tuple[str, ...]:
    if variant.startswith("rms"):
        return ("fused", "unfused", "decomposed")
    # Where the sum has no other reader onnxruntime fuses Add + LayerNormalization into
    # SkipLayerNormalization itself; "unfused-2d" normalizes a [rows, hidden] Reshape of the sum,
    # which its SkipLayerNormFusion (a 3-D Add right before the norm) does not match.
    return ("fused", "unfused") if variant.endswith("_sum") else ("fused", "unfused", "unfused-2d")


def build(variant: str, form: str, rows: int, hidden: int, seed: int = 0) -> tuple[bytes, dict[str, np.ndarray]]:
    """One model of `variant` in `form`; returns (model bytes, feeds)."""
    rng = np.random.default_rng(seed)
    shape = [1, rows, hidden]
    rms = variant.startswith("rms")
    with_sum = variant.endswith("_sum")
    with_bias = variant.startswith("ln_bias")
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), "gamma")]
    if not rms:
        inits.append(numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np.float32), "beta"))
    if with_bias:
        inits.append(numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np.float32), "bias"))
    nodes = []
    if form == "fused":
        op = "SkipSimplifiedLayerNormalization" if rms else "SkipLayerNormalization"
        ins = ["a", "b", "gamma"] + ([] if rms else ["beta"]) + (["bias"] if with_bias else [])
        outs = ["y"] + (["", "", "s"] if with_sum else [])
        nodes.append(helper.make_node(op, ins, outs, domain=MS, epsilon=EPS))
    else:
        first = "a"
        if with_bias:
            nodes.append(helper.make_node("Add", ["a", "bias"], ["ab"]))
            first = "ab"
        nodes.append(helper.make_node("Add", [first, "b"], ["s"]))
        if not rms and form == "unfused-2d":
            inits += [numpy_helper.from_array(np.array([-1, hidden], np.int64), "rows_hidden"), numpy_helper.from_array(np.array(shape, np.int64), "shape")]
            nodes += [
                helper.make_node("Reshape", ["s", "rows_hidden"], ["s2d"]),
                helper.make_node("LayerNormalization", ["s2d", "gamma", "beta"], ["y2d"], axis=-1, epsilon=EPS),
                helper.make_node("Reshape", ["y2d", "shape"], ["y"]),
            ]
        elif not rms:
            nodes.append(helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=EPS))
        elif form == "unfused":
            nodes.append(helper.make_node("SimplifiedLayerNormalization", ["s", "gamma"], ["y"], axis=-1, epsilon=EPS))
        else:
            inits += [numpy_helper.from_array(np.array(2.0, np.float32), "two"), numpy_helper.from_array(np.array(EPS, np.float32), "eps"),
                      numpy_helper.from_array(np.array([-1], np.int64), "axes")]
            nodes += [
                helper.make_node("Pow", ["s", "two"], ["sq"]),
                helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
                helper.make_node("Add", ["ms", "eps"], ["mse"]),
                helper.make_node("Sqrt", ["mse"], ["rt"]),
                helper.make_node("Reciprocal", ["rt"], ["inv"]),
                helper.make_node("Mul", ["s", "inv"], ["n"]),
                helper.make_node("Mul", ["n", "gamma"], ["y"]),
            ]
    if with_sum:
        nodes.append(helper.make_node("Add", ["s", "y"], ["z"]))  # the next residual Add reads the sum
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    outputs = [value("z" if with_sum else "y")]
    graph = helper.make_graph(nodes, variant, [value("a"), value("b")], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)], ir_version=8)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("a", "b")}
    return model.SerializeToString(), feeds


def _session(model: bytes, provider: str, threads: int, optimized_path: str | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    if optimized_path:
        options.optimized_model_filepath = optimized_path
    providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    return ort.InferenceSession(model, options, providers=providers)


def _ran_ops(model: bytes, provider: str) -> list[str]:
    """The op types onnxruntime runs after its own graph optimizer."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "opt.onnx")
        _session(model, provider, 1, path)
        return [n.op_type for n in onnx.load(path).graph.node]


def _runner(session: Any, feeds: dict[str, np.ndarray], provider: str) -> Any:
    """One timed run: on CUDA with io-binding (inputs and outputs stay on the device), as users run it."""
    if provider == "CPUExecutionProvider":
        return lambda: session.run(None, feeds)
    import onnxruntime as ort

    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda")
    return lambda: session.run_with_iobinding(binding)


def measure(variant: str, rows: int, hidden: int, provider: str, threads: int, rounds: int, batch_s: float) -> dict[str, Any]:
    forms = _forms(variant)
    built = {f: build(variant, f, rows, hidden) for f in forms}
    sessions = {f: _session(built[f][0], provider, threads) for f in forms}
    outputs = {f: sessions[f].run(None, built[f][1]) for f in forms}
    max_diff = {f: max(float(np.max(np.abs(o - r))) for o, r in zip(outputs[f], outputs["fused"])) for f in forms}
    runs = {f: _runner(sessions[f], built[f][1], provider) for f in forms}
    us, us_median, n = interleaved_us(runs, rounds, batch_s)
    return {
        "variant": variant, "rows": rows, "hidden": hidden, "threads": threads, "runs_per_round": n, "rounds": rounds,
        "us": us, "us_median": us_median, "fused_over_unfused": us["fused"] / us["unfused"], "max_abs_diff_vs_fused": max_diff,
        "ran_ops": {f: _ran_ops(built[f][0], provider) for f in forms},
    }


def interleaved_us(runs: dict[str, Any], rounds: int, batch_s: float) -> tuple[dict[str, float], dict[str, float], int]:
    """Time each form's run interleaved with the others (a new random order each round, so load from
    other processes falls on all alike): per form the minimum and the median over rounds of a batch's
    mean, in microseconds, and the runs per batch (enough for `batch_s` seconds, from a first estimate)."""
    per_run = {}
    for f, run in runs.items():
        t0 = time.perf_counter()
        for _ in range(3):
            run()
        per_run[f] = (time.perf_counter() - t0) / 3
    n = max(1, int(batch_s / max(1e-7, max(per_run.values()))))
    samples: dict[str, list[float]] = {f: [] for f in runs}
    order = list(runs)
    for r in range(rounds):
        random.Random(r).shuffle(order)
        for f in order:
            run = runs[f]
            t0 = time.perf_counter()
            for _ in range(n):
                run()
            samples[f].append((time.perf_counter() - t0) / n * 1e6)
    return {f: min(v) for f, v in samples.items()}, {f: statistics.median(v) for f, v in samples.items()}, n


#: variant -> (op, sum used by other nodes, bias input)
CLASS_OF_VARIANT = {
    "ln": ("SkipLayerNormalization", False, False), "ln_bias": ("SkipLayerNormalization", False, True),
    "ln_sum": ("SkipLayerNormalization", True, False), "ln_bias_sum": ("SkipLayerNormalization", True, True),
    "rms": ("SkipSimplifiedLayerNormalization", False, False), "rms_sum": ("SkipSimplifiedLayerNormalization", True, False),
}


#: candidate name in the cost table -> form name here
CANDIDATE_FORMS = {"fused": "fused", "unfused": "unfused", "unfused-2d": "unfused-2d"}


def _change_ratio(row: dict[str, Any]) -> float:
    """How much faster the best change is than the baseline (unfused) in this row (lower: more)."""
    us = row["us"]
    return min(us[f] / us["unfused"] for c, f in CANDIDATE_FORMS.items() if c != "unfused" and f in us)


def table_entries(docs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """One `skip_norm` entry per (variant, rows, hidden) of the results documents (name, document);
    a later document's figures replace an earlier one's for the same variant, shape and threads."""
    from graphopt.decisions.shapes import ROW_BUCKETS, bucket, norm_class
    from graphopt.decisions.table import Entry

    measured: dict[tuple[str, int, int, int], dict[str, Any]] = {}
    machine: dict[str, Any] = {}
    for name, doc in docs:
        machine = doc["machine"]
        for row in doc["results"]:
            measured[(row["variant"], row["rows"], row["hidden"], row["threads"])] = dict(row, file=name, date=doc["date"][:10])
    device = machine.get("device") or f"cpu-{machine['cores']}core-{machine['cpu']}"
    ep = machine["provider"]
    worst: dict[tuple[str, int, int], dict[str, Any]] = {}
    for (variant, rows, hidden, _), row in measured.items():
        key = (variant, rows, hidden)
        if key not in worst or _change_ratio(row) > _change_ratio(worst[key]):
            worst[key] = row  # the thread count least favourable to any change
    entries = []
    for (variant, rows, hidden), row in sorted(worst.items()):
        op, sum_used, bias = CLASS_OF_VARIANT[variant]
        times = {c: row["us"][f] / 1e3 for c, f in CANDIDATE_FORMS.items() if f in row["us"]}
        same = row["ran_ops"]["fused"] == row["ran_ops"]["unfused"]
        if same:  # onnxruntime fused the unfused form itself: one kernel, any difference is noise
            times["fused"] = times["unfused"] = (times["fused"] + times["unfused"]) / 2
        cls = norm_class(op, "f32", bucket(ROW_BUCKETS, rows), hidden, bias=bias, sum_used=sum_used)
        threads = sorted(t for (v, r, h, t) in measured if (v, r, h) == (variant, rows, hidden))
        source = (f"benchmarks/ort_cpu_norms.py ({row['date']}, {row['file']}), variant {variant}, 1x{rows}x{hidden} f32, "
                  f"onnxruntime {machine['onnxruntime']}, ORT_ENABLE_ALL; the {row['threads']}-thread figures, the less favourable "
                  f"to a change of threads {threads}; unfused ran {'+'.join(row['ran_ops']['unfused'])}"
                  + ("; fused and unfused ran the same kernel: both get the mean of their times" if same else ""))
        entries.append(Entry(ep, "skip_norm", op, "f32", {name: (label,) for name, label in cls.features},
                             {c: round(t, 5) for c, t in times.items()}, per=1, source=source, device=device))
    return entries


def merge_entries(results: list[str], into: str, decision: str = "skip_norm", make_entries: Any = None) -> int:
    """Replace the cost table's `decision` entries of the providers these results files measured by
    the entries `make_entries` (this module's table_entries by default) makes of them."""
    new = (make_entries or table_entries)([(Path(path).name, json.loads(Path(path).read_text())) for path in results])
    table = json.loads(Path(into).read_text())  # edited as JSON: its notes stay
    kept = [e for e in table["entries"] if not (e["decision"] == decision and e["ep"] in {n.ep for n in new})]
    table["entries"] = kept + [e.to_dict() for e in new]
    Path(into).write_text(json.dumps(table, indent=2, ensure_ascii=False) + "\n")
    print(f"{into}: {len(kept)} entries kept, {len(new)} {decision} entries from {', '.join(results)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 128, 1024, 4096])
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 256, 768, 2048, 4096])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--batch-s", type=float, default=0.005, help="seconds of runs per form per round")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--entries-from", nargs="+", help="make cost-table entries from these results files (measures nothing)")
    p.add_argument("--into", default="graphopt/decisions/cost_table.json", help="the cost table --entries-from writes into")
    args = p.parse_args(argv)
    if args.entries_from:
        return merge_entries(args.entries_from, args.into)
    import onnxruntime as ort

    provider = PROVIDERS[args.provider]
    if provider not in ort.get_available_providers():
        print(f"error: {provider} is not available in this onnxruntime", file=sys.stderr)
        return 2
    results = []
    print(f"{'variant':8} {'thr':>3} {'rows':>5} {'hidden':>6}  {'fused us':>9} {'unfused us':>10} {'3rd form':>9}  fused/unfused  unfused ran")
    for threads in args.threads:
        for variant in args.variants:
            for rows in args.rows:
                for hidden in args.hidden:
                    row = measure(variant, rows, hidden, provider, threads, args.rounds, args.batch_s)
                    results.append(row)
                    us = row["us"]
                    third = [f for f in us if f not in ("fused", "unfused")]
                    dec = f"{us[third[0]]:9.1f}" if third else " " * 9
                    print(f"{variant:8} {threads:3d} {rows:5d} {hidden:6d}  {us['fused']:9.1f} {us['unfused']:10.1f} {dec}  "
                          f"{row['fused_over_unfused']:12.2f}x  {'+'.join(row['ran_ops']['unfused'])}", flush=True)
    if args.out:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor())
        doc = {
            "benchmark": "ort_cpu_norms", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
            "machine": {"cpu": cpu, "cores": os.cpu_count(), "device": device_name(provider) if provider != "CPUExecutionProvider" else None, "platform": platform.platform(), "python": platform.python_version(),
                        "onnxruntime": ort.__version__, "onnx": onnx.__version__, "provider": provider,
                        "load_average_at_end": os.getloadavg()},
            "method": "ORT_ENABLE_ALL, inter_op 1; forms interleaved in random order per round; per form `us` is the minimum and "
                      "`us_median` the median over rounds of the mean time of a batch of runs; microseconds per run",
            "results": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
