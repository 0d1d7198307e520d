"""Measure the cost table of graphopt's decisions (graphopt/decisions/cost_table.json).

For every shape class the table knows (graphopt/decisions/shapes.py: convolution kind and
kernel, channel bucket, batch 1 or N) and each dtype, a synthetic block of `--depth`
convolutions of that class (Conv + bias + Relu, chained) is optimized by graphopt in every
candidate form of each decision, and each form is timed in onnxruntime on the provider:

* `layout` (CUDA only): `nchw` (graphopt's NCHW output: FusedConv in float32),
  `nhwc-add` (NhwcConv, bias as an Add) and `nhwc-kernel` (NhwcConv with its bias), the
  Transposes at the block's two ends included;
* `fused_conv` (float32; CUDA and CPU): `FusedConv` and `Conv+activation` (the
  conv-activation rules left out);
* `precision` (float32 blocks, `--decisions precision`): the block as graphopt writes it
  with `--precision fp16` (its convolutions forced to fp16: `precision_convs="low"`), the
  Casts at the block's float32 input and output included, in NCHW (`fp16`) and NHWC
  (`fp16-nhwc`: the faster of the NhwcConv bias forms), against the float32 block in NCHW
  as Conv + activation (`fp32`, what an fp16 run keeps when the convolutions stay float32)
  and NHWC (`fp32-nhwc`). graphopt/passes/precision_decision.py reads each candidate in
  the layout the layout decision will give it. On the CPU provider only the NCHW forms
  run (a check of the script, not figures for the table: ort-cpu has no fp16 Conv).

Every form's output is compared with the NCHW form's (a form that differs is reported and
left out of the table). Sessions run with ORT_ENABLE_ALL; on CUDA inputs and outputs stay
on the device (io-binding). Medians of `--runs` runs after `--warmup`.

    python benchmarks/decisions_bench.py --out $OUT                 # GPU: CUDA provider, ~3-4 min on an H100/H200
    python benchmarks/decisions_bench.py --decisions precision --dtypes f32 --kinds dense1,dense3,dense7,depthwise3,depthwise5,grouped3 \
        --budget-s 140 --out $OUT              # GPU: the precision entries, < 3 min
    python benchmarks/decisions_bench.py --provider cpu --channels 16 --batches 1 --kinds dense3 --runs 5 --out /tmp/db   # CPU check

Writes `--out/decisions_bench-<provider>.json` (environment, every timing) and
`--out/cost_table.json` (the measured entries, in the shipped table's format). To ship them:

    python benchmarks/decisions_bench.py --merge $OUT/cost_table.json --into graphopt/decisions/cost_table.json

(an entry for the same provider, decision, op, dtype and shape class is replaced, others are
added; the whole-model entries from benchmarks/results stay, less specific, behind them).
`--budget-s` stops measuring (and writes what it has) before the device's time runs out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphopt.decisions.shapes import batch_buckets, channel_bucket  # noqa: E402
from graphopt.decisions.table import TABLE_FORMAT, CostTable, Entry  # noqa: E402

#: kind label -> (convolution kind, kernel size)
KINDS = {
    "dense1": ("dense", 1), "dense3": ("dense", 3), "dense7": ("dense", 7), "depthwise3": ("depthwise", 3),
    "depthwise5": ("depthwise", 5), "depthwise7": ("depthwise", 7), "grouped3": ("grouped", 3),
}
#: The kinds measured unless --kinds says otherwise (those of the shipped entries).
DEFAULT_KINDS = "dense1,dense3,depthwise3,depthwise5"
#: Channels per group of a "grouped" convolution (RegNet's group widths are 8 to 64+).
GROUP_WIDTH = 8
DECISIONS = ("layout", "fused_conv", "precision")
#: Spatial size per channel count (ResNet-like: fewer channels, larger maps).
SPATIAL = {16: 112, 64: 56, 256: 28, 512: 14}
PROVIDERS = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def conv_block(kind: str, kernel: int, channels: int, batch: int, size: int, depth: int, dtype: str, seed: int = 0) -> onnx.ModelProto:
    """`depth` x (Conv + bias + Relu) of one class, NCHW, channels in = channels out."""
    rng = np.random.default_rng(seed)
    np_dtype = np.float16 if dtype == "f16" else np.float32
    elem = TensorProto.FLOAT16 if dtype == "f16" else TensorProto.FLOAT
    group = conv_groups(kind, channels)
    nodes, inits = [], []
    src = "x"
    for i in range(depth):
        fan_in = channels // group * kernel * kernel
        w = (rng.standard_normal((channels, channels // group, kernel, kernel)) / np.sqrt(fan_in)).astype(np_dtype)
        b = (rng.standard_normal(channels) * 0.1).astype(np_dtype)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        pad = kernel // 2
        nodes.append(helper.make_node("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], pads=[pad] * 4, group=group, kernel_shape=[kernel, kernel]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        src = f"r{i}"
    nodes.append(helper.make_node("Identity", [src], ["y"]))
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", elem, [batch, channels, size, size])],
        [helper.make_tensor_value_info("y", elem, [batch, channels, size, size])], inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def conv_groups(kind: str, channels: int) -> int:
    return {"depthwise": channels, "grouped": max(2, channels // GROUP_WIDTH)}.get(kind, 1)


def candidates(model: onnx.ModelProto, provider: str, dtype: str, decisions: tuple[str, ...] = ("layout", "fused_conv")) -> dict[str, dict[str, onnx.ModelProto]]:
    """decision -> candidate -> the model graphopt writes in that form."""
    import graphopt
    from graphopt.api import builtin_rules
    from graphopt.passes.layout import LayoutOptions

    conv_activation = [r.name for r in builtin_rules() if "conv_activation" in str(r.loc)]
    forms: dict[str, dict[str, onnx.ModelProto]] = {}
    # Every form as asked, whatever the shipped table would decide. The fused_conv decision
    # keeps the input's Conv + activation unless a table predicts FusedConv faster: this one
    # does, for every float32 convolution, so that FusedConv is what "FusedConv" and the
    # float32 "nchw" layout form measure (the layout entries' "nchw" is documented so).
    fused_wins = CostTable([
        Entry(ep, "fused_conv", "Conv", "f32", {}, {"FusedConv": 0.0, "Conv+activation": 1.0}, source="decisions_bench: FusedConv form")
        for ep in PROVIDERS.values()
    ])
    optimize = functools.partial(graphopt.optimize, cost_table=fused_wins)
    layout = {
        "nchw": LayoutOptions(mode="nchw"),
        "nhwc-add": LayoutOptions(mode="nhwc", conv_bias="add"),
        "nhwc-kernel": LayoutOptions(mode="nhwc", conv_bias="kernel"),
    }
    target = "ort-cuda" if provider == "cuda" else "ort-cpu"
    if provider == "cuda" and ("layout" in decisions or ("precision" in decisions and dtype == "f32")):
        forms["layout"] = {name: optimize(model, target=target, layout=opts)[0] for name, opts in layout.items()}

    @functools.cache
    def split(target: str) -> onnx.ModelProto:
        return graphopt.optimize(model, target=target, layout="nchw", disable=conv_activation, cost_table=CostTable([]))[0]

    if dtype == "f32" and "fused_conv" in decisions:
        fused = forms.get("layout", {}).get("nchw") or optimize(model, target=target, layout="nchw")[0]
        forms["fused_conv"] = {"FusedConv": fused, "Conv+activation": split(target)}
    if dtype == "f32" and "precision" in decisions:
        # Every fp16 form as asked (convolutions forced to fp16, no range check: random weights
        # stay in range); the float32 forms are those an fp16 run keeps when the decision says fp32.
        low = functools.partial(graphopt.optimize, model, target="ort-cuda", precision="fp16", precision_convs="low",
                                range_check=False, cost_table=CostTable([]))
        precision = {"fp32": split("ort-cuda"), "fp16": low(layout="nchw")[0]}
        if provider == "cuda":
            for bias in ("add", "kernel"):
                precision[f"fp32-nhwc-{bias}"] = forms["layout"][f"nhwc-{bias}"]
                precision[f"fp16-nhwc-{bias}"] = low(layout=layout[f"nhwc-{bias}"])[0]
        forms["precision"] = precision
    if "layout" not in decisions:
        forms.pop("layout", None)
    return forms


def entry_times(decision: str, times: dict[str, float]) -> dict[str, float] | None:
    """The figures an entry keeps: a precision entry's NHWC candidate is the faster bias form
    (the layout decision picks the form itself); None when nothing is compared."""
    if decision == "precision":
        kept = {c: times[c] for c in ("fp32", "fp16") if c in times}
        for precision in ("fp32", "fp16"):
            nhwc = [times[c] for c in (f"{precision}-nhwc-add", f"{precision}-nhwc-kernel") if c in times]
            if nhwc:
                kept[f"{precision}-nhwc"] = min(nhwc)
        return kept if "fp32" in kept and len(kept) >= 2 else None
    return dict(times) if len(times) >= 2 else None


class Session:
    """One timed onnxruntime session (io-binding on CUDA)."""

    def __init__(self, model: onnx.ModelProto, provider: str, x: np.ndarray) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        providers: list[Any] = [PROVIDERS[provider]] + (["CPUExecutionProvider"] if provider == "cuda" else [])
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
        self.provider = provider
        if provider == "cuda":
            self.binding = self.session.io_binding()
            self.binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
            self.binding.bind_output("y", "cuda", 0)
        self.x = x

    def run(self) -> None:
        if self.provider == "cuda":
            self.session.run_with_iobinding(self.binding)
        else:
            self.session.run(None, {"x": self.x})

    def output(self) -> np.ndarray:
        if self.provider == "cuda":
            self.run()
            return self.binding.copy_outputs_to_cpu()[0]
        return self.session.run(None, {"x": self.x})[0]

    def median_ms(self, warmup: int, runs: int) -> float:
        for _ in range(warmup):
            self.run()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            self.run()
            times.append((time.perf_counter() - t0) * 1e3)
        return float(statistics.median(times))


def environment(provider: str) -> dict[str, Any]:
    import onnxruntime as ort

    from graphopt.decisions.tune import device_name

    return {
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "device": device_name(PROVIDERS[provider]),
        "cpu_count": os.cpu_count(),
    }


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(timing rows, cost-table entries)."""
    from graphopt.decisions.tune import device_name

    ep = PROVIDERS[args.provider]
    device = device_name(ep)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    dtypes = [d for d in args.dtypes.split(",") if d]
    if args.provider == "cpu" or "layout" not in args.decision_list:
        dtypes = [d for d in dtypes if d == "f32"]  # the CPU decisions, fused_conv and precision are about float32 models
    configs = [(d, b, k, c) for d in dtypes for b in args.batch_list for k in args.kind_list for c in args.channel_list]
    for n, (dtype, batch, kind_label, channels) in enumerate(configs, 1):
        if time.perf_counter() - started > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: {len(configs) - n + 1} configurations not measured", flush=True)
            break
        kind, kernel = KINDS[kind_label]
        size = args.size or SPATIAL.get(channels, 28)
        model = conv_block(kind, kernel, channels, batch, size, args.depth, dtype)
        x = np.random.default_rng(1).standard_normal((batch, channels, size, size)).astype(np.float16 if dtype == "f16" else np.float32)
        label = f"{dtype} {kind} k{kernel} c{channels} b{batch} {size}x{size}"
        try:
            forms = candidates(model, args.provider, dtype, tuple(args.decision_list))
        except Exception as error:  # noqa: BLE001 - a configuration graphopt cannot build is reported, not fatal
            rows.append({"config": label, "error": f"optimize: {str(error).splitlines()[0][:200]}"})
            continue
        timed: dict[int, tuple[float, np.ndarray]] = {}  # the same model object is timed once
        for decision, models in forms.items():
            times: dict[str, float] = {}
            reference: np.ndarray | None = None
            for candidate, form in models.items():
                row: dict[str, Any] = {"config": label, "decision": decision, "candidate": candidate,
                                       "ops": sorted({node.op_type for node in form.graph.node})}
                try:
                    if id(form) not in timed:
                        session = Session(form, args.provider, x)
                        timed[id(form)] = (session.median_ms(args.warmup, args.runs), session.output())
                    ms, out = timed[id(form)]
                except Exception as error:  # noqa: BLE001 - onnxruntime raises its own types
                    row["error"] = str(error).splitlines()[0][:200]
                    rows.append(row)
                    continue
                reference = out if reference is None else reference
                diff = float(np.max(np.abs(out.astype(np.float64) - reference.astype(np.float64)), initial=0.0))
                scale = float(np.max(np.abs(reference.astype(np.float64)), initial=1.0)) or 1.0
                row.update(median_ms=round(ms, 5), max_rel_diff=diff / scale)
                if diff / scale > (3e-2 if dtype == "f16" or decision == "precision" else 5e-3):
                    row["error"] = f"output differs from {next(iter(models))}: max rel diff {diff / scale:.3g}"
                else:
                    times[candidate] = round(ms, 5)
                rows.append(row)
            print(f"[{n}/{len(configs)}] {decision:10s} {label:34s} " + "  ".join(f"{c} {t:.4f}" for c, t in times.items()), flush=True)
            kept = entry_times(decision, times)
            if kept is not None:
                groups = f", {conv_groups(kind, channels)} groups" if kind == "grouped" else ""
                casts = "; fp16 forms with Casts from and to float32 at the block's ends" if decision == "precision" else ""
                entries.append({
                    "ep": ep, "decision": decision, "op": "Conv", "dtype": dtype,
                    "match": {"kind": [kind], "kernel": [f"k{kernel}"], "channels": [channel_bucket(channels)], "batch": list(batch_buckets(batch))},
                    "times_ms": kept, "per": args.depth, "device": device,
                    "source": (f"benchmarks/decisions_bench.py: {args.depth} x (Conv {kind} {kernel}x{kernel}{groups}, {channels} channels, + bias + Relu), "
                               f"{size}x{size}, batch {batch}, {dtype}{casts}; median of {args.runs} runs, ORT_ENABLE_ALL"
                               + (", io-binding" if args.provider == "cuda" else "")),
                })
    return rows, entries


