"""torch.compile(backend="graphopt") against inductor on every torch model of the shared zoo (issue 15's evidence).

The models are benchmarks/zoo/torch_models.py's builders (transformers models from small
configs with random weights, a diffusion UNet block, an LSTM/GRU tagger), at the zoo's sizes
and with its inputs (batch 1, text sequence 128); a builder the zoo exports twice (dynamo and
TorchScript exporters) is one torch model here. Per model and dtype, in one process, for each
--modes entry two variants are compiled (benchmarks/torch_compile.py's compile_variant):

  default           inductor      against graphopt+inductor        (backend="graphopt", default options)
  reduce-overhead   inductor-ro   against graphopt+inductor-ro     (CUDA graphs on CUDA)
  max-autotune      inductor-ma   against graphopt+inductor-ma

Measurement: every variant is compiled (first call timed: "compile s", caches of inductor off
unless --inductor-cache, so both compile everything), checked against eager (max |diff| /
max |eager|, same dtype), warmed up; then --rounds rounds each time every variant in a new
order, a block of --iters calls (at least MIN_BLOCK_S long) per variant per round: CUDA events
around each call on CUDA; on CPU time.perf_counter (wall time: rounds interleave the
variants so that a neighbour's load hits all of them alike), or with --threads 1 the calling
thread's CPU time (--clock thread, the default there: time other jobs take the core is not
counted). Medians, p10 and p90 over all
samples. A ratio graphopt / inductor above 1 - 3 % (a tie or a loss) is measured again, both
variants, --remeasure times at most, as zoo_bench.py does; the JSON says how often and
whether it stayed within the band. graphopt variants record their rewrites and graphopt's
own pass seconds (graphopt.torch_reports()); "passes/ind" is graphopt's passes over
inductor's first-call seconds (issue 15 item 5: <= 0.20). A model or variant that raises is
recorded and the run goes on; after --budget-s no new (model, dtype) starts.

    python benchmarks/torch_zoo.py --device cuda --dtypes fp16,bf16 --modes default,reduce-overhead,max-autotune --out $OUT/
    python benchmarks/torch_zoo.py --device cpu --threads 1 --control --out benchmarks/results/   # CPU: fp32, default mode
    python benchmarks/torch_zoo.py --device cpu --tiny --models unet-block                   # dry run (sequences 16, 1 round)

Output: JSON (--out: a file, or a folder for torch_zoo-<device>-<dtypes>[-shard].json, written
after every model, atomically) and, last, a table per dtype: per model the ratio per mode, then
the geomean, the worst model and the count above 1.03x per mode, with the GPU's name.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from torch_compile import compile_variant, environment, graphopt_summary, sample_calls  # noqa: E402
from zoo.torch_models import TORCH_MODELS, _perturb_vectors  # noqa: E402

NOISE_BAND = 0.03          # as zoo_bench.py: a ratio within 3 % of 1 is not a result until measured again
MIN_BLOCK_S = 0.05         # the shortest block of timed calls of one variant (zoo_bench.py's reason: drift)
LOSS = 1.0 + NOISE_BAND    # "graphopt loses" in the table's count
MODES = {"default": ("inductor", "graphopt+inductor"), "reduce-overhead": ("inductor-ro", "graphopt+inductor-ro"),
         "max-autotune": ("inductor-ma", "graphopt+inductor-ma")}
DTYPES = ("fp16", "bf16", "fp32")
TINY_SEQ = 16


@dataclass
class ZooTorchModel:
    """One torch model of the zoo; `zoo_names` are the zoo entries (one per exporter) built by `make`."""

    name: str
    family: str
    make: Callable[[], tuple[Any, dict[str, Any]]]
    zoo_names: list[str] = field(default_factory=list)


def zoo_models() -> list[ZooTorchModel]:
    """torch_models.TORCH_MODELS with the exporter dropped: one model per family (a builder the zoo
    exports with both exporters is the same torch module), named without the exporter suffix."""
    by_family: dict[str, ZooTorchModel] = {}
    for entry in TORCH_MODELS:
        if entry.family in by_family:
            by_family[entry.family].zoo_names.append(entry.name)
            continue
        by_family[entry.family] = ZooTorchModel(entry.name.rsplit("-", 1)[0], entry.family, entry.make, [entry.name])
    models = list(by_family.values())
    stems = [m.name for m in models]
    for m in models:  # two families on one stem (ResNet basic / bottleneck): keep the zoo's names
        if stems.count(m.name) > 1:
            m.name = m.zoo_names[0]
    return models


def _tensors(feeds: dict[str, Any], device: Any, dtype: Any, tiny: bool) -> list[Any]:
    import torch

    tensors = []
    for value in feeds.values():
        t = torch.from_numpy(value)
        if tiny and not t.is_floating_point() and t.ndim == 2:
            t = t[:, :TINY_SEQ]            # token sequences (ids, masks) cut short: a dry run
        tensors.append(t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype))
    return tensors


def _first(out: Any) -> Any:
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def _make_call(compiled: Any, tensors: list[Any], cuda_graphs: bool) -> Callable[[], Any]:
    import torch

    if cuda_graphs:  # each call a new CUDA-graph step: the previous output is never read again
        def call() -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return _first(compiled(*tensors))
        return call
    return lambda: _first(compiled(*tensors))


def _error(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"error: {type(error).__name__}: {first}"[:300]


# --------------------------------------------------------------------------- one model, one dtype


def bench_model(model: ZooTorchModel, dtype_name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from graphopt.torch_backend import clear_reports

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    tolerance = args.tolerance if args.tolerance is not None else (1e-3 if dtype_name == "fp32" else 3e-2)
    result: dict[str, Any] = {"model": model.name, "family": model.family, "zoo_names": model.zoo_names, "dtype": dtype_name,
                              "variants": {}, "ratios": {}, "compile": {}}
    torch._dynamo.reset()
    module, feeds = model.make()
    _perturb_vectors(module)  # trained-like biases and norm scales, as the zoo's export does
    module = module.to(device=device, dtype=dtype).eval()
    tensors = _tensors(feeds, device, dtype, args.tiny)
    result["inputs"] = {name: list(t.shape) for name, t in zip(feeds, tensors)}
    calls: dict[str, Callable[[], Any]] = {}
    with torch.no_grad():
        reference = _first(module(*tensors)).float().clone()
        scale = reference.abs().max().item() or 1.0
        for mode in args.modes:
            roles = [("inductor", MODES[mode][0]), ("graphopt", MODES[mode][1])]
            if args.control:  # inductor twice: the spread of this measurement itself
                roles.append(("control", MODES[mode][0]))
            for role, variant in roles:
                key = f"{role}/{mode}"
                entry: dict[str, Any] = {"variant": variant}
                result["variants"][key] = entry
                clear_reports()
                try:
                    # a copy per variant: graphopt freezes parameters into its graph, and each variant
                    # keeps its own compiled code alive for the interleaved rounds
                    compiled = compile_variant(copy.deepcopy(module), variant)
                    call = _make_call(compiled, tensors, cuda and mode != "default")
                    t0 = time.perf_counter()
                    out = call().float().clone()
                    if cuda:
                        torch.cuda.synchronize()
                    entry["compile_s"] = round(time.perf_counter() - t0, 2)
                    entry["max_rel_diff"] = (out - reference).abs().max().item() / scale
                    entry["numerics_ok"] = bool(entry["max_rel_diff"] <= tolerance)
                    for _ in range(args.warmup):
                        call()
                    if role == "graphopt":
                        entry["graphopt"] = graphopt_summary()
                        entry["passes_s"] = round(_passes_seconds(), 3)
                        entry["inductor_got"] = _graph_handed()
                    entry["status"] = "ok" if entry["numerics_ok"] else "numerics differ"
                    calls[key] = call
                except Exception as error:  # one variant failing must not stop the others
                    entry["status"] = _error(error)
                    entry["traceback"] = traceback.format_exc()[-3000:]
                print(f"  {model.name:18s} {dtype_name} {key:24s} {_cell(entry)}", flush=True)
        if calls:
            _measure(calls, result, args, cuda)
    _ratios(result, args.modes)
    return result


def warm_compilers(device: str) -> None:
    """One small inductor compile before the first model: the first compile in a process pays
    one-time costs (imports, the C++/Triton toolchain checks) that would count against
    whichever variant happens to come first."""
    import torch

    x = torch.randn(8, 8, device=device)
    torch.compile(lambda a: torch.relu(a @ a) + 1)(x)
    torch._dynamo.reset()


def _graph_handed() -> str:
    """Which graph graphopt gave inductor: "dynamo's" where its rewrites were all ones inductor
    makes itself (then graphopt is inductor, and its ratio is the measurement's noise),
    "graphopt's", or "mixed" over several graphs."""
    import graphopt

    forwarded = [any(d.kind == "graph" and d.chosen == "inductor" and d.basis == "forced" for d in r.decisions)
                 for r in graphopt.torch_reports()]
    return "dynamo's" if forwarded and all(forwarded) else "graphopt's" if not any(forwarded) else "mixed"


def sample(call: Callable[[], Any], iters: int, cuda: bool, clock: str) -> list[float]:
    """Times of `iters` calls in ms: CUDA events on CUDA; on CPU wall time, or with clock "thread"
    this thread's CPU time (time.thread_time: with one torch thread inductor's code and its GEMMs
    run in the calling thread, and the time other jobs take the core from it is not counted)."""
    if cuda or clock == "wall":
        return sample_calls(call, iters, cuda)
    times = []
    for _ in range(iters):
        t0 = time.thread_time()
        call()
        times.append((time.thread_time() - t0) * 1e3)
    return times


def _passes_seconds() -> float:
    import graphopt

    return sum(r.times_s.get("graphopt", 0.0) for r in graphopt.torch_reports())


def _measure(calls: dict[str, Callable[[], Any]], result: dict[str, Any], args: argparse.Namespace, cuda: bool) -> None:
    """Interleaved rounds over every variant, then again on each mode's pair while its ratio is a tie or a loss."""
    samples: dict[str, list[float]] = {key: [] for key in calls}
    estimate = max(statistics.median(sample(next(iter(calls.values())), 3, cuda, args.clock)), 1e-3) / 1e3
    block = max(args.iters, int(MIN_BLOCK_S / estimate))
    result["calls_per_block"] = block
    order = random.Random(0)   # a new order every round: no variant always runs after the same one

    def rounds(keys: list[str]) -> None:
        for _ in range(args.rounds):
            for key in order.sample(keys, len(keys)):
                try:
                    samples[key] += sample(calls[key], block, cuda, args.clock)
                except Exception as error:  # noqa: BLE001 - recorded; the variant leaves the rounds
                    result["variants"][key]["status"] = _error(error)
                    calls.pop(key, None)

    def summarize() -> None:
        for key, times in samples.items():
            if times and key in calls:
                ordered = sorted(times)
                result["variants"][key].update(median_ms=statistics.median(ordered), p10_ms=ordered[len(ordered) // 10],
                                               p90_ms=ordered[(9 * len(ordered)) // 10], samples=len(ordered))

    rounds(list(calls))
    summarize()
    for mode in args.modes:
        pair = [key for key in (f"inductor/{mode}", f"graphopt/{mode}", f"control/{mode}") if key in calls]
        attempts = 0
        while attempts < args.remeasure and f"inductor/{mode}" in calls and f"graphopt/{mode}" in calls:
            ratio = _ratio(result, mode)
            if ratio is None or ratio <= 1.0 - NOISE_BAND:   # a clear win needs no second look
                break
            attempts += 1
            rounds(pair)
            summarize()
        result["ratios"].setdefault(mode, {})["remeasured"] = attempts


def _ratio(result: dict[str, Any], mode: str) -> float | None:
    g = result["variants"].get(f"graphopt/{mode}", {}).get("median_ms")
    i = result["variants"].get(f"inductor/{mode}", {}).get("median_ms")
    return g / i if g and i else None


def _ratios(result: dict[str, Any], modes: list[str]) -> None:
    variants = result["variants"]
    for mode in modes:
        r = result["ratios"].setdefault(mode, {})
        r["ratio"] = _ratio(result, mode)
        control = variants.get(f"control/{mode}", {}).get("median_ms")
        if control and variants.get(f"inductor/{mode}", {}).get("median_ms"):
            r["control"] = control / variants[f"inductor/{mode}"]["median_ms"]
        if r["ratio"] is not None:
            r["within_noise"] = abs(r["ratio"] - 1.0) < NOISE_BAND
        ind, go = variants.get(f"inductor/{mode}", {}), variants.get(f"graphopt/{mode}", {})
        if "compile_s" in ind and "compile_s" in go:
            result["compile"][mode] = {"inductor_s": ind["compile_s"], "graphopt_s": go["compile_s"], "passes_s": go.get("passes_s"),
                                       "passes_over_inductor": round(go.get("passes_s", 0.0) / max(ind["compile_s"], 1e-9), 3)}
    best_g = min((variants[f"graphopt/{m}"]["median_ms"] for m in modes if "median_ms" in variants.get(f"graphopt/{m}", {})), default=None)
    best_i = min((variants[f"inductor/{m}"]["median_ms"] for m in modes if "median_ms" in variants.get(f"inductor/{m}", {})), default=None)
    result["best_over_best"] = best_g / best_i if best_g and best_i else None
    rewrites: dict[str, int] = {}
    for mode in modes:
        rewrites.update({f"{mode}:{k}": v for k, v in variants.get(f"graphopt/{mode}", {}).get("graphopt", {}).get("rewrites", {}).items()})
    result["rewrites"] = rewrites


# --------------------------------------------------------------------------- output


def _cell(entry: dict[str, Any]) -> str:
    if "compile_s" not in entry:
        return entry.get("status", "")
    rewrites = sum(entry.get("graphopt", {}).get("rewrites", {}).values()) if "graphopt" in entry else None
    extra = f"  rewrites {rewrites}  passes {entry['passes_s']:.2f} s" if rewrites is not None else ""
    return f"compile {entry['compile_s']:6.1f} s  rel diff {entry['max_rel_diff']:.1e}  {entry['status']}{extra}"


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _fmt_ratio(result: dict[str, Any], mode: str) -> str:
    r = result.get("ratios", {}).get(mode, {})
    g = result.get("variants", {}).get(f"graphopt/{mode}", {})
    i = result.get("variants", {}).get(f"inductor/{mode}", {})
    if r.get("ratio") is None:
        failed = g if "median_ms" not in g else i
        return "E" if failed.get("status", "").startswith("error") else "-"
    flags = ("~" if r.get("within_noise") else "") + ("!" if not (g.get("numerics_ok") and i.get("numerics_ok")) else "")
    return f"{r['ratio']:.3f}{flags}"


def table(results: list[dict[str, Any]], modes: list[str], device_name: str) -> str:
    lines = [f"device: {device_name}",
             "graphopt / inductor, median time per mode (~ within the 3 % band after re-measuring, ! numerics beyond tolerance, "
             "E error); best/best: graphopt's best mode over inductor's best mode; passes/ind: graphopt's passes over "
             "inductor's compile s (first mode); inductor got: dynamo's graph (graphopt changed nothing inductor does not do "
             "itself: the ratio is noise) or graphopt's (first mode); with --control, a last column: inductor against itself (first mode)"]
    for dtype in dict.fromkeys(r["dtype"] for r in results):
        rows = [r for r in results if r["dtype"] == dtype]
        lines.append(f"\n{dtype}:")
        lines.append(f"{'model':20s} " + " ".join(f"{m:>16s}" for m in modes) + f" {'best/best':>10s} {'rewrites':>9s} {'passes/ind':>10s} {'inductor got':>12s}")
        for r in rows:
            if "error" in r:
                lines.append(f"{r['model']:20s} {r['error']}")
                continue
            cost = r.get("compile", {}).get(modes[0], {}).get("passes_over_inductor")
            bb = f"{r['best_over_best']:.3f}" if r.get("best_over_best") else "-"
            control = r.get("ratios", {}).get(modes[0], {}).get("control")
            lines.append(f"{r['model']:20s} " + " ".join(f"{_fmt_ratio(r, m):>16s}" for m in modes) + f" {bb:>10s} "
                         f"{sum(r.get('rewrites', {}).values()):9d} {cost if cost is not None else '-'!s:>10s} "
                         f"{r.get('variants', {}).get(f'graphopt/{modes[0]}', {}).get('inductor_got', '-'):>12s}"
                         + (f" {control:9.3f}" if control else ""))
        for label in ("geomean", "worst", f"> {LOSS:.2f}x"):
            cells = []
            for m in modes:
                ratios = {r["model"]: r["ratios"][m]["ratio"] for r in rows if r.get("ratios", {}).get(m, {}).get("ratio") is not None}
                if not ratios:
                    cells.append("-")
                elif label == "geomean":
                    cells.append(f"{_geomean(list(ratios.values())):.3f} (n={len(ratios)})")
                elif label == "worst":
                    worst = max(ratios, key=ratios.__getitem__)
                    cells.append(f"{ratios[worst]:.3f} {worst}")
                else:
                    cells.append(f"{sum(v > LOSS for v in ratios.values())} of {len(ratios)}")
            bests = [r["best_over_best"] for r in rows if r.get("best_over_best")]
            tail = f" {_geomean(bests):10.3f}" if label == "geomean" and bests else ""
            lines.append(f"{label:20s} " + " ".join(f"{c:>16s}" for c in cells) + tail)
    return "\n".join(lines)


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}"
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {cpu} ({os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}), torch {torch.__version__}"


def write_json(data: dict[str, Any], path: Path) -> None:
    """Atomically: a temporary file in the same folder, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1, default=float)
    os.replace(staged, path)


# --------------------------------------------------------------------------- driver


def _parse(argv: list[str] | None) -> argparse.Namespace | str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="", help="comma-separated model names (or zoo names); default: every model")
    parser.add_argument("--modes", default="default", help=f"comma-separated: {', '.join(MODES)}")
    parser.add_argument("--dtypes", default=None, help="comma-separated fp16, bf16, fp32 (default fp16,bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--shard", default=None, help="i/n: every n-th model from the i-th (1-based), after --models")
    parser.add_argument("--budget-s", type=float, default=None, help="no (model, dtype) starts after this many seconds")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 10; 1 with --tiny)")
    parser.add_argument("--iters", type=int, default=None, help="calls per variant per round, at least MIN_BLOCK_S (default 10; 2 with --tiny)")
    parser.add_argument("--warmup", type=int, default=None, help="calls after the first (default 5; 1 with --tiny)")
    parser.add_argument("--remeasure", type=int, default=None, help="re-measurements of a tie or loss at most (default 2; 0 with --tiny)")
    parser.add_argument("--threads", type=int, default=None, help="CPU: torch.set_num_threads (default: torch's)")
    parser.add_argument("--clock", choices=("auto", "wall", "thread"), default="auto",
                        help="CPU timer: wall (time.perf_counter) or thread (time.thread_time; needs --threads 1); auto: thread with --threads 1")
    parser.add_argument("--tolerance", type=float, default=None, help="max rel diff to eager (default 3e-2 fp16/bf16, 1e-3 fp32)")
    parser.add_argument("--control", action="store_true", help="time inductor twice per mode (the second a copy of the model, "
                        "which dynamo's cache serves the same compiled code): its ratio to itself (\"control\") is the timing's own spread")
    parser.add_argument("--tiny", action="store_true", help="a dry run: token sequences cut to 16, 1 round, 2 calls")
    parser.add_argument("--inductor-cache", action="store_true", help="keep inductor's caches (default: off, so compile s are honest)")
    parser.add_argument("--list", action="store_true", help="print the models and exit")
    parser.add_argument("--out", default=None, help="JSON file, or a folder (existing, or ending in /)")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in MODES for m in args.modes):
        return f"--modes takes {', '.join(MODES)}; got {','.join(args.modes)!r}"
    if args.shard:
        try:
            index, count = (int(v) for v in args.shard.split("/"))
            assert 1 <= index <= count
        except (ValueError, AssertionError):
            return f"--shard takes i/n with 1 <= i <= n; got {args.shard!r}"
        args.shard_index, args.shard_count = index, count
    for name, tiny, default in (("rounds", 1, 10), ("iters", 2, 10), ("warmup", 1, 5), ("remeasure", 0, 2)):
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else default)
    return args


def select_models(args: argparse.Namespace) -> list[ZooTorchModel] | str:
    models = zoo_models()
    if args.models:
        wanted = [m for m in args.models.split(",") if m]
        known = {n: m for m in models for n in [m.name, *m.zoo_names]}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            return f"unknown model {', '.join(unknown)} (known: {', '.join(m.name for m in models)})"
        models = list({id(known[w]): known[w] for w in wanted}.values())
    if args.shard:
        models = models[args.shard_index - 1::args.shard_count]
    return models


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if isinstance(args, str):
        print(f"error: {args}", file=sys.stderr)
        return 2
    models = select_models(args)
    if isinstance(models, str):
        print(f"error: {models}", file=sys.stderr)
        return 2
    if args.list:
        for m in models:
            print(f"{m.name:20s} {m.family:48s} {', '.join(m.zoo_names)}")
        return 0
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import torch
    import torch._dynamo.config
    import torch._inductor.config

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtypes = [d for d in (args.dtypes or ("fp16,bf16" if args.device.startswith("cuda") else "fp32")).split(",") if d]
    if not dtypes or any(d not in DTYPES for d in dtypes):
        print(f"error: --dtypes takes {', '.join(DTYPES)}; got {','.join(dtypes)!r}", file=sys.stderr)
        return 2
    if args.threads and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    if args.clock == "auto":
        args.clock = "thread" if args.threads == 1 and not args.device.startswith("cuda") else "wall"
    if args.clock == "thread" and (args.device.startswith("cuda") or args.threads != 1):
        print("error: --clock thread needs --device cpu --threads 1 (other threads' time would not be counted)", file=sys.stderr)
        return 2
    out = None
    if args.out is not None:
        folder = Path(args.out).is_dir() or args.out.endswith(("/", os.sep))
        name = f"torch_zoo-{args.device}-{'-'.join(dtypes)}{'-' + args.shard.replace('/', 'of') if args.shard else ''}{'-tiny' if args.tiny else ''}.json"
        out = Path(args.out) / name if folder else Path(args.out)
    device_name = _device_name(args.device)
    print(device_name, flush=True)
    data: dict[str, Any] = {"benchmark": "torch_zoo", "command": " ".join([Path(sys.executable).name] + sys.argv[:1] + (argv or sys.argv[1:])),
                            "environment": {**environment(args.device), "device_name": device_name},
                            "settings": {k: getattr(args, k) for k in ("modes", "shard", "budget_s", "rounds", "iters", "warmup", "remeasure",
                                                                       "threads", "clock", "tiny", "inductor_cache", "tolerance", "control")} | {"dtypes": dtypes},
                            "results": [], "not_started": []}
    started = time.perf_counter()
    # every variant of a model stays compiled for the interleaved rounds: room for them in dynamo's cache
    limits = {k: v for k, v in (("cache_size_limit", 64), ("recompile_limit", 64), ("accumulated_cache_size_limit", 1024),
                                ("accumulated_recompile_limit", 1024)) if hasattr(torch._dynamo.config, k)}
    with torch._inductor.config.patch(force_disable_caches=not args.inductor_cache), torch._dynamo.config.patch(**limits):
        try:
            warm_compilers(args.device)
        except Exception as error:  # noqa: BLE001 - only a warm-up
            print(f"compiler warm-up failed: {_error(error)}", flush=True)
        for model in models:
            for dtype in dtypes:
                if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                    data["not_started"].append(f"{model.name}/{dtype}")
                    continue
                t0 = time.perf_counter()
                print(f"{model.name} ({dtype}):", flush=True)
                try:
                    result = bench_model(model, dtype, args)
                except Exception as error:  # noqa: BLE001 - the model is recorded as failed, the run goes on
                    result = {"model": model.name, "family": model.family, "dtype": dtype, "error": _error(error),
                              "traceback": traceback.format_exc()[-3000:]}
                result["seconds"] = round(time.perf_counter() - t0, 1)
                data["results"].append(result)
                print(f"  {model.name} {dtype}: " + ", ".join(f"{m} {_fmt_ratio(result, m)}" for m in args.modes)
                      + f" ({result['seconds']} s)", flush=True)
                if out is not None:
                    write_json(data, out)
    data["seconds"] = round(time.perf_counter() - started, 1)
    if out is not None:
        write_json(data, out)
        print(f"wrote {out}")
    if data["not_started"]:
        print(f"not started (budget): {', '.join(data['not_started'])}")
    print()
    print(table(data["results"], args.modes, device_name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
