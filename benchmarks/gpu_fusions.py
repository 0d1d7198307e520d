"""Inference latency of graphopt's output against the fusion anchors, side by side (issue 3).

For each model, torch exporter and precision, every *variant* below is run in
onnxruntime (ORT_ENABLE_ALL) on the same inputs and timed:

  original             the export itself; fp16: converted with onnxruntime's float16 converter
                       (OnnxModel.convert_float_to_float16(keep_io_types=True))
  original+nhwc        CNNs on CUDA: the same file with the CUDA provider's prefer_nhwc=1
  ort-transformers     onnxruntime.transformers.optimizer.optimize_model(model_type=bert|gpt2|vit,
                       num_heads, hidden_size, use_gpu=<CUDA run>, default opt_level); fp16: the same
                       converter (not applicable to CNNs)
  onnxscript           onnxscript.rewriter.ort_fusions.optimize_for_ort; fp16: the same converter
  graphopt             graphopt.optimize_file(target="ort-cuda" | "ort-cpu"); fp16: graphopt's own
                       precision="fp16" when OptimizeOptions has it, else the fp32 output through the
                       anchors' converter (marked in the table)
  graphopt+nhwc        CNNs on CUDA: graphopt's output with prefer_nhwc=1
  graphopt-nchw(+nhwc) CNNs on CUDA, when OptimizeOptions has `layout`: graphopt with layout="nchw"
  graphopt-pools       CNNs on CUDA: layout NHWC with the pools in onnxruntime's internal NHWC domain
  graphopt-biasadd     CNNs on CUDA: layout NHWC, each conv bias added by its own Add (conv_bias="add")
  graphopt-mha         transformers: q/k/v projections not packed (MultiHeadAttention instead of Attention)
  graphopt-noattn      transformers: every fusion but attention's (what the fused attention kernel is worth)

The first four are the anchors; the goal (issue 3) is graphopt <= 0.9x the best anchor in
fp16 and <= 1.0x in fp32 on CUDA, and <= 1.0x on the CPU provider.

    python benchmarks/gpu_fusions.py --models bert --exporters dynamo,torchscript --precisions fp32,fp16 --out OUT
    python benchmarks/gpu_fusions.py --models resnet --out OUT                 # CUDA, fp32 and fp16
    python benchmarks/gpu_fusions.py --provider cpu --models bert,gpt2 --out OUT
    python benchmarks/gpu_fusions.py --tiny --provider cpu --models bert,gpt2,resnet --out /tmp/gf   # CPU dry run

Phases (one function each): export (tests/models.py builders, one subprocess per model and
exporter, in parallel), optimize (one subprocess per model, exporter and tool, in parallel,
with a timeout; a crash is recorded, never fatal), time (one subprocess per model and
exporter, variants one after another; a variant that crashes the process is recorded and the
rest go on in a new process), then the table. Exports and optimizer outputs are cached in
--work (default /tmp/gpu_fusions); graphopt's outputs are redone when graphopt's sources change.

Timing: CUDA: inputs bound to device memory (OrtValue on "cuda"), outputs bound by name to
"cuda", --warmup runs, then --iters timed run_with_iobinding calls (each synchronizes), median
and p10/p90 in ms. CPU: session.run with numpy feeds. Each variant's outputs are compared
with the fp32 original's on the same provider and inputs: max |diff| and max |diff| / max |ref|.
"fused ops" are the com.microsoft (and other non-standard-domain) ops plus the standard fused ops
(LayerNormalization, Gelu, ...) of the session's graph after onnxruntime's own optimizations
(dumped with optimized_model_filepath); the optimizer's file's own counts are in the JSON too.

Output: OUT/gpu_fusions-<models>[-cpu][-tiny].json (everything) and a table printed last.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import datetime as _dt
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_profile import kernel_profile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WORK = Path("/tmp/gpu_fusions")
SCRIPT_VERSION = 1  # part of every cache fingerprint

ANCHOR_VARIANTS = ("original", "original+nhwc", "ort-transformers", "onnxscript")
GRAPHOPT_VARIANTS = ("graphopt", "graphopt+nhwc", "graphopt-nchw", "graphopt-nchw+nhwc", "graphopt-pools", "graphopt-biasadd",
                     "graphopt-biasadd+nhwc", "graphopt-mha", "graphopt-noattn")
ALL_VARIANTS = ANCHOR_VARIANTS + GRAPHOPT_VARIANTS
#: goal: graphopt's best median / the best anchor's median at most this (issue 3)
GOAL = {("cuda", "fp16"): 0.9, ("cuda", "fp32"): 1.0, ("cpu", "fp32"): 1.0, ("cpu", "fp16"): 1.0}
#: outputs further than this from the fp32 reference (max |diff| / max |ref|) are flagged "≠"
#: (CUDA fp32: onnxruntime's CUDA provider uses TF32 by default, use_tf32=1)
TOLERANCE = {("cpu", "fp32"): 1e-3, ("cuda", "fp32"): 5e-3, ("cpu", "fp16"): 3e-2, ("cuda", "fp16"): 3e-2}
#: standard ops that are fusions of several others: counted with the com.microsoft ones as "fused ops"
STANDARD_FUSED_OPS = frozenset({"LayerNormalization", "Gelu", "RMSNormalization", "Attention", "GroupNormalization"})
#: an anchor whose outputs are this far off (or NaN, or the wrong shape) is broken: not a "best anchor"
BROKEN_REL = 0.5


# =========================================================================== models


@dataclass(frozen=True)
class ModelDef:
    builder: str  # function name in tests/models.py
    kwargs: dict[str, Any]  # benchmark size
    tiny_builder: str
    tiny_kwargs: dict[str, Any]
    model_type: str | None  # onnxruntime.transformers model type; None: a CNN
    note: str


MODELS: dict[str, ModelDef] = {
    "bert": ModelDef("bert", dict(layers=12, hidden=768, heads=12, seq=128, batch=8), "bert_tiny", dict(batch=2),
                     "bert", "BERT-base b8 s128"),
    "gpt2": ModelDef("gpt2", dict(layers=12, hidden=768, heads=12, seq=512, batch=1), "gpt2_tiny", dict(batch=1),
                     "gpt2", "GPT-2 (124M, LM head) b1 s512"),
    "vit": ModelDef("vit", dict(layers=12, hidden=768, heads=12, batch=8), "vit_tiny", dict(batch=2),
                    "vit", "ViT-base/16 224x224 b8"),
    "resnet": ModelDef("resnet50_like", dict(batch=32), "resnet_tiny", dict(batch=2), None, "ResNet-50 224x224 b32"),
}
ALIASES = {"bert-base": "bert", "resnet50": "resnet", "vit-base": "vit"}


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


# =========================================================================== small helpers


def _first_line(e: BaseException | str) -> str:
    text = str(e) if isinstance(e, str) else f"{type(e).__name__}: {e}"
    # drop onnxruntime's C++ source locations
    text = re.sub(r"/onnxruntime_src/\S+:\d+ [^()]*\([^)]*\) ", "", text)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else "(no message)"


def _log_tail(path: Path, n: int = 25) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln[:400] for ln in lines[-n:]]


def _last_error_line(path: Path) -> str:
    """The most telling line of a worker's log: the last exception line, else the last line."""
    lines = [ln for ln in _log_tail(path, 200) if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^\w*(Error|Exception|Fail\w*)\b", ln.strip()) or "Error:" in ln or "error:" in ln:
            return ln.strip()[:300]
    return lines[-1].strip()[:300] if lines else "(empty log)"


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _run_worker(args: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, float]:
    """Run `python gpu_fusions.py <args>`; stdout+stderr to `log`. Returns (exit code or None on timeout, seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], stdout=fh,
                                stderr=subprocess.STDOUT, env=env or _subprocess_env(), cwd=REPO,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            rc = None
    return rc, time.perf_counter() - t0


def _kill(proc: subprocess.Popen[Any]) -> None:
    """Kill the worker and its children (it runs in its own session, see _run_worker)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, 9)
    with contextlib.suppress(Exception):
        proc.wait(timeout=30)


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _test_hook(phase: str, key: str) -> None:
    """GPU_FUSIONS_TEST=crash:time:graphopt/fp32,hang:optimize:onnxscript makes a worker abort or
    hang there: how the crash and timeout handling is tested."""
    for entry in filter(None, os.environ.get("GPU_FUSIONS_TEST", "").split(",")):
        what, _, where = entry.partition(":")
        if where == f"{phase}:{key}":
            print(f"test hook: {what} at {where}", flush=True)
            if what == "crash":
                os.abort()
            time.sleep(1e6)


