"""What graphopt's own passes add to torch.compile's compile time (issue 15: at most 20 % of
inductor's compile time, on every model).

Per model (the builders of benchmarks/torch_compile.py), each behind torch._dynamo.reset(),
with inductor's caches off (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1, so every compile is done):

  inductor   backend="inductor"'s own work: compile_fx on each graph dynamo captures, timed;
  graphopt   backend="graphopt" (--options, default {}): per compiled graph, graphopt's
             own time (report.times_s["graphopt"]: tracing to ATen, freezing, the rules and
             passes) and the compile of its result (times_s["leftovers"]: inductor on
             graphopt's graph, or on dynamo's where graphopt changed nothing inductor lacks).

Reported per model, summed over its graphs: graphopt s, inductor s, ratio = graphopt s /
inductor s (the goal: <= 0.20), and inductor-on-graphopt's-graph s. --repeats runs
alternate the two and keep each figure's median. --profile writes a cProfile of graphopt's
passes (graphopt_backend without the inductor compile) per model, top functions printed.

    python benchmarks/torch_compile_cost.py --tiny --device cpu --out benchmarks/results/
    python benchmarks/torch_compile_cost.py --models llama,t5,convnext --out benchmarks/results/    # CUDA, fp16

Output: JSON (--out: a file, or a folder for torch_compile_cost-<models>[-tiny].json) and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # before torch is imported: every compile is done

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_compile import MODELS, build_model, environment, positional  # noqa: E402

GOAL = 0.20  # graphopt's passes over inductor's compile time


def _prepare(name: str, tiny: bool, device: str, dtype: str) -> tuple[Any, Any, str]:
    import torch

    model, inputs, description = build_model(name, tiny)
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    model = model.to(device=device, dtype=torch_dtype)
    inputs = {k: (v.to(device=device, dtype=torch_dtype) if v.is_floating_point() else v.to(device)) for k, v in inputs.items()}
    return model, inputs, description


def time_inductor(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """backend="inductor", its compile_fx calls timed (one per graph dynamo captures)."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    seconds: list[float] = []

    def timed(gm: Any, example_inputs: Any) -> Any:
        t0 = time.perf_counter()
        compiled = compile_fx(gm, example_inputs)
        seconds.append(time.perf_counter() - t0)
        return compiled

    torch._dynamo.reset()
    with torch.no_grad():
        positional(torch.compile(model, backend=timed), inputs)()
    return {"graphs": len(seconds), "inductor_s": sum(seconds)}


