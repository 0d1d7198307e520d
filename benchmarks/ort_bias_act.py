"""A GEMM's bias in the activation or in the GEMM (the `bias_act` decision).

graphopt's FuseBiasGelu moves the bias Add between a MatMul and its GELU into the activation
(com.microsoft.BiasGelu, or FastGelu's bias input for the tanh form). onnxruntime's own optimizer
would instead fold that Add into the MatMul (MatMulAddFusion, level 1: Gemm, with Reshapes for
inputs of rank > 2) before its BiasGeluFusion (level 2) sees it. Which is faster depends on the
provider and the shape, so this benchmark times both, as single-block models built with
onnx.helper and run in onnxruntime (ORT_ENABLE_ALL, as users run them):

* `fused`    MatMul(x [1, rows, K], W [K, N]) -> BiasGelu(., bias)   (variant `gelu`, erf GELU)
             MatMul -> FastGelu(., bias)                               (variant `gelu_tanh`)
* `unfused`  MatMul -> Add(., bias) -> com.microsoft.Gelu / FastGelu  (onnxruntime makes the
             MatMul + Add a Gemm)

K is N / 4 (at least 16): the up-projection of a transformer's or ConvNeXt's MLP. Forms are
timed interleaved in random order per round (ort_cpu_norms.py's method: per form the minimum
over rounds of a batch's mean, and the median); the ops onnxruntime ran are recorded per form,
and the outputs compared.

    python benchmarks/ort_bias_act.py --threads 1 2 --out benchmarks/results/ort_bias_act-DATE-MACHINE.json
    python benchmarks/ort_bias_act.py --provider cuda --threads 1 --out $OUT/ort_bias_act-cuda.json   # io-binding
    python benchmarks/ort_bias_act.py --entries-from RESULTS.json [MORE.json] --into graphopt/decisions/cost_table.json

The entries (classes from graphopt.decisions.shapes.bias_act_class: rows and N buckets) replace the
table's `bias_act` entries of the same provider; per class, of the thread counts measured, the
figures least favourable to the fused form (the decision fuses only where that wins at all of them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ort_cpu_norms import PROVIDERS, _ran_ops, _runner, _session, interleaved_us, merge_entries  # noqa: E402

from graphopt.decisions.tune import device_name  # noqa: E402

MS = "com.microsoft"
VARIANTS = {"gelu": "BiasGelu", "gelu_tanh": "FastGelu"}  # variant -> the fused op
FORMS = ("fused", "unfused")


def inner_size(n: int) -> int:
    """K of the measured GEMM: an MLP's up-projection (N = 4 K)."""
    return max(16, n // 4)


def build(variant: str, form: str, rows: int, n: int, dtype: str = "f32", seed: int = 0) -> tuple[bytes, dict[str, np.ndarray]]:
    """MatMul + bias + GELU over [1, rows, K] x [K, N] in `form`; returns (model bytes, feeds)."""
    rng = np.random.default_rng(seed)
    k = inner_size(n)
    np_type, onnx_type = (np.float16, TensorProto.FLOAT16) if dtype == "f16" else (np.float32, TensorProto.FLOAT)
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_type), "W"),
             numpy_helper.from_array((0.1 * rng.standard_normal(n)).astype(np_type), "bias")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"])]
    act = VARIANTS[variant]
    if form == "fused":
        nodes.append(helper.make_node(act, ["h", "bias"], ["y"], domain=MS))
    else:
        nodes.append(helper.make_node("Add", ["h", "bias"], ["hb"]))
        nodes.append(helper.make_node("Gelu" if act == "BiasGelu" else "FastGelu", ["hb"], ["y"], domain=MS))
    graph = helper.make_graph(nodes, f"{variant}_{form}", [helper.make_tensor_value_info("x", onnx_type, [1, rows, k])],
                              [helper.make_tensor_value_info("y", onnx_type, [1, rows, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)], ir_version=8)
    return model.SerializeToString(), {"x": rng.standard_normal([1, rows, k]).astype(np_type)}


def measure(variant: str, rows: int, n: int, provider: str, threads: int, rounds: int, batch_s: float, dtype: str = "f32") -> dict[str, Any]:
    built = {f: build(variant, f, rows, n, dtype) for f in FORMS}
    sessions = {f: _session(built[f][0], provider, threads) for f in FORMS}
    outputs = {f: sessions[f].run(None, built[f][1])[0].astype(np.float32) for f in FORMS}
    max_diff = float(np.max(np.abs(outputs["fused"] - outputs["unfused"])))
    runs = {f: _runner(sessions[f], built[f][1], provider) for f in FORMS}
    us, us_median, batch = interleaved_us(runs, rounds, batch_s)
    return {
        "variant": variant, "dtype": dtype, "rows": rows, "n": n, "k": inner_size(n), "threads": threads, "runs_per_round": batch,
        "rounds": rounds, "us": us, "us_median": us_median,
        "fused_over_unfused": us["fused"] / us["unfused"], "max_abs_diff": max_diff,
        "ran_ops": {f: _ran_ops(built[f][0], provider) for f in FORMS},
    }


def table_entries(docs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """One `bias_act` entry per provider and (variant, dtype, rows, N) of the results documents
    (name, document). Per class, of every machine and thread count measured on that provider, the
    figures least favourable to the fused form; a later document's figures replace an earlier
    one's for the same machine, point and thread count."""
    from graphopt.decisions.shapes import ROW_BUCKETS, bias_act_class, bucket
    from graphopt.decisions.table import Entry

    measured: dict[tuple[str, str, str, str, int, int, int], dict[str, Any]] = {}
    for name, doc in docs:
        machine = doc["machine"]
        ep = machine["provider"]
        device = machine.get("device") or f"cpu-{machine['cores']}core-{machine['cpu']}"
        for row in doc["results"]:
            key = (ep, device, row["variant"], row.get("dtype", "f32"), row["rows"], row["n"], row["threads"])
            measured[key] = dict(row, file=name, date=doc["date"][:10], device=device, onnxruntime=machine["onnxruntime"])
    worst: dict[tuple[str, str, str, int, int], dict[str, Any]] = {}
    for (ep, _, variant, dtype, rows, n, _), row in measured.items():
        key = (ep, variant, dtype, rows, n)
        if key not in worst or row["fused_over_unfused"] > worst[key]["fused_over_unfused"]:
            worst[key] = row  # the machine and thread count least favourable to the fused form
    entries = []
    for (ep, variant, dtype, rows, n), row in sorted(worst.items()):
        op = VARIANTS[variant]
        times = {f: row["us"][f] / 1e3 for f in FORMS}
        same = row["ran_ops"]["fused"] == row["ran_ops"]["unfused"]
        if same:  # onnxruntime made one graph of both: any difference is noise
            times["fused"] = times["unfused"] = (times["fused"] + times["unfused"]) / 2
        cls = bias_act_class(op, dtype, bucket(ROW_BUCKETS, rows), n)
        runs = sorted({f"{d} at {t} thread(s)" for (e, d, v, dt, r, nn, t) in measured if (e, v, dt, r, nn) == (ep, variant, dtype, rows, n)})
        source = (f"benchmarks/ort_bias_act.py ({row['date']}, {row['file']}), variant {variant}, 1x{rows}x{row['k']} @ {row['k']}x{n} {dtype}, "
                  f"onnxruntime {row['onnxruntime']}, ORT_ENABLE_ALL; the {row['threads']}-thread figures of {row['device']}, the least "
                  f"favourable to the fused form of {'; '.join(runs)}; fused ran {'+'.join(row['ran_ops']['fused'])}, "
                  f"unfused ran {'+'.join(row['ran_ops']['unfused'])}" + ("; the same graph: both get the mean" if same else ""))
        entries.append(Entry(ep, "bias_act", op, dtype, {name: (label,) for name, label in cls.features},
                             {c: round(t, 5) for c, t in times.items()}, per=1, source=source, device=row["device"]))
    return entries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 128, 1024, 4096])
    p.add_argument("--n", type=int, nargs="+", default=[64, 256, 768, 2048, 4096], help="the GEMM's N (the activation's width)")
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    p.add_argument("--dtypes", nargs="+", choices=("f32", "f16"), default=["f32"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--batch-s", type=float, default=0.005, help="seconds of runs per form per round")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--entries-from", nargs="+", help="make cost-table entries from these results files (measures nothing)")
    p.add_argument("--into", default="graphopt/decisions/cost_table.json", help="the cost table --entries-from writes into")
    args = p.parse_args(argv)
    if args.entries_from:
        return merge_entries(args.entries_from, args.into, "bias_act", table_entries)
    import onnxruntime as ort

    provider = PROVIDERS[args.provider]
    if provider not in ort.get_available_providers():
        print(f"error: {provider} is not available in this onnxruntime", file=sys.stderr)
        return 2
    if provider != "CPUExecutionProvider":
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # the CUDA and cuDNN libraries torch's install has
        probe = _session(build("gelu", "fused", 1, 64)[0], provider, 1)
        if probe.get_providers()[0] != provider:
            print(f"error: the session fell back to {probe.get_providers()[0]}", file=sys.stderr)
            return 2
    device = device_name(provider) if provider != "CPUExecutionProvider" else None
    print(f"device: {device or platform.processor() or 'cpu'}; onnxruntime {ort.__version__}")
    results = []
    print(f"{'variant':9} {'dtype':5} {'thr':>3} {'rows':>5} {'N':>5}  {'fused us':>9} {'unfused us':>10}  fused/unfused  fused ran / unfused ran")
    for threads in args.threads:
        for dtype in args.dtypes:
            for variant in args.variants:
                for rows in args.rows:
                    for n in args.n:
                        row = measure(variant, rows, n, provider, threads, args.rounds, args.batch_s, dtype)
                        results.append(row)
                        us = row["us"]
                        print(f"{variant:9} {dtype:5} {threads:3d} {rows:5d} {n:5d}  {us['fused']:9.1f} {us['unfused']:10.1f}  "
                              f"{row['fused_over_unfused']:12.3f}x  {'+'.join(row['ran_ops']['fused'])} / {'+'.join(row['ran_ops']['unfused'])}",
                              flush=True)
    if args.out:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor())
        doc = {
            "benchmark": "ort_bias_act", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
            "machine": {"cpu": cpu, "cores": os.cpu_count(), "device": device, "platform": platform.platform(), "python": platform.python_version(),
                        "onnxruntime": ort.__version__, "onnx": onnx.__version__, "provider": provider, "load_average_at_end": os.getloadavg()},
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