def _graphopt_fingerprint() -> str:
    """Hash of graphopt's sources and pattern library: graphopt outputs are redone when it changes."""
    h = hashlib.sha256()
    for folder in (REPO / "graphopt", REPO / "rules"):
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.suffix in (".py", ".pdll", ".json") and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(REPO)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _op_counts(path: str | Path) -> dict[str, Any]:
    """Node count and the fused ops of a model file: non-standard domains, and STANDARD_FUSED_OPS."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    fused = Counter(f"{n.domain or 'ai.onnx'}.{n.op_type}" for n in proto.graph.node
                    if n.domain not in ("", "ai.onnx") or n.op_type in STANDARD_FUSED_OPS)
    return {"nodes": len(proto.graph.node), "fused": dict(fused.most_common())}


# =========================================================================== phase 1: export


def export_worker(model: str, exporter: str, tiny: bool, check: str) -> int:
    """Subprocess: build (or reuse) one export; print its path and meta summary as JSON."""
    M = _models_module()
    d = MODELS[model]
    name = d.tiny_builder if tiny else d.builder
    if not hasattr(M, name):
        raise SystemExit(f"tests/models.py has no builder {name}()")
    if check != "full":  # the builders check the export against torch at two sizes; limit that
        full_check = M._check

        def limited(module: Any, path: Any, in_dicts: Any, spec: Any, dynamic: bool) -> dict[str, Any]:
            if check == "export":
                return full_check(module, path, in_dicts, spec, False)  # the export size only
            return {"export_shape": {"ok": True, "skipped": "gpu_fusions.py --export-check none"}}

        M._check = limited
    kwargs = dict(d.tiny_kwargs if tiny else d.kwargs)
    path = getattr(M, name)(exporter=exporter, **kwargs)
    meta = M.load_meta(path)
    summary = {k: meta.get(k) for k in ("key", "params", "dims", "opset", "dynamic", "external_data", "node_count",
                                         "export_seconds", "build_seconds", "check", "versions")}
    print("EXPORT-RESULT " + json.dumps({"path": str(path), **summary}, default=str))
    return 0


def phase_export(cfg: argparse.Namespace) -> dict[tuple[str, str], dict[str, Any]]:
    """Export every (model, exporter), in parallel subprocesses; cached in WORK/models."""
    env = _subprocess_env()
    env["GRAPHOPT_MODEL_CACHE"] = str(cfg.work / "models")
    jobs = [(m, e) for m in cfg.models for e in cfg.exporters]

    def one(job: tuple[str, str]) -> dict[str, Any]:
        m, e = job
        log = cfg.work / "logs" / f"export-{m}-{e}{'-tiny' if cfg.tiny else ''}.log"
        args = ["--_export", m, e, "--export-check", cfg.export_check] + (["--tiny"] if cfg.tiny else [])
        rc, secs = _run_worker(args, log, cfg.export_timeout, env)
        found = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("EXPORT-RESULT ")]
        if rc == 0 and found:
            res = json.loads(found[-1][len("EXPORT-RESULT "):])
            res["seconds"] = round(secs, 1)
            return res
        why = "timed out" if rc is None else f"failed (exit {rc})"
        return {"error": f"export {why}: {_last_error_line(log)}", "log_tail": _log_tail(log), "seconds": round(secs, 1)}

    out: dict[tuple[str, str], dict[str, Any]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=cfg.jobs) as pool:
        for job, res in zip(jobs, pool.map(one, jobs)):
            out[job] = res
            _say(f"export {job[0]} {job[1]}: " + (res.get("error") or f"{res['node_count']} nodes, {res['seconds']} s "
                                                   f"({res['path']})"))
    return out


# =========================================================================== phase 2: optimize


def _convert_fp16(src: str, dst: str) -> None:
    """The anchors' fp16 path: onnxruntime.transformers' converter, inputs and outputs kept float32."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(src))
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(dst, use_external_data_format=model.model.ByteSize() > 2**31 - 2**24)