def time_graphopt(model: Any, inputs: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    import torch

    import graphopt
    from graphopt.torch_backend import clear_reports

    torch._dynamo.reset()
    clear_reports()
    with torch.no_grad():
        positional(torch.compile(model, backend="graphopt", options=options), inputs)()
    reports = graphopt.torch_reports()
    rewrites: dict[str, int] = {}
    for report in reports:
        for rule, stats in report.rules.items():
            if stats.applications:
                rewrites[rule] = rewrites.get(rule, 0) + stats.applications
    parts = {key: sum(r.times_s.get(key, 0.0) for r in reports) for key in ("trace", "rules", "optimize", "graphopt", "leftovers")}
    return {"graphs": len(reports), "graphopt_s": parts["graphopt"], "leftovers_s": parts["leftovers"],
            "parts_s": {k: round(v, 4) for k, v in parts.items()}, "rewrites": rewrites,
            "to_inductor_as_captured": sum(any(d.kind == "graph" for d in r.decisions) for r in reports)}


def profile_graphopt(model: Any, inputs: dict[str, Any], options: dict[str, Any], out: Path | None, top: int) -> str:
    """cProfile of graphopt's passes alone (the compile of the result replaced by the graph itself)."""
    import cProfile
    import io
    import pstats

    import torch

    import graphopt.torch_backend as backend

    real = backend._compile_leftovers, backend._inductor
    backend._compile_leftovers = lambda gm, *a, **k: gm  # type: ignore[assignment]
    backend._inductor = lambda gm, *a, **k: gm  # type: ignore[assignment]
    profiler = cProfile.Profile()
    try:
        torch._dynamo.reset()
        with torch.no_grad():
            compiled = torch.compile(model, backend="graphopt", options=options)
            profiler.enable()
            positional(compiled, inputs)()
            profiler.disable()
    finally:
        backend._compile_leftovers, backend._inductor = real
    if out is not None:
        profiler.dump_stats(str(out))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(r"graphopt", top)
    return text.getvalue()


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("fp16" if device.startswith("cuda") else "fp32")
    options = json.loads(args.options)
    # Warm-up (imports, the C++ / Triton toolchain's first start) off the books.
    warm = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to(device)
    time_inductor(warm, {"x": torch.randn(2, 8, device=device)})
    time_graphopt(warm, {"x": torch.randn(2, 8, device=device)}, options)
    results = []
    for name in args.models.split(","):
        model, inputs, description = _prepare(name, args.tiny, device, dtype)
        inductor_runs, graphopt_runs = [], []
        for _ in range(args.repeats):
            inductor_runs.append(time_inductor(model, inputs))
            graphopt_runs.append(time_graphopt(model, inputs, options))
        graphopt_s = statistics.median(r["graphopt_s"] for r in graphopt_runs)
        inductor_s = statistics.median(r["inductor_s"] for r in inductor_runs)
        entry = {"model": name, "description": description, "graphs": inductor_runs[0]["graphs"],
                 "graphopt_s": round(graphopt_s, 3), "inductor_s": round(inductor_s, 3), "ratio": round(graphopt_s / inductor_s, 3),
                 "inductor_on_graphopt_graph_s": round(statistics.median(r["leftovers_s"] for r in graphopt_runs), 3),
                 "runs": {"inductor": inductor_runs, "graphopt": graphopt_runs}}
        if args.profile:
            folder = Path(args.profile)
            folder.mkdir(parents=True, exist_ok=True)
            entry["profile_top"] = profile_graphopt(model, inputs, options, folder / f"{name}.prof", args.top)
        results.append(entry)
        print(f"{name}: graphopt {graphopt_s:.2f} s, inductor {inductor_s:.2f} s, ratio {graphopt_s / inductor_s:.2f}", flush=True)
    return {"environment": environment(device) | {"dtype": dtype, "command": " ".join(sys.argv), "options": options},
            "goal_ratio": GOAL, "results": results}


def table(data: dict[str, Any]) -> str:
    lines = [f"{'model':10s} {'graphs':>6s} {'graphopt s':>11s} {'inductor s':>11s} {'ratio':>6s} {'inductor on graphopt s':>23s}  rewrites"]
    for r in data["results"]:
        rewrites = sum(r["runs"]["graphopt"][0]["rewrites"].values())
        flag = "" if r["ratio"] <= data["goal_ratio"] else "  OVER"
        lines.append(f"{r['model']:10s} {r['graphs']:6d} {r['graphopt_s']:11.2f} {r['inductor_s']:11.2f} {r['ratio']:6.2f} "
                     f"{r['inductor_on_graphopt_graph_s']:23.2f}  {rewrites}{flag}")
    lines.append(f"ratio: graphopt's own passes / inductor's compile of dynamo's graphs (goal <= {data['goal_ratio']:.2f}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,gpt2,llama,vit,resnet50", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default=None, help="default fp16 on CUDA, fp32 on CPU")
    parser.add_argument("--tiny", action="store_true", help="the tiny configs of benchmarks/torch_compile.py")
    parser.add_argument("--options", default="{}", help="graphopt's torch.compile options, as JSON (default {}: the default mode)")
    parser.add_argument("--repeats", type=int, default=1, help="compiles of each kind per model (medians)")
    parser.add_argument("--profile", default=None, help="folder for a cProfile of graphopt's passes per model (<model>.prof)")
    parser.add_argument("--top", type=int, default=25, help="functions of the profile printed per model")
    parser.add_argument("--out", default=None, help="JSON file, or a folder (existing, or ending in /)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown or args.repeats < 1:
        print(f"error: unknown model {', '.join(unknown)} (known: {', '.join(MODELS)})" if unknown else "error: --repeats must be >= 1",
              file=sys.stderr)
        return 2
    try:
        json.loads(args.options)
    except ValueError as error:
        print(f"error: --options is not JSON: {error}", file=sys.stderr)
        return 2
    data = run(args)
    print(table(data))
    for r in data["results"]:
        if "profile_top" in r:
            print(f"--- {r['model']}: graphopt's passes, cumulative\n{r['profile_top']}")
    if args.out:
        folder = Path(args.out).is_dir() or args.out.endswith(("/", os.sep))
        models = args.models.replace(",", "-")
        path = Path(args.out) / f"torch_compile_cost-{models}{'-tiny' if args.tiny else ''}.json" if folder else Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
