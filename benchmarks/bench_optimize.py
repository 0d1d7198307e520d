"""Optimizer wall-clock benchmark: graphopt against the anchors, file to file.

Every measurement is load + optimize + save of one model by one tool, run in a
fresh subprocess (one per tool, model and repetition). Two times are recorded:

* ``in_process_s``: measured inside the subprocess after the tool's modules were
  imported: load + optimize + save (first-call set-up such as graphopt loading
  its pattern library is included, Python and library imports are not);
* ``wall_s``: the subprocess as the parent sees it (interpreter start-up and
  imports included), i.e. what a user of a command line tool waits for.

Tools (``--tools``):

  graphopt-onnx      graphopt.optimize_file(in, out, target="onnx")
  graphopt-ort-cpu   graphopt.optimize_file(in, out, target="ort-cpu")
  onnxsim            onnx.load -> onnxsim.simplify(model) -> onnx.save
  onnxoptimizer      onnx.load -> onnxoptimizer.optimize(model, default passes + fuse_bn_into_conv) -> onnx.save
  onnxscript         onnx_ir.load -> onnxscript.optimizer.optimize -> onnxscript.rewriter.rewrite -> onnx_ir.save
  ort-transformers   onnxruntime.transformers.optimizer.optimize_model(in, model_type=bert|gpt2, num_heads,
                     hidden_size, use_gpu=False) (as onnxruntime's benchmark scripts call it; its default
                     opt_level, 1, so onnxruntime's basic optimizations run first) -> save_model_to_file;
                     not applicable to CNNs (it has no model type for them)
  ort-offline        onnxruntime.InferenceSession(in, SessionOptions(graph_optimization_level=ORT_ENABLE_EXTENDED,
                     optimized_model_filepath=out)), CPU provider: the C++ reference (session creation
                     includes kernel set-up as well as the graph optimizations)

After the timed runs, each tool's output is checked once, in its own subprocess:
node count, whether it loads and runs in onnxruntime (CPU), and the largest
difference from the original model's outputs on the same inputs.

Models are built (and cached in .cache/models) by tests/models.py. A scaling
run (graphopt only) on BERT with 2, 6, 12 and 24 layers checks that 24 layers
take at most 2.1x the time of 12.

    python benchmarks/bench_optimize.py                       # everything, 3 repetitions
    python benchmarks/bench_optimize.py --quick               # tiny models: a smoke test
    python benchmarks/bench_optimize.py --models bert-base-dynamo,resnet50 --tools onnxsim,ort-offline --repeat 1

Results: benchmarks/results/<date>.json (everything) and <date>.md (tables for
benchmarks/RESULTS.md); a short table is printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
WORK_DIR = REPO / ".cache" / "bench"

GRAPHOPT_TOOLS = ("graphopt-onnx", "graphopt-ort-cpu")
ANCHORS = ("onnxsim", "onnxoptimizer", "onnxscript", "ort-transformers", "ort-offline")
ALL_TOOLS = GRAPHOPT_TOOLS + ANCHORS
SCALING_RATIO_LIMIT = 2.1


def _models_module() -> Any:
    """tests/models.py, imported by file path (tests/ is not a package)."""
    name = "graphopt_test_models"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "models.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class ModelDef:
    build: Callable[[], Path]
    model_type: str | None  # onnxruntime.transformers model type, None for CNNs
    note: str = ""


def _model_defs() -> dict[str, ModelDef]:
    M = _models_module()
    defs: dict[str, ModelDef] = {}
    for exp in ("dynamo", "torchscript"):
        defs[f"bert-base-{exp}"] = ModelDef(lambda e=exp: M.bert(12, e), "bert", "BertModel 12x768, seq 128")
        defs[f"gpt2-{exp}"] = ModelDef(lambda e=exp: M.gpt2(12, e), "gpt2", "GPT2LMHeadModel 12x768, seq 128")
        defs[f"bert-tiny-{exp}"] = ModelDef(lambda e=exp: M.bert_tiny(e), "bert", "BERT 2x64")
        defs[f"gpt2-tiny-{exp}"] = ModelDef(lambda e=exp: M.gpt2_tiny(e), "gpt2", "GPT-2 2x64")
    for exp in ("dynamo-noopt", "dynamo", "torchscript"):
        defs[f"resnet50-{exp}"] = ModelDef(lambda e=exp: M.resnet50_like(e), None, "ResNet-50-like, 224x224")
        defs[f"small-cnn-{exp}"] = ModelDef(lambda e=exp: M.small_cnn(e), None, "small CNN, 32x32")
        defs[f"resnet-tiny-{exp}"] = ModelDef(lambda e=exp: M.resnet_tiny(e), None, "ResNet-50 topology, width 8")
    # the ResNet with BatchNormalization still in the graph (both exporters fold Conv+BN)
    defs["resnet50"] = defs["resnet50-dynamo-noopt"]
    return defs


DEFAULT_MODELS = ["bert-base-dynamo", "bert-base-torchscript", "gpt2-dynamo", "gpt2-torchscript", "resnet50"]
QUICK_MODELS = ["bert-tiny-dynamo", "bert-tiny-torchscript", "gpt2-tiny-dynamo", "gpt2-tiny-torchscript",
                "small-cnn-dynamo-noopt", "resnet-tiny-dynamo-noopt"]
SCALING_LAYERS = [2, 6, 12, 24]
QUICK_SCALING_LAYERS = [1, 2, 4]


def _scaling_model(layers: int, quick: bool) -> tuple[str, ModelDef]:
    M = _models_module()
    if quick:
        if layers == 2:
            return "bert-tiny-dynamo", ModelDef(lambda: M.bert_tiny("dynamo"), "bert", "BERT 2x64")
        return f"bert-tiny-L{layers}-dynamo", ModelDef(lambda: M.bert_tiny("dynamo", layers=layers), "bert", f"BERT {layers}x64")
    if layers == 12:
        return "bert-base-dynamo", ModelDef(lambda: M.bert(12, "dynamo"), "bert", "BertModel 12x768, seq 128")
    return f"bert-L{layers}-dynamo", ModelDef(lambda: M.bert(layers, "dynamo"), "bert", f"BertModel {layers}x768, seq 128")


# =========================================================================== worker side


def _save_proto(model: Any, out: str) -> None:
    import onnx

    if model.ByteSize() < 2**31 - 2**20:
        onnx.save(model, out)
    else:
        onnx.save(model, out, save_as_external_data=True, location=Path(out).name + ".data")


def _tool_runner(tool: str, opts: dict[str, Any]) -> Callable[[str, str], Any]:
    """Import the tool's modules (not timed) and return load+optimize+save (timed)."""
    if tool.startswith("graphopt-"):
        import graphopt

        target = tool[len("graphopt-"):]
        return lambda i, o: graphopt.optimize_file(i, o, target=target)
    if tool == "onnxsim":
        import onnx
        import onnxsim

        def run(i: str, o: str) -> Any:
            model, ok = onnxsim.simplify(onnx.load(i))
            _save_proto(model, o)
            return {"check_ok": bool(ok)}

        return run
    if tool == "onnxoptimizer":
        import onnx
        import onnxoptimizer

        passes = list(onnxoptimizer.get_fuse_and_elimination_passes())
        if "fuse_bn_into_conv" not in passes:
            passes.append("fuse_bn_into_conv")

        def run(i: str, o: str) -> Any:
            _save_proto(onnxoptimizer.optimize(onnx.load(i), passes), o)

        return run
    if tool == "onnxscript":
        import onnx_ir as ir
        import onnxscript.optimizer
        import onnxscript.rewriter

        def run(i: str, o: str) -> Any:
            model = ir.load(i)
            model = onnxscript.optimizer.optimize(model)
            model = onnxscript.rewriter.rewrite(model)
            # Tensors ir.load left in the input's external data file would be saved as
            # references to that file (dangling next to `o`): read them in, save one file.
            ir.external_data.load_to_model(model)
            ir.save(model, o)

        return run
    if tool == "ort-transformers":
        if not opts.get("model_type"):
            raise _NotApplicable("onnxruntime.transformers has no model type for CNNs")
        from onnxruntime.transformers.optimizer import optimize_model

        def run(i: str, o: str) -> Any:
            # as in onnxruntime's own benchmark scripts: model type, heads and hidden size given
            opt = optimize_model(i, model_type=opts["model_type"], num_heads=opts.get("num_heads", 0),
                                 hidden_size=opts.get("hidden_size", 0), use_gpu=False)
            opt.save_model_to_file(o, use_external_data_format=False)
            return {"fused_op_count": {k: v for k, v in opt.get_fused_operator_statistics().items() if v}}

        return run
    if tool == "ort-offline":
        import onnxruntime as ort

        def run(i: str, o: str) -> Any:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
            so.optimized_model_filepath = o
            so.log_severity_level = 3
            if opts.get("external_data"):
                # otherwise the saved model points at the input's weights file, next to the output
                so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                            Path(o).name + ".data")
            ort.InferenceSession(i, so, providers=["CPUExecutionProvider"])

        return run
    raise ValueError(f"unknown tool {tool!r}")