def _optimize_fp32(tool: str, job: dict[str, Any], dst: str) -> dict[str, Any]:
    """One tool's fp32 output; returns extra facts (fusion counts, graphopt report numbers)."""
    src, cuda = job["src"], job["provider"] == "cuda"
    if tool == "ort-transformers":
        from onnxruntime.transformers.optimizer import optimize_model

        opt = optimize_model(src, model_type=job["model_type"], num_heads=job["heads"], hidden_size=job["hidden"],
                             use_gpu=cuda)
        opt.save_model_to_file(dst, use_external_data_format=opt.model.ByteSize() > 2**31 - 2**24)
        return {"fusion_counts": {k: v for k, v in opt.get_fused_operator_statistics().items() if v}}
    if tool == "onnxscript":
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        model = ir.load(src)
        model, counts = optimize_for_ort(model)
        ir.external_data.load_to_model(model)  # one self-contained output file
        ir.save(model, dst)
        return {"fusion_counts": {k: v for k, v in counts.items() if v}}
    if tool.startswith("graphopt"):
        return _graphopt(job, dst, None)
    raise ValueError(tool)


def _graphopt(job: dict[str, Any], dst: str, precision: str | None) -> dict[str, Any]:
    import graphopt

    kwargs: dict[str, Any] = {"target": "ort-cuda" if job["provider"] == "cuda" else "ort-cpu"}
    if precision:
        kwargs["precision"] = precision
    if job["tool"] == "graphopt-nchw":
        kwargs["layout"] = "nchw"
    if job["tool"] == "graphopt-noattn":
        kwargs["disable"] = ["FuseAttention", "PackAttentionProjections", "PackedProjectionAttention"]
    if job["tool"] == "graphopt-mha":
        kwargs["disable"] = ["PackAttentionProjections", "PackedProjectionAttention"]
    if job["tool"] == "graphopt-pools":
        from graphopt.passes.layout import LayoutOptions

        kwargs["layout"] = LayoutOptions(mode="nhwc", internal_nhwc_pools=True)
    if job["tool"] == "graphopt-biasadd":
        from graphopt.passes.layout import LayoutOptions

        kwargs["layout"] = LayoutOptions(mode="nhwc", conv_bias="add")
    report = graphopt.optimize_file(job["src"], dst, **kwargs)
    rules = getattr(report, "rules", None) or {}
    return {"graphopt_options": {k: v if isinstance(v, (str, int, float)) else repr(v) for k, v in kwargs.items()},
            "applications": {n: s.applications for n, s in rules.items() if getattr(s, "applications", 0)},
            "warnings": list(getattr(report, "warnings", []) or [])[:10]}


def _graphopt_has(option: str) -> bool:
    import graphopt

    return option in {f.name for f in dataclasses.fields(graphopt.OptimizeOptions)}


def optimize_worker(job_file: str) -> int:
    """Subprocess: one tool on one export, every requested precision; writes its result JSON
    after each step, so that a crash in fp16 keeps the fp32 result."""
    job = json.loads(Path(job_file).read_text())
    tool, out_dir = job["tool"], Path(job["out_dir"])
    result_path = out_dir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if result.get("fingerprint") != job["fingerprint"]:
        result = {"fingerprint": job["fingerprint"], "tool": tool, "precisions": {}}
    if job["provider"] == "cuda":
        import onnxruntime as ort

        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # ort-transformers' opt_level 1 runs a CUDA session

    def save() -> None:
        result_path.write_text(json.dumps(result, indent=1, default=str))

    for precision in job["precisions"]:
        if precision in result["precisions"]:
            continue
        entry: dict[str, Any] = {}
        t0 = time.perf_counter()
        _test_hook("optimize", f"{tool}/{precision}")
        try:
            if precision == "fp32":
                if tool == "original":
                    entry["path"] = job["src"]
                else:
                    dst = str(out_dir / "fp32.onnx")
                    entry.update(_optimize_fp32(tool, job, dst))
                    entry["path"] = dst
            else:
                dst = str(out_dir / f"{precision}.onnx")
                if tool.startswith("graphopt") and _graphopt_has("precision"):
                    entry.update(_graphopt(job, dst, precision))
                    entry["how"] = f"graphopt precision={precision!r}"
                else:
                    fp32 = result["precisions"].get("fp32", {})
                    if not fp32.get("path"):
                        raise RuntimeError(f"no fp32 output to convert ({fp32.get('error', 'not made')})")
                    if precision != "fp16":
                        raise RuntimeError(f"onnxruntime's converter makes fp16 only, not {precision}")
                    _convert_fp16(fp32["path"], dst)
                    entry["how"] = "fp32 output + onnxruntime float16 converter (keep_io_types)"
                    if tool.startswith("graphopt"):
                        entry["note"] = "graphopt has no precision option yet: converted like the anchors"
                entry["path"] = dst
            entry["seconds"] = round(time.perf_counter() - t0, 2)
            entry.update(_op_counts(entry["path"]))
        except Exception as e:  # noqa: BLE001 - the failure is the result
            entry = {"error": f"crashed: {_first_line(e)}", "traceback": traceback.format_exc()[-3000:],
                     "seconds": round(time.perf_counter() - t0, 2)}
        result["precisions"][precision] = entry
        save()
        print(f"{tool} {precision}: {entry.get('error') or entry['path']}", flush=True)
    return 0


def _tools_for(cfg: argparse.Namespace, model: str) -> list[str]:
    cnn = MODELS[model].model_type is None
    tools = ["original", "onnxscript", "graphopt"]
    if not cnn:
        tools.insert(1, "ort-transformers")
        tools += ["graphopt-mha", "graphopt-noattn"]
    if cnn and cfg.provider == "cuda" and cfg.graphopt_layout:
        tools += ["graphopt-nchw", "graphopt-pools", "graphopt-biasadd"]
    wanted = {v.split("+")[0] for v in cfg.variants} | {"original"}
    return [t for t in tools if t in wanted]