def merge(new_path: Path, into: Path) -> None:
    """Entries of `new_path` replace those of `into` for the same provider, decision, op,
    dtype and shape class; the others are added. Written in place, atomically."""
    new = CostTable.load(new_path)
    data = json.loads(into.read_text())
    old = CostTable.from_dict(data)

    def key(e: Any) -> tuple[Any, ...]:
        return (e.ep, e.decision, e.op, e.dtype, tuple(sorted((k, tuple(v)) for k, v in e.match.items())))

    replaced = {key(e) for e in new.entries}
    kept = [e for e in old.entries if key(e) not in replaced]
    data["entries"] = [e.to_dict() for e in kept] + [e.to_dict() for e in new.entries]
    tmp = into.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, into)
    print(f"{into}: {len(new.entries)} measured entries ({len(old.entries) - len(kept)} replaced), {len(data['entries'])} in all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="cuda")
    parser.add_argument("--out", type=Path, default=Path("decisions_bench_out"))
    parser.add_argument("--kinds", default=DEFAULT_KINDS, help=f"comma-separated: {', '.join(KINDS)}")
    parser.add_argument("--decisions", default="layout,fused_conv", help=f"comma-separated: {', '.join(DECISIONS)}")
    parser.add_argument("--channels", default="16,64,256,512")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--dtypes", default="f16,f32")
    parser.add_argument("--depth", type=int, default=6, help="convolutions per block")
    parser.add_argument("--size", type=int, default=0, help="spatial size (default: by channel count, ResNet-like)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--budget-s", type=float, default=210.0, help="stop measuring after this long (what is done is written)")
    parser.add_argument("--merge", type=Path, default=None, help="a cost_table.json written by this script, to merge --into the shipped table")
    parser.add_argument("--into", type=Path, default=Path(__file__).resolve().parent.parent / "graphopt" / "decisions" / "cost_table.json")
    args = parser.parse_args()
    if args.merge is not None:
        merge(args.merge, args.into)
        return
    args.kind_list = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in args.kind_list if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown} (known: {', '.join(KINDS)})")
    args.decision_list = [d for d in args.decisions.split(",") if d]
    if not args.decision_list or any(d not in DECISIONS for d in args.decision_list):
        parser.error(f"--decisions: comma-separated names among {', '.join(DECISIONS)}")
    args.channel_list = [int(c) for c in args.channels.split(",") if c]
    args.batch_list = [int(b) for b in args.batches.split(",") if b]

    import onnxruntime as ort

    if args.provider == "cuda":
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            sys.exit("error: this onnxruntime has no CUDAExecutionProvider (use --provider cpu for the CPU check)")
    env = environment(args.provider)
    print(f"device: {env['device']}  onnxruntime {env['onnxruntime']}  provider {PROVIDERS[args.provider]}", flush=True)
    started = time.perf_counter()
    rows, entries = measure(args)
    elapsed = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / f"decisions_bench-{args.provider}.json").write_text(
        json.dumps({"environment": env, "config": config, "elapsed_s": round(elapsed, 1), "rows": rows}, indent=1) + "\n"
    )
    table = {"format": TABLE_FORMAT, "entries": entries}
    CostTable.from_dict(table)  # it must read back as a table
    (args.out / "cost_table.json").write_text(json.dumps(table, indent=2) + "\n")
    errors = [r for r in rows if r.get("error")]
    print(f"{len(entries)} entries, {len(errors)} errors, {elapsed:.0f} s; wrote {args.out}/cost_table.json and decisions_bench-{args.provider}.json")
    for row in errors[:10]:
        print(f"  error: {row['config']} {row.get('decision', '')} {row.get('candidate', '')}: {row['error']}")


if __name__ == "__main__":
    main()