class _NotApplicable(Exception):
    pass


def _first_line(e: BaseException) -> str:
    # drop onnxruntime's C++ source location and function signature from its messages
    text = re.sub(r"/onnxruntime_src/\S+:\d+ [^()]*\([^)]*\) ", "", str(e))
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def _worker(tool: str, inp: str, out: str, opts: dict[str, Any], result_file: str) -> int:
    res: dict[str, Any] = {"tool": tool}
    try:
        try:
            runner = _tool_runner(tool, opts)
        except _NotApplicable as e:
            res["not_applicable"] = str(e)
            return 0
        t0 = time.perf_counter()
        extra = runner(inp, out)
        res["in_process_s"] = time.perf_counter() - t0
        if isinstance(extra, dict):
            res.update(extra)
        elif extra is not None and hasattr(extra, "rules"):  # a graphopt Report
            with contextlib.suppress(Exception):
                res["report_summary"] = _report_summary(extra)
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001 - the error is the measurement
        res["ok"] = False
        res["error"] = _first_line(e)
        res["traceback"] = traceback.format_exc()[-4000:]
    finally:
        res["peak_rss_mb"] = _peak_rss_mb()
        Path(result_file).write_text(json.dumps(res, default=str))
    return 0


def _peak_rss_mb() -> float | None:
    """This process's peak resident memory. VmHWM, not ru_maxrss: on Linux ru_maxrss
    carries the parent's high-water mark over fork+exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _report_summary(report: Any) -> dict[str, Any]:
    """A few numbers from a graphopt Report (read defensively: the Report is still evolving)."""
    out: dict[str, Any] = {}
    for k in ("times_s", "sweeps", "limit_reached"):
        if hasattr(report, k):
            out[k] = getattr(report, k)
    for k in ("before", "after"):
        nodes = getattr(getattr(report, k, None), "nodes", None)
        if nodes is not None:
            out[f"nodes_{k}"] = nodes
    rules = getattr(report, "rules", None) or {}
    out["applications"] = {name: st.applications for name, st in rules.items() if getattr(st, "applications", 0)}
    return out


def _check_worker(original: str, out: str, ref_file: str, result_file: str) -> int:
    """Node count, onnxruntime load + run, and difference from the reference outputs."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    res: dict[str, Any] = {}
    try:
        proto = onnx.load(out, load_external_data=False)
        res["node_count"] = len(proto.graph.node)
        res["non_standard_ops"] = dict(Counter(f"{n.domain}.{n.op_type}" for n in proto.graph.node
                                               if n.domain not in ("", "ai.onnx")).most_common())
        res["output_bytes"] = sum(p.stat().st_size for p in Path(out).parent.glob(Path(out).name + "*"))
        del proto
    except Exception as e:  # noqa: BLE001
        res["node_count"] = None
        res["proto_error"] = _first_line(e)

    M = _models_module()
    feeds = M.example_inputs(original)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref_path = Path(ref_file)
    if not ref_path.exists():
        sess = ort.InferenceSession(original, so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
        np.savez(ref_path, **{o.name: v for o, v in zip(sess.get_outputs(), outs)})
        del sess
    ref = dict(np.load(ref_path))
    try:
        sess = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
        res["loads_in_ort"] = True
    except Exception as e:  # noqa: BLE001
        res["loads_in_ort"] = False
        res["ort_error"] = _first_line(e)
    else:
        try:
            names = [o.name for o in sess.get_outputs()]
            got = sess.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}})
            res["runs_in_ort"] = True
            ref_list = [ref[n] for n in names] if all(n in ref for n in names) else list(ref.values())
            diffs, match = [], True
            for r, g in zip(ref_list, got):
                if r.shape != g.shape:
                    diffs.append(None)
                    match = False
                    continue
                diffs.append(float(np.max(np.abs(r.astype(np.float64) - g))) if r.size else 0.0)
                match = match and bool(np.allclose(g, r, rtol=1e-3, atol=1e-4))
            res["max_abs_diff"] = max((d for d in diffs if d is not None), default=None)
            res["matches_reference"] = match and len(got) == len(ref_list)
        except Exception as e:  # noqa: BLE001
            res["runs_in_ort"] = False
            res["ort_error"] = _first_line(e)
    Path(result_file).write_text(json.dumps(res, default=str))
    return 0