def phase_optimize(cfg: argparse.Namespace, exports: dict[tuple[str, str], dict[str, Any]]
                   ) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every tool on every export (cached in WORK/opt), in parallel subprocesses with a timeout."""
    import onnx
    import onnxruntime
    import onnxscript

    versions = f"{onnx.__version__}/{onnxruntime.__version__}/{onnxscript.__version__}"
    graphopt_fp = _graphopt_fingerprint()
    jobs = []
    for (m, e), exp in exports.items():
        if exp.get("error"):
            continue
        src = Path(exp["path"])
        stamp = f"{exp.get('key')}/{src.stat().st_mtime_ns}/{src.stat().st_size}"
        for tool in _tools_for(cfg, m):
            # original and onnxscript do not depend on the provider; the others do
            sub = tool if tool in ("original", "onnxscript") else f"{tool}-{cfg.provider}"
            out_dir = cfg.work / "opt" / (exp.get("key") or src.parent.name) / sub
            fp = hashlib.sha256(f"{SCRIPT_VERSION}|{stamp}|{sub}|{versions}|"
                                f"{graphopt_fp if tool.startswith('graphopt') else ''}".encode()).hexdigest()[:16]
            params = exp.get("params") or {}
            job = {"tool": tool, "src": str(src), "out_dir": str(out_dir), "provider": cfg.provider,
                   "precisions": cfg.precisions, "fingerprint": fp, "model_type": MODELS[m].model_type,
                   "heads": params.get("heads", 0), "hidden": params.get("hidden", 0)}
            jobs.append(((m, e, tool), job))

    def cached(job: dict[str, Any]) -> dict[str, Any] | None:
        p = Path(job["out_dir"]) / "result.json"
        if cfg.fresh or not p.exists():
            return None
        res = json.loads(p.read_text())
        if res.get("fingerprint") != job["fingerprint"]:
            return None
        precs = res.get("precisions", {})
        if all(pr in precs and (precs[pr].get("error") or Path(precs[pr]["path"]).exists()) for pr in job["precisions"]):
            return res
        return None

    def one(item: tuple[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
        (m, e, tool), job = item
        hit = cached(job)
        if hit is not None:
            hit["cached"] = True
            return hit
        out_dir = Path(job["out_dir"])
        if cfg.fresh:
            shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        job_file = out_dir / "job.json"
        job_file.write_text(json.dumps(job))
        log = cfg.work / "logs" / f"optimize-{m}-{e}-{tool}-{cfg.provider}.log"
        rc, secs = _run_worker(["--_optimize", str(job_file)], log, cfg.optimize_timeout)
        p = out_dir / "result.json"
        res = json.loads(p.read_text()) if p.exists() else {}
        if res.get("fingerprint") != job["fingerprint"]:
            res = {"fingerprint": job["fingerprint"], "tool": tool, "precisions": {}}
        why = (f"optimizer timed out after {cfg.optimize_timeout:.0f} s" if rc is None
               else f"crashed: exit {rc}: {_last_error_line(log)}" if rc != 0 else "crashed: no result written")
        for pr in job["precisions"]:
            if pr not in res["precisions"]:
                res["precisions"][pr] = {"error": why, "log_tail": _log_tail(log)}
        if rc is None:  # a timeout is not cached: the next run tries again
            p.unlink(missing_ok=True)
        res["worker_seconds"] = round(secs, 1)
        return res

    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=cfg.jobs) as pool:
        for (key, _job), res in zip(jobs, pool.map(one, jobs)):
            out[key] = res
            states = ", ".join(f"{pr}: {v.get('error') or str(v.get('seconds', 0)) + ' s'}"
                               for pr, v in res["precisions"].items())
            _say(f"optimize {' '.join(key)}{' (cached)' if res.get('cached') else ''}: {states}")
    return out


# =========================================================================== phase 3: time


def _session(path: str, variant: dict[str, Any], job: dict[str, Any], dump: Path | None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if dump is not None:
        so.optimized_model_filepath = str(dump)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", dump.name + ".data")
    if job["provider"] == "cuda":
        providers: list[Any] = [("CUDAExecutionProvider", {"device_id": "0", **variant["provider_options"]}),
                                "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    return ort.InferenceSession(path, so, providers=providers)


_NP_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
             "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool"}


def _time_variant(variant: dict[str, Any], job: dict[str, Any], feeds: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Create the session, time it, return (result, outputs by name)."""
    import numpy as np
    import onnxruntime as ort

    res: dict[str, Any] = {}
    tmp = Path(job["tmp_dir"])
    tmp.mkdir(parents=True, exist_ok=True)
    dump = tmp / f"{variant['name'].replace('+', '_')}-{variant['precision']}.session.onnx" if job["dump"] else None
    t0 = time.perf_counter()
    try:
        sess = _session(variant["path"], variant, job, dump)
    except Exception as e:  # noqa: BLE001
        if dump is None:
            return {"error": f"does not load: {_first_line(e)}"}, None
        try:  # perhaps only the dump failed
            sess = _session(variant["path"], variant, job, None)
        except Exception:  # noqa: BLE001
            return {"error": f"does not load: {_first_line(e)}"}, None
        res["dump_error"] = _first_line(e)
        dump = None
    res["session_s"] = round(time.perf_counter() - t0, 2)
    res["providers"] = sess.get_providers()
    if job["provider"] == "cuda":
        if sess.get_providers()[0] != "CUDAExecutionProvider":
            return {"error": f"CUDA provider not used: {sess.get_providers()}"}, None
        res["cuda_options"] = {k: v for k, v in sess.get_provider_options().get("CUDAExecutionProvider", {}).items()
                               if k in ("prefer_nhwc", "use_tf32", "cudnn_conv_algo_search", "enable_cuda_graph",
                                        "cudnn_conv_use_max_workspace", "use_ep_level_unified_stream")}
    if dump is not None and dump.exists():
        with contextlib.suppress(Exception):
            res["session_ops"] = _op_counts(dump)
        for p in tmp.glob(dump.name + "*"):
            p.unlink()

    inputs = {}
    for i in sess.get_inputs():
        if i.name not in feeds:
            return {**res, "error": f"does not run: input {i.name} not among the model's example inputs"}, None
        inputs[i.name] = feeds[i.name].astype(_NP_TYPES.get(i.type, feeds[i.name].dtype), copy=False)
    names = [o.name for o in sess.get_outputs()]
    try:
        if job["provider"] == "cuda":
            iob = sess.io_binding()
            keep = []
            for name, arr in inputs.items():
                ov = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), "cuda", 0)
                keep.append(ov)
                iob.bind_ortvalue_input(name, ov)
            for name in names:
                iob.bind_output(name, "cuda")
            iob.synchronize_inputs()

            def run() -> None:
                sess.run_with_iobinding(iob)
                iob.synchronize_outputs()

            def outputs() -> list[Any]:
                return iob.copy_outputs_to_cpu()
        else:
            last: list[Any] = []

            def run() -> None:
                last[:] = sess.run(None, inputs)

            def outputs() -> list[Any]:
                return last

        t0 = time.perf_counter()
        for _ in range(job["warmup"]):
            run()
        res["warmup_s"] = round(time.perf_counter() - t0, 2)
        times = []
        for _ in range(job["iters"]):
            t = time.perf_counter()
            run()
            times.append((time.perf_counter() - t) * 1e3)
        outs = dict(zip(names, outputs()))
    except Exception as e:  # noqa: BLE001
        return {**res, "error": f"does not run: {_first_line(e)}"}, None
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
    res.update(median_ms=round(statistics.median(times), 4), p10_ms=round(q[0], 4), p90_ms=round(q[-1], 4),
               min_ms=round(min(times), 4), iters=len(times))
    if job.get("kernels") and job["provider"] == "cuda":
        try:
            res["kernels"] = kernel_profile(run, top=15)
        except Exception as e:  # noqa: BLE001 - the profile is extra information, never fatal
            res["kernels"] = {"error": _first_line(e)}
    return res, outs


