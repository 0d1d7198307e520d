"""Start-up and small-job times, whole process, against onnxruntime's offline optimizer and onnxsim.

    python benchmarks/startup.py [--runs 5] [--out results/startup.json] [--checkout PATH] [--baseline PATH]... [--only TEXT]
                                 [--checkout-env NAME=VALUE]... [--alternate-ort]

Builds the README's example model (examples/make_example.py: a 47-node ResNet-style CNN,
245 KB) and times, as separate processes from start to exit, median of `--runs` after
one warm-up run (file caches warm, and graphopt's own: the parsed patterns, the dataclass
code table, the save's load-check verdict for this graph):

* `python -c pass` (the interpreter alone),
* `graphopt --help`, `python -c "import graphopt"`, `graphopt --version`,
* `graphopt optimize model.onnx -o out.onnx -q` (file to file; the `-o` form older checkouts know too),
* onnxruntime's offline optimizer (a session with `optimized_model_filepath`, all
  graph optimizations, CPU provider), and `onnxsim model.onnx out.onnx` when installed.

Each is reported as wall time and as CPU time (user + system of the process): on a machine
shared with other work the wall time grows with the load, the CPU time of a
single-threaded start-up much less (onnxruntime's thread pool makes its CPU time exceed
its wall time; so do numpy's OpenBLAS threads, which spin for a while after numpy's
import). Issue 19's goals (`--help` <= 0.15 s, the small model <= 0.30 s) are checked
against both medians at the end. The commands run from a temporary folder, so `python -m graphopt`
imports the checkout named by `--checkout`, not the current folder, and with bytecode
caches (PYTHONDONTWRITEBYTECODE is dropped), as an installed package runs.

With `--baseline PATH` (another checkout, e.g. main before a change; repeatable, e.g. one
`git archive` tree per commit of a series) each graphopt command also runs from that
checkout, the checkouts' runs alternating, so that all see the same load: on a shared
machine, runs minutes apart are not comparable. `--only optimize` times only the
commands whose name contains that text. `--checkout-env NAME=VALUE` adds a variant of
`--checkout` with that variable set (e.g. OPENBLAS_NUM_THREADS=4), `--alternate-ort` runs onnxruntime's offline optimizer in the same turns as the
optimize command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

#: Issue 19's goals, whole process, wall time (on an idle machine wall is about CPU).
GOALS_S = {"python -m graphopt --help": 0.15, "python -m graphopt optimize model.onnx -o out.onnx -q": 0.30}

ORT_OFFLINE = (
    "import sys, onnxruntime as ort\n"
    "so = ort.SessionOptions()\n"
    "so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL\n"
    "so.optimized_model_filepath = sys.argv[2]\n"
    "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])\n"
)


def _time(command: list[str], runs: int, envs: list[dict[str, str]], cwd: Path,
          others: Sequence[list[str]] = ()) -> list[dict[str, Any]]:
    """Wall time and CPU time (user + system of the child) per run, for each environment
    (checkout), the environments taking turns run by run, then each of `others` (other
    commands, in the first environment) in the same turn. On a machine shared with other
    work the wall time grows with the load; the CPU time much less."""
    variants = [(command, env) for env in envs] + [(other, envs[0]) for other in others]
    results: list[dict[str, Any]] = []
    for command, env in variants:
        warm = subprocess.run(command, capture_output=True, env=env, text=True, cwd=cwd)  # warm-up: file caches
        if warm.returncode != 0:  # e.g. an older checkout without --version
            results.append({"error": (warm.stderr.strip().splitlines() or [f"exit {warm.returncode}"])[-1]})
        else:
            results.append({"runs_s": [], "cpu_runs_s": []})
    for _ in range(runs):
        for (command, env), result in zip(variants, results):
            if "error" in result:
                continue
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env, cwd=cwd)
            result["runs_s"].append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            result["cpu_runs_s"].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    for result in results:
        if "error" not in result:
            wall, cpu = result["runs_s"], result["cpu_runs_s"]
            result.update(median_s=statistics.median(wall), min_s=min(wall), max_s=max(wall), cpu_median_s=statistics.median(cpu))
    return results


def _env(checkout: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH", "")])))
    # As an installed package runs: from bytecode caches (the warm-up run writes them), not
    # compiling every module of the checkout anew in every run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _line(name: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"{name:60s} failed: {result['error']}"
    return (
        f"{name:60s} wall median {result['median_s']:.3f} s (min {result['min_s']:.3f}, max {result['max_s']:.3f}),"
        f" CPU median {result['cpu_median_s']:.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--checkout", type=Path, default=REPO, help="the graphopt checkout to time (default: this one), e.g. an older commit's worktree"
    )
    parser.add_argument(
        "--baseline", type=Path, action="append", default=[],
        help="another checkout whose graphopt commands run in turn with --checkout's (repeatable: one per change to attribute)",
    )
    parser.add_argument(
        "--only", default=None, help="time only the commands whose name contains this text (e.g. 'optimize')"
    )
    parser.add_argument(
        "--checkout-env", action="append", default=[], metavar="NAME=VALUE",
        help="also run --checkout's graphopt commands with this variable set, in turn with the others (repeatable: one variant each)",
    )
    parser.add_argument(
        "--alternate-ort", action="store_true",
        help="run onnxruntime's offline optimizer in turn with the optimize command (same minutes, same load)",
    )
    args = parser.parse_args()
    env = _env(args.checkout)
    baseline_envs = [_env(path) for path in args.baseline]
    variant_envs = [dict(env, **dict([setting.split("=", 1)])) for setting in args.checkout_env]
    py = sys.executable
    graphopt = [py, "-m", "graphopt"]
    script = shutil.which("graphopt")  # the console script; with PYTHONPATH it runs the checkout's code
    folder = Path(tempfile.mkdtemp(prefix="graphopt-startup-"))
    model = folder / "model.onnx"
    subprocess.run([py, str(REPO / "examples" / "make_example.py"), str(model)], check=True, capture_output=True, env=env)
    commands: dict[str, list[str]] = {
        "python -c pass": [py, "-c", "pass"],
        "python -m graphopt --help": [*graphopt, "--help"],
        "python -c 'import graphopt'": [py, "-c", "import graphopt"],
        "python -m graphopt --version": [*graphopt, "--version"],
        "python -m graphopt optimize model.onnx -o out.onnx -q": [*graphopt, "optimize", str(model), "-o", str(folder / "go.onnx"), "-q"],
        "onnxruntime offline optimizer (ORT_ENABLE_ALL, CPU)": [py, "-c", ORT_OFFLINE, str(model), str(folder / "ort.onnx")],
    }
    if script:
        commands["graphopt --help (console script)"] = [script, "--help"]
    try:
        import onnxsim  # noqa: F401

        commands["onnxsim model.onnx out.onnx"] = [py, "-m", "onnxsim", str(model), str(folder / "sim.onnx")]
    except ImportError:
        print("onnxsim is not installed: left out", file=sys.stderr)
    results = {}
    baseline_results: dict[str, dict[str, Any]] = {str(path): {} for path in args.baseline}
    for name, command in commands.items():
        if args.only and args.only not in name:
            continue
        compared = "graphopt" in name
        envs = [env, *variant_envs, *baseline_envs] if compared else [env]
        with_ort = args.alternate_ort and "graphopt optimize" in name
        others = [commands["onnxruntime offline optimizer (ORT_ENABLE_ALL, CPU)"]] if with_ort else []
        timed = _time(command, args.runs, envs, cwd=folder, others=others)  # not the checkout: `python -m` would import from it
        results[name] = timed[0]
        print(_line(name, timed[0]), flush=True)
        if compared:
            for setting, result in zip(args.checkout_env, timed[1:]):
                results[f"{name} [{setting}]"] = result
                print(_line(f"  in turn, with {setting}: " + name, result), flush=True)
            for path, result in zip(args.baseline, timed[1 + len(variant_envs):]):
                baseline_results[str(path)][name] = result
                print(_line(f"  in turn, {path}: " + name, result), flush=True)
        if with_ort:
            results[f"{name} [in turn: onnxruntime offline optimizer]"] = timed[-1]
            print(_line("  in turn, onnxruntime offline optimizer", timed[-1]), flush=True)
    goals = {}
    for name, goal in GOALS_S.items():
        result = results.get(name, {})
        if "median_s" in result:
            goals[name] = {"goal_s": goal, "wall_met": result["median_s"] <= goal, "cpu_met": result["cpu_median_s"] <= goal}
            print(
                f"goal {name}: <= {goal:.2f} s; wall median {result['median_s']:.3f} s ({'met' if goals[name]['wall_met'] else 'not met'}),"
                f" CPU median {result['cpu_median_s']:.3f} s ({'met' if goals[name]['cpu_met'] else 'not met'})"
            )
    versions: dict[str, str | None] = {}
    for package in ("onnx", "onnx-ir", "onnxruntime", "sympy", "typer", "onnxsim"):
        try:
            from importlib.metadata import version

            versions[package] = version(package)
        except Exception:  # noqa: BLE001 - not installed
            versions[package] = None
    document = {
        "load_average": os.getloadavg(),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": f"examples/make_example.py ({model.stat().st_size} bytes)",
        "checkout": str(args.checkout),
        "baselines": [str(path) for path in args.baseline],
        "baseline_results": baseline_results,
        "runs": args.runs,
        "command": " ".join(["python benchmarks/startup.py", *sys.argv[1:]]),
        "versions": versions,
        "results": results,
        "goals": goals,
    }
    if args.out:
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
