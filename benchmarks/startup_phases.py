"""Where the start-up of `graphopt optimize` goes: CPU time of each phase, in the order the command meets them.

    python benchmarks/startup_phases.py [--runs 7] [--out results/startup-phases.json] [--checkout PATH]

Builds the README's example model (examples/make_example.py) and runs, `--runs` times in a
fresh process each, what `graphopt optimize model.onnx -o out.onnx -q` does (garbage
collection paused for the imports, as the command line does): the imports in the
command's order (graphopt with typer and graphopt.cli, numpy, onnx, onnx-ir, graphopt's
optimizer modules), loading the model, loading the rule library, optimizing, saving with
onnxruntime's load check (its import included; none where the graph's verdict is remembered,
graphopt/ir/runtime_verdicts.py: after the warm-up run), and the
interpreter's start and exit (the whole process's CPU time less the phases; the exit as
the graphopt program ends, graphopt.cli_exit). It does not run typer's parsing. As the
command line does, numpy comes with one BLAS thread (graphopt.cli_blas) and the rewrites
without snapshots (no --report). Prints
the median CPU time (user + system) of each phase; CPU time rather than wall time because the machine this
runs on is shared (see benchmarks/startup.py for whole-process wall times).
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# One run, in its own process: prints "phase<TAB>seconds" lines.
PHASES = r"""
import gc, sys, time
gc.disable()  # as graphopt/__main__.py and graphopt.cli.main do for the start-up
marks = [("start", time.process_time())]
def mark(name):
    marks.append((name, time.process_time()))
import graphopt, typer, graphopt.cli  # as `python -m graphopt` starts: its hooks, then the command line
mark("import graphopt, typer, graphopt.cli")
try:  # as the optimize command imports numpy (one BLAS thread unless the user set a count)
    from graphopt.cli_blas import import_numpy_single_threaded
except ImportError:  # an older checkout
    import numpy
else:
    import_numpy_single_threaded()
    import numpy
mark("import numpy")
import onnx
mark("import onnx (numpy done)")
import onnx_ir
mark("import onnx-ir")
import graphopt.api
from graphopt.api import OptimizeOptions, builtin_rules, optimize
from graphopt.ir.onnx_io import load_model, save_model
mark("import graphopt's optimizer modules")
gc.freeze(); gc.enable()  # as the optimize command does before it loads the model
model = load_model(sys.argv[1])
mark("load the model (checks, strict shape inference)")
builtin_rules()
mark("load the rule library (cached .pdll, rules/*.py)")
try:  # as the command line without --report: no snapshots of the rewrites
    options = OptimizeOptions(snapshots=False)
except TypeError:  # an older checkout
    options = OptimizeOptions()
optimized, report = optimize(model, options)
mark("optimize (shape inference, sweeps, cleanup)")
save_model(optimized, sys.argv[2], reference=sys.argv[1])  # imports onnxruntime, unless the verdict is remembered
mark("save (onnxruntime's import and load check, or its remembered verdict)")
for (_, before), (name, after) in zip(marks, marks[1:]):
    print(f"{name}\t{after - before:.6f}")
import gc
gc.freeze()  # as graphopt.cli.main does at exit
try:  # as the graphopt program does before it ends: the dataclass code table, if this run added to it
    from graphopt._dataclass_code import save
except ImportError:  # an older checkout
    pass
else:
    save()
try:
    from graphopt.cli_exit import exit_process
except ImportError:  # an older checkout: the interpreter's ordinary exit, as its program ended
    pass
else:
    exit_process(SystemExit(0))  # as the graphopt program ends (atexit, flush, os._exit)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--checkout", type=Path, default=REPO, help="the graphopt checkout to time (default: this one)")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(args.checkout), os.environ.get("PYTHONPATH", "")])))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # from bytecode caches, as an installed package runs
    folder = Path(tempfile.mkdtemp(prefix="graphopt-phases-"))
    model = folder / "model.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_example.py"), str(model)], check=True, capture_output=True, env=env)
    command = [sys.executable, "-c", PHASES, str(model), str(folder / "out.onnx")]
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=folder)  # warm-up: file and bytecode caches
    phases: dict[str, list[float]] = {}
    for _ in range(args.runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(command, check=True, capture_output=True, text=True, env=env, cwd=folder)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        whole = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        measured = 0.0
        for line in done.stdout.splitlines():
            name, seconds = line.split("\t")
            phases.setdefault(name, []).append(float(seconds))
            measured += float(seconds)
        phases.setdefault("interpreter start and shutdown (the rest)", []).append(whole - measured)
        phases.setdefault("whole process", []).append(whole)
    medians = {name: statistics.median(times) for name, times in phases.items()}
    for name, median in medians.items():
        print(f"{name:55s} {median * 1000:7.1f} ms")
    if args.out:
        document = {
            "load_average": os.getloadavg(),
            "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(["python benchmarks/startup_phases.py", *sys.argv[1:]]),
            "checkout": str(args.checkout),
            "runs": args.runs,
            "cpu_median_s": medians,
            "cpu_runs_s": phases,
        }
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