# =========================================================================== parent side


def _env() -> dict[str, Any]:
    vers: dict[str, str] = {}
    for mod in ("onnx", "onnxruntime", "onnxsim", "onnxoptimizer", "onnxscript", "onnx_ir", "torch", "transformers", "numpy"):
        try:
            vers[mod] = importlib.import_module(mod).__version__
        except Exception as e:  # noqa: BLE001
            vers[mod] = f"unavailable ({_first_line(e)})"
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu,
            "cpu_count": os.cpu_count(), "versions": vers,
            "git_commit": git.stdout.strip() or None}


def _graphopt_status() -> str | None:
    """None when graphopt.optimize_file can be imported in a subprocess, else why not."""
    code = "import graphopt; graphopt.optimize_file"
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_worker_env(), capture_output=True, text=True)
    if p.returncode == 0:
        return None
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {p.returncode}"


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _clean(out: Path) -> None:
    for p in out.parent.glob(out.name + "*"):
        if p.is_file():
            p.unlink()


def _warm(model_path: Path) -> None:
    """Read the model's files so that every timed run finds them in the page cache."""
    for p in model_path.parent.glob(model_path.name + "*"):
        with open(p, "rb") as fh:
            while fh.read(1 << 24):
                pass


def _run_one(tool: str, model_path: Path, out: Path, opts: dict[str, Any], timeout: float, log: Path) -> dict[str, Any]:
    _clean(out)
    # untimed: let the previous run's output reach the disk (its write-back would otherwise
    # overlap this run), then make sure the input is in the page cache
    os.sync()
    _warm(model_path)
    result_file = out.with_name(out.name + ".result.json")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", tool, str(model_path), str(out),
           "--tool-options", json.dumps(opts), "--result", str(result_file)]
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        fh.write(f"\n===== {tool} {model_path}\n")
        fh.flush()
        try:
            p = subprocess.run(cmd, cwd=REPO, env=_worker_env(), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
            rc: int | str = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    res: dict[str, Any] = {}
    if result_file.exists():
        res = json.loads(result_file.read_text())
        result_file.unlink()
    if rc == "timeout":
        res.update(ok=False, error=f"timeout after {timeout:.0f} s")
    elif not res:
        res.update(ok=False, error=f"worker died (exit code {rc}); see {log}")
    res["wall_s"] = wall
    if res.get("traceback"):
        with open(log, "a") as fh:
            fh.write(res.pop("traceback"))
    return res


def _check_one(model_path: Path, out: Path, ref: Path, timeout: float) -> dict[str, Any]:
    result_file = out.with_name(out.name + ".check.json")
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--check-worker", str(model_path), str(out), str(ref),
           "--result", str(result_file)]
    try:
        p = subprocess.run(cmd, cwd=REPO, env=_worker_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"check_error": f"check timed out after {timeout:.0f} s"}
    if result_file.exists():
        res = json.loads(result_file.read_text())
        result_file.unlink()
        return res
    tail = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return {"check_error": f"check worker died (exit code {p.returncode}): {tail[-1] if tail else ''}"}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("ok")]
    s: dict[str, Any] = {
        "n": len(runs),
        "n_ok": len(ok),
        "median_in_process_s": _median([r["in_process_s"] for r in ok]),
        "median_wall_s": _median([r["wall_s"] for r in ok]),
        "in_process_s": [r.get("in_process_s") for r in runs],
        "wall_s": [r.get("wall_s") for r in runs],
        "peak_rss_mb": max((r.get("peak_rss_mb", 0) for r in runs), default=None),
    }
    errors = [r["error"] for r in runs if not r.get("ok") and r.get("error")]
    if errors:
        s["error"] = errors[0]
    for k in ("check_ok", "fused_op_count", "report_summary"):
        if k in runs[-1]:
            s[k] = runs[-1][k]
    return s


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _cell(s: dict[str, Any] | None, key: str = "median_in_process_s") -> str:
    if s is None:
        return "-"
    if s.get("skipped"):
        return "skip"
    if s.get("not_applicable"):
        return "n/a"
    if s.get(key) is None:
        return "ERR"
    return _fmt(s[key])


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="graphopt vs anchors: load+optimize+save times", formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="models: " + ", ".join(sorted(_model_names())))
    ap.add_argument("--models", help=f"comma-separated model names (default: {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--tools", help=f"comma-separated tools (default: all: {','.join(ALL_TOOLS)})")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions per tool and model (default 3); medians are reported")
    ap.add_argument("--quick", action="store_true", help="tiny models only (smoke test)")
    ap.add_argument("--scaling-layers", help="BERT layer counts for the graphopt scaling run (default 2,6,12,24; quick 1,2,4); 'none' to skip")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess (default 1800)")
    ap.add_argument("--no-check", action="store_true", help="skip the onnxruntime load/run check of the outputs")
    ap.add_argument("--out", type=Path, help="JSON result path (default benchmarks/results/<date>[-quick].json)")
    # internal: the per-measurement subprocesses
    ap.add_argument("--worker", nargs=3, metavar=("TOOL", "IN", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--check-worker", nargs=3, metavar=("ORIGINAL", "OUT", "REF"), help=argparse.SUPPRESS)
    ap.add_argument("--tool-options", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.worker:
        return _worker(a.worker[0], a.worker[1], a.worker[2], json.loads(a.tool_options), a.result)
    if a.check_worker:
        return _check_worker(*a.check_worker, a.result)
    return _run(a)


def _model_names() -> list[str]:
    try:
        return list(_model_defs())
    except Exception:  # noqa: BLE001 - only for --help
        return []


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run(a: argparse.Namespace) -> int:
    defs = _model_defs()
    model_names = a.models.split(",") if a.models else (QUICK_MODELS if a.quick else DEFAULT_MODELS)
    for m in model_names:
        if m not in defs:
            raise SystemExit(f"unknown model {m!r}; known: {', '.join(sorted(defs))}")
    tools = a.tools.split(",") if a.tools else list(ALL_TOOLS)
    for t in tools:
        if t not in ALL_TOOLS:
            raise SystemExit(f"unknown tool {t!r}; known: {', '.join(ALL_TOOLS)}")
    if a.scaling_layers == "none":
        layers: list[int] = []
    elif a.scaling_layers:
        layers = [int(x) for x in a.scaling_layers.split(",")]
    else:
        layers = QUICK_SCALING_LAYERS if a.quick else SCALING_LAYERS

    skipped: dict[str, str] = {}
    if any(t in GRAPHOPT_TOOLS for t in tools) or layers:
        why = _graphopt_status()
        if why:
            _log(f"*** graphopt is not importable yet ({why}): skipping graphopt tools and the scaling run ***")
            for t in GRAPHOPT_TOOLS:
                skipped[t] = f"graphopt not importable: {why}"
    scaling_tools = [t for t in GRAPHOPT_TOOLS if t in tools or not a.tools]
    scaling_tools = [t for t in scaling_tools if t not in skipped] if layers else []
    if not scaling_tools:
        layers = []  # nothing to time: do not build the scaling models

    date = _dt.date.today().isoformat()
    out_json = a.out or RESULTS_DIR / f"{date}{'-quick' if a.quick else ''}.json"
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    log = WORK_DIR / f"bench-{date}.log"
    _log(f"worker output goes to {log}")

    # ---- build (or reuse) the models
    jobs: list[tuple[str, ModelDef, list[str]]] = [(m, defs[m], tools) for m in model_names]
    scaling_names = []
    for n in layers:
        name, d = _scaling_model(n, a.quick)
        scaling_names.append(name)
        existing = next((j for j in jobs if j[0] == name), None)
        if existing is None:
            jobs.append((name, d, scaling_tools))
    model_info: dict[str, Any] = {}
    paths: dict[str, Path] = {}
    tool_opts: dict[str, dict[str, Any]] = {}
    for name, d, _ in jobs:
        t0 = time.perf_counter()
        _log(f"[build] {name} ...")
        p = d.build()
        M = _models_module()
        meta = M.load_meta(p)
        paths[name] = p
        (WORK_DIR / name / "reference.npz").unlink(missing_ok=True)  # recomputed once per run
        tool_opts[name] = {"model_type": d.model_type, "external_data": meta["external_data"]}
        if d.model_type:
            tool_opts[name].update(num_heads=meta["params"]["heads"], hidden_size=meta["params"]["hidden"])
        model_info[name] = {
            "path": str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p),
            "note": d.note, "model_type": d.model_type,
            **{k: meta.get(k) for k in ("exporter", "opset", "dynamic", "dynamic_error", "external_data", "files",
                                        "node_count", "parameters", "export_seconds", "build_seconds", "check")},
            "cached_build_lookup_s": round(time.perf_counter() - t0, 3),
        }
        _log(f"[build] {name}: {model_info[name]['node_count']} nodes, export {meta['export_seconds']} s "
             f"(cache lookup {model_info[name]['cached_build_lookup_s']} s)")

    # ---- timed runs, interleaved: for each repetition, every tool on every model
    runs: list[dict[str, Any]] = []
    for rep in range(a.repeat):
        for name, d, job_tools in jobs:
            for tool in job_tools:
                if tool in skipped:
                    continue
                if tool == "ort-transformers" and d.model_type is None:
                    continue
                out = WORK_DIR / name / f"{tool}.onnx"
                out.parent.mkdir(parents=True, exist_ok=True)
                r = _run_one(tool, paths[name], out, tool_opts[name], a.timeout, log)
                r.update(model=name, tool=tool, rep=rep)
                runs.append(r)
                status = (f"{r['in_process_s']:.3f} s in-process, {r['wall_s']:.3f} s wall" if r.get("ok")
                          else r.get("not_applicable") and "n/a" or f"FAILED: {r.get('error')}")
                _log(f"[rep {rep + 1}/{a.repeat}] {name:28s} {tool:18s} {status}")

    # ---- summaries, output checks
    summary: dict[str, dict[str, Any]] = {}
    for name, d, job_tools in jobs:
        summary[name] = {}
        for tool in job_tools:
            if tool in skipped:
                summary[name][tool] = {"skipped": skipped[tool]}
                continue
            if tool == "ort-transformers" and d.model_type is None:
                summary[name][tool] = {"not_applicable": "no onnxruntime.transformers model type for CNNs"}
                continue
            rs = [r for r in runs if r["model"] == name and r["tool"] == tool]
            s = _summarize(rs)
            out = WORK_DIR / name / f"{tool}.onnx"
            if not a.no_check and rs and rs[-1].get("ok") and out.exists():
                s.update(_check_one(paths[name], out, WORK_DIR / name / "reference.npz", a.timeout))
            summary[name][tool] = s
        # the original model's own numbers, for comparison
        summary[name]["(original)"] = {"node_count": model_info[name]["node_count"]}

    ratios: dict[str, dict[str, Any]] = {}
    for name, _, _job_tools in jobs:
        for g in GRAPHOPT_TOOLS:
            gs = summary[name].get(g, {})
            if not gs.get("median_in_process_s"):
                continue
            for anc in ANCHORS:
                s = summary[name].get(anc, {})
                if s.get("median_in_process_s"):
                    ratios.setdefault(name, {})[f"{g}/{anc}"] = {
                        "in_process": _ratio(gs["median_in_process_s"], s["median_in_process_s"]),
                        "wall": _ratio(gs["median_wall_s"], s["median_wall_s"]),
                    }

    scaling: dict[str, Any] = {}
    if layers and scaling_tools:
        for tool in scaling_tools:
            rows = {}
            for n, name in zip(layers, scaling_names):
                s = summary.get(name, {}).get(tool, {})
                rows[str(n)] = {"model": name, "median_in_process_s": s.get("median_in_process_s"),
                                "median_wall_s": s.get("median_wall_s"), "error": s.get("error")}
            entry: dict[str, Any] = {"layers": rows}
            big = max(layers)
            half = big // 2
            if str(half) in rows:
                r_in = _ratio(rows[str(big)]["median_in_process_s"], rows[str(half)]["median_in_process_s"])
                entry[f"ratio_{big}_over_{half}"] = r_in
                entry["limit"] = SCALING_RATIO_LIMIT
                entry["pass"] = None if r_in is None else r_in <= SCALING_RATIO_LIMIT
            scaling[tool] = entry

    result = {
        "date": date,
        "timestamp": _dt.datetime.now().isoformat(timespec="seconds"),
        "env": _env(),
        "config": {"models": model_names, "tools": tools, "repeat": a.repeat, "quick": a.quick,
                   "scaling_layers": layers, "timing": "in_process_s: load+optimize+save inside a fresh subprocess, "
                   "after imports; wall_s: the whole subprocess (interpreter start and imports included)"},
        "skipped": skipped,
        "models": model_info,
        "runs": runs,
        "summary": summary,
        "ratios": ratios,
        "scaling": scaling,
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(result, indent=1, default=str))
    md = _markdown(result, model_names, tools)
    out_json.with_suffix(".md").write_text(md)
    _log(f"\nwrote {out_json} and {out_json.with_suffix('.md')}")
    print(_short_table(result, model_names, tools))
    return 0


def _markdown(res: dict[str, Any], models: list[str], tools: list[str]) -> str:
    env = res["env"]
    lines = [f"### {res['date']}: {env['cpu']} ({env['cpu_count']} cores), "
             + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if not str(v).startswith("unavailable")),
             "",
             f"Median of {res['config']['repeat']} runs, seconds, file to file (load + optimize + save). "
             "Each cell: in-process time / subprocess wall time (imports included) / nodes after "
             "(✗ = output does not load in onnxruntime, ≠ = outputs differ from the original's).", ""]
    cols = [t for t in tools]
    lines.append("| model (nodes) | " + " | ".join(cols) + " |")
    lines.append("|---|" + "---|" * len(cols))
    for m in models:
        row = [f"{m} ({res['models'][m]['node_count']})"]
        for t in cols:
            s = res["summary"][m].get(t)
            if s is None:
                row.append("-")
            elif s.get("skipped"):
                row.append("skipped")
            elif s.get("not_applicable"):
                row.append("n/a")
            elif s.get("median_in_process_s") is None:
                row.append(f"error: `{(s.get('error') or '')[:80]}`")
            else:
                flag = ""
                if s.get("loads_in_ort") is False:
                    flag = " ✗"
                elif s.get("matches_reference") is False:
                    flag = " ≠"
                row.append(f"{_fmt(s['median_in_process_s'])} / {_fmt(s['median_wall_s'])} / {s.get('node_count', '?')}{flag}")
        lines.append("| " + " | ".join(row) + " |")
    if res["ratios"]:
        anchors = [t for t in ANCHORS if t in tools]
        lines += ["", "graphopt / anchor, ratio of median in-process times (of wall times in parentheses); < 1: graphopt is faster:", "",
                  "| model | graphopt | " + " | ".join(anchors) + " |", "|---|---|" + "---|" * len(anchors)]
        for m, r in res["ratios"].items():
            for g in GRAPHOPT_TOOLS:
                cells = [r.get(f"{g}/{a}") for a in anchors]
                if any(cells):
                    lines.append(f"| {m} | {g} | " + " | ".join(
                        f"{c['in_process']:.2f} ({c['wall']:.2f})" if c else "-" for c in cells) + " |")
    for tool, sc in res["scaling"].items():
        lines += ["", f"Scaling, {tool} on BERT (dynamo export), median in-process s:", "",
                  "| layers | " + " | ".join(sc["layers"]) + " |", "|---|" + "---|" * len(sc["layers"]),
                  "| time | " + " | ".join(_fmt(v["median_in_process_s"]) for v in sc["layers"].values()) + " |"]
        rk = next((k for k in sc if k.startswith("ratio_")), None)
        if rk:
            lines.append(f"\n{rk}: {sc[rk] and round(sc[rk], 2)} (limit {sc['limit']}): {_verdict(sc['pass'])}")
    if res["skipped"]:
        lines += [""] + [f"- {t} skipped: {why}" for t, why in res["skipped"].items()]
    return "\n".join(lines) + "\n"


def _verdict(ok: bool | None) -> str:
    return "no data" if ok is None else ("PASS" if ok else "FAIL")


def _short_table(res: dict[str, Any], models: list[str], tools: list[str]) -> str:
    w = max(len(m) for m in models) + 2
    head = "model".ljust(w) + "".join(t[:16].rjust(17) for t in tools)
    lines = ["", "median in-process seconds (load+optimize+save; ERR = failed, n/a, skip)", head, "-" * len(head)]
    for m in models:
        lines.append(m.ljust(w) + "".join(_cell(res["summary"][m].get(t)).rjust(17) for t in tools))
    lines += ["", "median subprocess wall seconds", head, "-" * len(head)]
    for m in models:
        lines.append(m.ljust(w) + "".join(_cell(res["summary"][m].get(t), "median_wall_s").rjust(17) for t in tools))
    lines += ["", "nodes after (original in parentheses)", head, "-" * len(head)]
    for m in models:
        lines.append((m + f" ({res['models'][m]['node_count']})").ljust(w) + "".join(
            str(res["summary"][m].get(t, {}).get("node_count", "-")).rjust(17) for t in tools))
    errs = [(m, t, s["error"]) for m in models for t, s in res["summary"][m].items() if isinstance(s, dict) and s.get("error")]
    if errs:
        lines += ["", "errors:"] + [f"  {m} / {t}: {e}" for m, t, e in errs]
    bad = [(m, t) for m in models for t, s in res["summary"][m].items()
           if isinstance(s, dict) and (s.get("loads_in_ort") is False or s.get("matches_reference") is False)]
    if bad:
        lines += ["", "outputs that do not load or differ from the original in onnxruntime:"] + [
            f"  {m} / {t}: {res['summary'][m][t].get('ort_error') or 'max |diff| ' + str(res['summary'][m][t].get('max_abs_diff'))}" for m, t in bad]
    for m, r in res["ratios"].items():
        lines.append(f"\n{m}: " + ", ".join(f"{k} = {v['in_process']:.2f}" for k, v in r.items() if v["in_process"]))
    for tool, sc in res["scaling"].items():
        rk = next((k for k in sc if k.startswith("ratio_")), None)
        times = ", ".join(f"L{k}: {_fmt(v['median_in_process_s'])}" for k, v in sc["layers"].items())
        lines.append(f"\nscaling {tool}: {times}" + (f"; {rk} = {sc[rk] and round(sc[rk], 2)} "
                                                      f"(limit {sc['limit']}) {_verdict(sc['pass'])}" if rk else ""))
    if res["skipped"]:
        lines += [""] + [f"{t} skipped: {why}" for t, why in res["skipped"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