def _compare(outs: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """max |diff| and max |diff| / max |ref| over the outputs, against the fp32 original's."""
    import numpy as np

    per: dict[str, Any] = {}
    for name, r in ref.items():
        g = outs.get(name)
        if g is None:
            per[name] = {"error": "missing"}
            continue
        g = np.asarray(g)
        if g.shape != r.shape:
            per[name] = {"error": f"shape {list(g.shape)} != {list(r.shape)}"}
            continue
        gf = g.astype(np.float32, copy=False)
        if not np.isfinite(gf).all():
            per[name] = {"error": "NaN/inf in output"}
            continue
        d = float(np.max(np.abs(gf - r))) if r.size else 0.0
        mag = float(np.max(np.abs(r))) if r.size else 0.0
        per[name] = {"max_abs_diff": d, "max_abs_ref": mag, "rel": d / mag if mag else d}
    bad = [f"{n}: {v['error']}" for n, v in per.items() if "error" in v]
    return {"outputs": per, "max_abs_diff": max((v.get("max_abs_diff", 0.0) for v in per.values()), default=None),
            "max_rel_diff": max((v.get("rel", 0.0) for v in per.values()), default=None),
            "output_error": "; ".join(bad) or None}


def time_worker(job_file: str) -> int:
    """Subprocess: time the variants of one export, one after another; one JSON line per event
    ("start", then "done") so that the parent knows which variant a crash happened in."""
    import numpy as np
    import onnxruntime as ort

    job = json.loads(Path(job_file).read_text())
    if job["provider"] == "cuda" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    feeds = _models_module().example_inputs(job["model_path"])
    ref_path = Path(job["ref_file"])
    ref = dict(np.load(ref_path)) if ref_path.exists() else None
    with open(job["result_file"], "a") as out:
        def emit(rec: dict[str, Any]) -> None:
            out.write(json.dumps(rec, default=str) + "\n")
            out.flush()

        for v in job["variants"]:
            emit({"event": "start", "id": v["id"]})
            _test_hook("time", v["id"])
            res, outs = _time_variant(v, job, feeds)
            if outs is not None:
                if v.get("reference") and ref is None:
                    ref = {k: np.asarray(a).astype(np.float32) for k, a in outs.items()}
                    np.savez(ref_path, **ref)
                if ref is None:  # the reference itself failed: compare with the original on the CPU provider
                    sess = ort.InferenceSession(job["model_path"], providers=["CPUExecutionProvider"])
                    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
                    res["reference_note"] = "fp32 original on the CPU provider"
                res.update(_compare(outs, ref))
            emit({"event": "done", "id": v["id"], **res})
            del outs
    return 0


def _variants_for(cfg: argparse.Namespace, model: str, exporter: str,
                  optimized: dict[tuple[str, str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The timed variants of one export; the fp32 original first (it is the reference)."""
    cnn = MODELS[model].model_type is None
    out = []
    for precision in cfg.precisions:
        for name in ALL_VARIANTS:
            tool, _, extra = name.partition("+")
            nhwc = extra == "nhwc"
            if nhwc and not (cnn and cfg.provider == "cuda"):
                continue
            reference = name == "original" and precision == "fp32"
            if name not in cfg.variants and not reference:
                continue
            opt = optimized.get((model, exporter, tool))
            if opt is None:
                continue  # tool not applicable (ort-transformers on a CNN, graphopt-nchw without `layout`)
            entry = opt["precisions"].get(precision, {"error": "not made"})
            out.append({"id": f"{name}/{precision}", "name": name, "tool": tool, "precision": precision,
                        "path": entry.get("path"), "error": entry.get("error"), "reference": reference,
                        "provider_options": {"prefer_nhwc": "1"} if nhwc else {},
                        "file_ops": {k: entry.get(k) for k in ("nodes", "fused") if k in entry},
                        "how": entry.get("how"), "note": entry.get("note"),
                        "fusion_counts": entry.get("fusion_counts"), "optimize_s": entry.get("seconds")})
    out.sort(key=lambda v: not v["reference"])
    return out


def phase_time(cfg: argparse.Namespace, exports: dict[tuple[str, str], dict[str, Any]],
               optimized: dict[tuple[str, str, str], dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Time every variant, one export after another (nothing else runs meanwhile)."""
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for (m, e), exp in exports.items():
        if exp.get("error"):
            continue
        variants = _variants_for(cfg, m, e, optimized)
        done: dict[str, dict[str, Any]] = {v["id"]: {**v, "skipped": True} for v in variants if v["error"] or not v["path"]}
        todo = [v for v in variants if v["id"] not in done]
        tag = f"{m}-{e}-{cfg.provider}{'-tiny' if cfg.tiny else ''}"
        ref_file = cfg.work / "runs" / f"{tag}-reference.npz"
        ref_file.parent.mkdir(parents=True, exist_ok=True)
        ref_file.unlink(missing_ok=True)
        attempt = 0
        while todo:
            attempt += 1
            result_file = cfg.work / "runs" / f"{tag}-{attempt}.jsonl"
            result_file.unlink(missing_ok=True)
            job = {"provider": cfg.provider, "model_path": exp["path"], "variants": todo, "warmup": cfg.warmup,
                   "iters": cfg.iters, "dump": not cfg.no_dump, "kernels": cfg.kernels, "ref_file": str(ref_file),
                   "result_file": str(result_file), "tmp_dir": str(cfg.work / "tmp")}
            job_file = cfg.work / "runs" / f"{tag}-{attempt}.job.json"
            job_file.write_text(json.dumps(job))
            crashed = _watch_time_worker(cfg, job_file, result_file, cfg.work / "logs" / f"time-{tag}-{attempt}.log", done)
            todo = [v for v in todo if v["id"] not in done]
            if crashed is None and todo:  # the worker ended without a trace of these
                for v in todo:
                    done[v["id"]] = {**v, "error": "not timed: the timing worker stopped before it"}
                todo = []
        results[(m, e)] = [done[v["id"]] for v in variants]
        for r in results[(m, e)]:
            if r.get("median_ms") is not None:
                _say(f"time {m} {e} {r['id']}: {r['median_ms']:.3f} ms (max rel diff {r.get('max_rel_diff')})")
            elif not r.get("skipped"):
                _say(f"time {m} {e} {r['id']}: {r.get('error')}")
    return results


def _watch_time_worker(cfg: argparse.Namespace, job_file: Path, result_file: Path, log: Path,
                       done: dict[str, dict[str, Any]]) -> str | None:
    """Run one timing worker; fill `done` from its events. A variant that runs past
    --variant-timeout is killed; one the process died in is recorded as crashed.
    Returns the id of the variant it crashed or hung in (None: ended normally)."""
    job = json.loads(job_file.read_text())
    by_id = {v["id"]: v for v in job["variants"]}
    log.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log, "w")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--_time", str(job_file)], stdout=fh,
                            stderr=subprocess.STDOUT, env=_subprocess_env(), cwd=REPO, start_new_session=True)
    started: str | None = None
    started_at = time.monotonic()
    launched = time.monotonic()
    seen = 0
    hung = False

    def read_events() -> None:
        nonlocal started, started_at, seen
        if not result_file.exists():
            return
        lines = result_file.read_text().splitlines()
        for line in lines[seen:]:
            if not line.endswith("}"):
                break  # partially written
            seen += 1
            rec = json.loads(line)
            if rec["event"] == "start":
                started, started_at = rec["id"], time.monotonic()
            else:
                rec.pop("event")
                done[rec["id"]] = {**by_id[rec["id"]], **rec}
                started = None

    try:
        while proc.poll() is None:
            read_events()
            now = time.monotonic()
            if (started and now - started_at > cfg.variant_timeout) or (not started and now - launched > 600 and seen == 0):
                hung = True
                _kill(proc)
                break
            time.sleep(0.2)
        read_events()
    finally:
        fh.close()
    rc = proc.returncode
    if started is not None:
        why = (f"timed out while timing ({cfg.variant_timeout:.0f} s)" if hung
               else f"crashed while timing: exit {rc}: {_last_error_line(log)}")
        done[started] = {**by_id[started], "error": why, "log_tail": _log_tail(log)}
        return started
    if seen == 0 and rc != 0:  # died before the first variant: every variant fails the same way
        why = f"timing worker failed: exit {rc}: {_last_error_line(log)}"
        for v in job["variants"]:
            done[v["id"]] = {**v, "error": why, "log_tail": _log_tail(log)}
    return None


# =========================================================================== phase 4: summary


_ABBREV = {"Attention": "Attn", "MultiHeadAttention": "MHA", "SkipLayerNormalization": "SkipLN",
           "SkipSimplifiedLayerNormalization": "SkipRMS", "SimplifiedLayerNormalization": "RMSNorm",
           "EmbedLayerNormalization": "EmbLN", "LayerNormalization": "LN", "FusedMatMul": "FMatMul",
           "FusedConv": "FConv", "RotaryEmbedding": "RoPE", "GroupQueryAttention": "GQA",
           "FusedGemm": "FGemm", "BiasSoftmax": "BSoftmax"}


def _fused_text(ops: dict[str, int] | None, limit: int = 6) -> str:
    if not ops:
        return "-"
    items = []
    for k, v in sorted(ops.items(), key=lambda kv: -kv[1]):
        dom, _, op = k.rpartition(".")
        name = _ABBREV.get(op, op) + next((f"({t})" for t in ("nhwc", "nchwc") if dom.endswith(t)), "")
        items.append(f"{name}{v}")
    return " ".join(items[:limit]) + (" …" if len(items) > limit else "")


def summarize(cfg: argparse.Namespace, timed: dict[tuple[str, str], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Table rows (one per variant) and verdicts (one per model, exporter, precision)."""
    rows, verdicts = [], []
    for (m, e), variants in timed.items():
        for precision in cfg.precisions:
            vs = [v for v in variants if v["precision"] == precision]

            def ok(v: dict[str, Any]) -> bool:
                return v.get("median_ms") is not None

            def broken(v: dict[str, Any]) -> bool:
                return bool(v.get("output_error")) or (v.get("max_rel_diff") or 0) > BROKEN_REL

            anchors = [v for v in vs if v["name"] in ANCHOR_VARIANTS and ok(v) and not broken(v)]
            gopts = [v for v in vs if v["name"] in GRAPHOPT_VARIANTS and ok(v)]
            best_a = min(anchors, key=lambda v: v["median_ms"], default=None)
            best_g = min(gopts, key=lambda v: v["median_ms"], default=None)
            for v in vs:
                tol = TOLERANCE.get((cfg.provider, precision), 3e-2)
                flag = ""
                if v.get("output_error"):
                    flag = " ✗"
                elif (v.get("max_rel_diff") or 0) > tol:
                    flag = " ≠"
                ops = (v.get("session_ops") or {}).get("fused")
                rows.append({
                    "model": m, "exporter": e, "precision": precision, "variant": v["name"],
                    "role": "anchor" if v["name"] in ANCHOR_VARIANTS else "graphopt",
                    "median_ms": v.get("median_ms"), "p10_ms": v.get("p10_ms"), "p90_ms": v.get("p90_ms"),
                    "ratio_to_best_anchor": (round(v["median_ms"] / best_a["median_ms"], 3) if ok(v) and best_a else None),
                    "max_abs_diff": v.get("max_abs_diff"), "max_rel_diff": v.get("max_rel_diff"), "flag": flag.strip(),
                    "fused_ops": _fused_text(ops if ops is not None else (v.get("file_ops") or {}).get("fused")),
                    "fused_ops_source": "session" if ops is not None else "file",
                    "error": v.get("error"), "note": v.get("note"),
                })
            goal = GOAL.get((cfg.provider, precision), 1.0)
            ratio = round(best_g["median_ms"] / best_a["median_ms"], 3) if best_a and best_g else None
            failed = [v["name"] for v in vs if v["name"] in GRAPHOPT_VARIANTS and not ok(v)]
            verdicts.append({"model": m, "exporter": e, "precision": precision, "provider": cfg.provider,
                             "best_anchor": best_a and best_a["name"], "best_anchor_ms": best_a and best_a["median_ms"],
                             "best_graphopt": best_g and best_g["name"], "best_graphopt_ms": best_g and best_g["median_ms"],
                             "ratio": ratio, "goal": goal, "graphopt_failed": failed,
                             "pass": (ratio <= goal) if ratio is not None else (False if best_a and not gopts else None)})
    return rows, verdicts


def format_table(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> str:
    head = ["model", "exporter", "prec", "variant", "median ms (p10-p90)", "×best", "max|diff| (rel)", "fused ops"]
    lines = []
    for r in rows:
        if r["median_ms"] is not None:
            t = f"{r['median_ms']:.3f} ({r['p10_ms']:.3f}-{r['p90_ms']:.3f})"
            ratio = f"{r['ratio_to_best_anchor']:.2f}" if r["ratio_to_best_anchor"] is not None else "-"
            diff = ("-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e} ({r['max_rel_diff']:.1e})") + (
                f" {r['flag']}" if r["flag"] else "")
            fused = r["fused_ops"] + (" [file]" if r["fused_ops_source"] == "file" else "")
        else:
            t, ratio, diff, fused = "-", "", "", (r["error"] or "?")
        variant = r["variant"] + (" *" if r.get("note") else "")
        lines.append([r["model"], r["exporter"], r["precision"], variant, t, ratio, diff, fused])
    widths = [max(len(str(x[i])) for x in [head, *lines]) if i < 7 else 0 for i in range(8)]
    out = ["  ".join(str(c).ljust(widths[i]) if i < 7 else str(c) for i, c in enumerate(head))]
    out.append("-" * (sum(widths) + 2 * 7 + 10))
    for x in lines:
        out.append("  ".join(str(c).ljust(widths[i]) if i < 7 else str(c) for i, c in enumerate(x)))
    if any(r.get("note") for r in rows):
        out.append("* " + next(r["note"] for r in rows if r.get("note")))
    out.append("")
    out.append("graphopt (best variant) / best anchor, median latency:")
    for v in verdicts:
        verdict = {True: "PASS", False: "FAIL", None: "no data"}[v["pass"]]
        if v["ratio"] is None:
            why = "graphopt failed" if v["pass"] is False else "no anchor ran" if v["best_graphopt"] else "no data"
            out.append(f"  {v['model']:7s} {v['exporter']:12s} {v['precision']}: {why}" + (" FAIL" if v["pass"] is False else ""))
        else:
            out.append(f"  {v['model']:7s} {v['exporter']:12s} {v['precision']}: {v['ratio']:.3f} "
                       f"({v['best_graphopt']} {v['best_graphopt_ms']:.3f} ms vs {v['best_anchor']} "
                       f"{v['best_anchor_ms']:.3f} ms; goal <= {v['goal']}) {verdict}")
    return "\n".join(out)


def _tolerance_text(provider: str) -> str:
    return ", ".join(f"{p} {t:g}" for (prov, p), t in TOLERANCE.items() if prov == provider)


def print_saved_tables(paths: list[Path]) -> int:
    """--table: the tables of earlier runs' JSON files, one after another (e.g. one file per model)."""
    for p in paths:
        res = json.loads(p.read_text())
        c = res["config"]
        print(f"\n{p.name}: {c['provider'].upper()}, {res['environment'].get('gpu') or res['environment'].get('machine')}, "
              f"onnxruntime {res['environment'].get('onnxruntime')}, {res['timestamp']}")
        print(format_table(res["rows"], res["verdicts"]))
    return 0


def _environment(cfg: argparse.Namespace) -> dict[str, Any]:
    """Versions and the device, from a subprocess (the parent imports no onnxruntime-gpu/torch)."""
    code = ("import json, onnxruntime as o, onnx, onnxscript, onnx_ir, numpy\n"
            "v = {m.__name__: getattr(m, '__version__', '?') for m in (o, onnx, onnxscript, onnx_ir, numpy)}\n"
            "v['onnxruntime_file'] = o.__file__; v['providers'] = o.get_available_providers()\n"
            "try:\n import torch, transformers; v['torch'] = torch.__version__; v['transformers'] = transformers.__version__\n"
            "except Exception as e: v['torch'] = str(e)\n"
            "print(json.dumps(v))")
    env: dict[str, Any] = {"python": platform.python_version(), "machine": platform.node(), "cpu_count": os.cpu_count()}
    with contextlib.suppress(Exception):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_subprocess_env())
        env.update(json.loads(p.stdout.strip().splitlines()[-1]))
    with contextlib.suppress(Exception):
        env["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip()
    with contextlib.suppress(Exception):
        env["graphopt_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                                cwd=REPO, timeout=10).stdout.strip()
    env["graphopt_sources"] = _graphopt_fingerprint()
    return env


# =========================================================================== main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Variants: " + ", ".join(ALL_VARIANTS))
    ap.add_argument("--models", default="bert,gpt2,vit,resnet", help="comma list of bert, gpt2, vit, resnet (default all)")
    ap.add_argument("--exporters", default="dynamo,torchscript", help="comma list of dynamo, torchscript, dynamo-noopt")
    ap.add_argument("--precisions", help="comma list of fp32, fp16 (default: fp32,fp16 on cuda, fp32 on cpu)")
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS), help="comma list of variants to time (the fp32 "
                    "original is always timed: it is the reference)")
    ap.add_argument("--tiny", action="store_true", help="tiny models (tests/models.py *_tiny builders): a dry run")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results",
                    help="folder for the JSON result (default benchmarks/results)")
    ap.add_argument("--table", type=Path, nargs="+", metavar="JSON", help="only print the tables of earlier results")
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK, help=f"cache of exports and optimizer outputs (default {DEFAULT_WORK})")
    ap.add_argument("--fresh", action="store_true", help="redo every optimizer output (exports stay cached)")
    ap.add_argument("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                    help="parallel export/optimizer subprocesses (default: half the cores, at most 8)")
    ap.add_argument("--export-check", choices=("full", "export", "none"), default="export",
                    help="the builders' check of each export against torch (onnxruntime CPU): both sizes, "
                         "the export size only (default), or none")
    ap.add_argument("--warmup", type=int, help="warm-up runs per variant (default 10 cuda, 3 cpu)")
    ap.add_argument("--iters", type=int, help="timed runs per variant (default 100 cuda, 20 cpu)")
    ap.add_argument("--no-dump", action="store_true", help="do not dump the sessions' optimized graphs (fused-op counts)")
    ap.add_argument("--kernels", action="store_true", help="also record each CUDA variant's GPU kernels (torch.profiler/CUPTI): "
                    "count, summed time and the top kernels per run, in the JSON")
    ap.add_argument("--export-timeout", type=float, default=900)
    ap.add_argument("--optimize-timeout", type=float, default=600)
    ap.add_argument("--variant-timeout", type=float, default=300, help="seconds for one variant's session + timing")
    # internal: worker subprocesses
    ap.add_argument("--_export", nargs=2, metavar=("MODEL", "EXPORTER"), help=argparse.SUPPRESS)
    ap.add_argument("--_optimize", metavar="JOB", help=argparse.SUPPRESS)
    ap.add_argument("--_time", metavar="JOB", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.models = [ALIASES.get(m, m) for m in a.models.split(",") if m]
    for m in a.models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (known: {', '.join(MODELS)})")
    a.exporters = [e for e in a.exporters.split(",") if e]
    a.precisions = a.precisions.split(",") if a.precisions else (["fp32", "fp16"] if a.provider == "cuda" else ["fp32"])
    a.variants = [v for v in a.variants.split(",") if v]
    for v in a.variants:
        if v not in ALL_VARIANTS:
            ap.error(f"unknown variant {v!r} (known: {', '.join(ALL_VARIANTS)})")
    a.warmup = a.warmup if a.warmup is not None else (10 if a.provider == "cuda" else 3)
    a.iters = a.iters if a.iters is not None else (100 if a.provider == "cuda" else 20)
    a.work = a.work.resolve()
    return a


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg._export:
        return export_worker(cfg._export[0], cfg._export[1], cfg.tiny, cfg.export_check)
    if cfg._optimize:
        return optimize_worker(cfg._optimize)
    if cfg._time:
        return time_worker(cfg._time)
    if cfg.table:
        return print_saved_tables(cfg.table)

    started = time.perf_counter()
    cfg.work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    try:
        cfg.graphopt_layout = _graphopt_has("layout")
        graphopt_precision = _graphopt_has("precision")
    except Exception as e:  # noqa: BLE001 - graphopt broken: the anchors still run
        _say(f"graphopt not importable: {_first_line(e)}")
        cfg.graphopt_layout = graphopt_precision = False
    _say(f"models {cfg.models}, exporters {cfg.exporters}, precisions {cfg.precisions}, provider {cfg.provider}, "
         f"work {cfg.work}; graphopt options: precision={graphopt_precision}, layout={cfg.graphopt_layout}")
    phases: dict[str, float] = {}
    side = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    environment = side.submit(_environment, cfg)  # versions and GPU, in a subprocess, meanwhile

    t0 = time.perf_counter()
    exports = phase_export(cfg)
    phases["export_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    optimized = phase_optimize(cfg, exports)
    phases["optimize_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    timed = phase_time(cfg, exports, optimized)
    phases["time_s"] = round(time.perf_counter() - t0, 1)
    rows, verdicts = summarize(cfg, timed)
    phases["total_s"] = round(time.perf_counter() - started, 1)

    result = {
        "schema": "graphopt.gpu_fusions/1",
        "timestamp": _dt.datetime.now().isoformat(timespec="seconds"),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items() if not k.startswith("_")},
        "graphopt_has_precision_option": graphopt_precision,
        "environment": environment.result(),
        "phases": phases,
        "exports": {f"{m}/{e}": v for (m, e), v in exports.items()},
        "optimizers": {"/".join(k): v for k, v in optimized.items()},
        "variants": {f"{m}/{e}": v for (m, e), v in timed.items()},
        "rows": rows,
        "verdicts": verdicts,
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    name = f"gpu_fusions-{'_'.join(cfg.models)}{'-cpu' if cfg.provider == 'cpu' else ''}{'-tiny' if cfg.tiny else ''}.json"
    out_path = cfg.out / name
    out_path.write_text(json.dumps(result, indent=1, default=str))
    _say(f"wrote {out_path}; phases {phases}")
    failed = {f"{m}/{e}": v["error"] for (m, e), v in exports.items() if v.get("error")}
    table = format_table(rows, verdicts)
    if failed:
        table += "\nexports that failed:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items())
    print(f"\n{cfg.provider.upper()} latency, ORT_ENABLE_ALL{', io-binding on cuda' if cfg.provider == 'cuda' else ''}, "
          f"{cfg.warmup} warm-up + {cfg.iters} timed runs; ×best = median / best anchor's; "
          f"diff vs the fp32 original (≠ beyond {_tolerance_text(cfg.provider)}, ✗ wrong shape/NaN)\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
