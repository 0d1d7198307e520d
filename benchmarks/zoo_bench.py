"""Time every zoo model in onnxruntime: the original, graphopt, and the anchors.

    python benchmarks/zoo_bench.py                         # every model in benchmarks/.zoo, CUDA if present
    python benchmarks/zoo_bench.py --device cpu --models bert-dynamo,resnet-dynamo --runs 20
    python benchmarks/zoo_bench.py --jobs 8 --models a,b,c --out part1.json   # variants made 8 models at once, then timed
    python benchmarks/zoo_bench.py --shard 1/2 --jobs 8 --out part1.json       # the first half of the zoo
    python benchmarks/zoo_bench.py --report part1.json part2.json             # one table from several runs
    python benchmarks/zoo_bench.py --help

Per model, in one subprocess (a crash or a hang costs one model, not the run), the
variants are made from the cached ``model.onnx`` and timed in one onnxruntime session
each, on the CUDA provider with io-binding when present (``--device cuda``) or on the CPU
provider (``--device cpu``), graph optimizations at ``ORT_ENABLE_ALL`` as a user runs them:

* ``original``            the model as exported
* ``graphopt``            ``graphopt.optimize_file(target=ort-cuda | ort-cpu)`` (and ``--precision fp16``)
* ``ort-offline-all``     onnxruntime's own offline optimizer (``optimized_model_filepath``) at ENABLE_ALL,
  ``ort-offline-extended`` the same at ENABLE_EXTENDED
* ``onnxscript``          ``onnxscript.optimizer.optimize`` + ``onnxscript.rewriter.ort_fusions.optimize_for_ort``
* ``onnxsim``             ``onnxsim.simplify`` (when installed)
* ``ort-transformers``    ``onnxruntime.transformers.optimizer.optimize_model`` for the families it knows
* ``original-again``      with ``--control``: the original in a second session, timed like the others (never an
  anchor): the ratio of two sessions of one model is this measurement's own spread on this machine

In fp16 the anchors are converted with onnxruntime's ``float16.convert_float_to_float16``
(``keep_io_types=True``), as their documentation does; graphopt with ``--precision fp16``.

Measurement: after a warm-up, ``--rounds`` rounds each run every variant ``--runs`` times
(more for fast models: a block lasts at least 20 ms),
the variants interleaved in a new order every round, so drift hits all of them alike; the figure is the median of
all runs. Variants that are the same graph (same nodes, attributes and weights under other value
names: graphopt changed nothing an anchor did not, or kept a model in fp32 when asked for fp16) are timed once and
share their figures; their ratio is marked ``=`` (1 by construction: a difference there is the machine's, not the
optimizers'). So are variants whose files differ but that onnxruntime's session optimizer turns into one executed
graph (``optimized_model_filepath`` of a session like the timing ones; ``same_executed_graph`` in the JSON;
``--file-graphs-only`` turns this off): on the 2026-11-28 H100 run such pairs launched the same kernels for the same
GPU time and still came out up to 13 % apart in wall time. Where graphopt is within the 3 % noise band of the
original or of the best anchor, or slower than either, those variants are measured again (``--remeasure`` times at
most), each time in new sessions (a session's lasting bias is not measured twice), and the figure says whether it
stayed within the band. Every output is compared with the fp32 original's
(max error relative to the output's largest magnitude; on CUDA both come from sessions with TF32 off, whose
rounding alone moves a float32 output by about the fp32 tolerance); a non-finite output where the
original is finite is flagged.

On the CPU provider every session of a model lives in one process with its own intra-op thread
pool; ``--pin`` pins the process's thread to one core and every session's worker threads to the
same next ``--threads - 1`` cores, so no session runs on luckier cores than another (on the
H100 host's 16-core Xeon, variants that onnxruntime runs as the very same graph came out up to
20 % apart without it: benchmarks/RESULTS.md, 2026-11-27 evening).

Needs onnx, onnxruntime (onnxruntime-gpu for CUDA), numpy and graphopt; onnxscript and
onnxsim are optional anchors. Output: JSON (``--out``) and a table printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zoo import CACHE_DIR, ZooEntry, cached_models, load_inputs  # noqa: E402

NOISE_BAND = 0.03
#: The shortest block of timed runs of one variant (see bench_one).
MIN_BLOCK_S = 0.02
#: tolerance of the output check (max error relative to the output's largest magnitude)
TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2}
#: the ORT transformers optimizer's model type per zoo family (by name prefix); others get none
ORT_TRANSFORMERS_TYPES = {
    "bert": "bert", "roberta": "bert", "distilbert": "bert", "electra": "bert", "deberta": "bert", "wav2vec2": "bert",
    "whisper": "bert", "gpt2": "gpt2", "opt": "gpt2", "t5": "t5", "bart": "bart", "clip": "clip", "vit": "vit", "deit": "vit",
    "dinov2": "vit", "beit": "vit", "swin": "swin", "unet": "unet", "phi3": "phi", "tf-transformer": "bert_keras",
}


# ----------------------------------------------------------------------------- variants

def _ort():
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    return ort


def _providers(device: str, exact_fp32: bool = False) -> list[Any]:
    """exact_fp32: CUDA's MatMul/Gemm/Conv in true float32 (the provider's default is TF32, whose rounding alone
    moves a float32 output by ~1e-3, the check's tolerance): the output check's sessions, as graphopt --verify does."""
    if device != "cuda":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"use_tf32": "0"}) if exact_fp32 else "CUDAExecutionProvider", "CPUExecutionProvider"]


def _to_fp16(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))


def _graphopt(src: Path, dst: Path, target: str, precision: str) -> None:
    import graphopt

    graphopt.optimize_file(src, dst, target=target, precision=None if precision == "fp32" else precision)


def _ort_offline(src: Path, dst: Path, device: str, level: str) -> None:
    ort = _ort()
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, f"ORT_ENABLE_{level.upper()}")
    options.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), options, providers=_providers(device))


def _onnxscript(src: Path, dst: Path) -> None:
    import onnx_ir as ir
    import onnxscript.optimizer
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = ir.load(str(src))
    onnxscript.optimizer.optimize(model)
    model, _ = optimize_for_ort(model)
    ir.save(model, str(dst))


def _onnxsim(src: Path, dst: Path) -> None:
    import onnx
    import onnxsim

    simplified, ok = onnxsim.simplify(onnx.load(str(src)))
    if not ok:
        raise RuntimeError("onnxsim's own check failed")
    onnx.save(simplified, str(dst))


def _ort_transformers(src: Path, dst: Path, model_type: str, device: str, fp16: bool) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    model = optimize_model(str(src), model_type=model_type, num_heads=0, hidden_size=0, opt_level=0, use_gpu=device == "cuda")
    if fp16:
        model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(dst))


def _ort_transformers_type(name: str) -> str | None:
    for prefix, model_type in sorted(ORT_TRANSFORMERS_TYPES.items(), key=lambda kv: -len(kv[0])):
        if name.startswith(prefix):
            return model_type
    return None


def make_variants(entry: ZooEntry, work: Path, device: str, precisions: list[str]) -> dict[str, dict[str, Any]]:
    """name -> {path, precision, role ('original' | 'graphopt' | 'anchor'), prep_seconds} or {error}."""
    original = entry.path
    target = "ort-cuda" if device == "cuda" else "ort-cpu"
    plans: list[tuple[str, str, str, Any]] = [("original", "fp32", "original", None)]
    model_type = _ort_transformers_type(entry.name)
    for precision in precisions:
        sfx = "" if precision == "fp32" else "-fp16"
        fp16 = precision == "fp16"
        plans.append((f"graphopt{sfx}", precision, "graphopt", lambda d, p=precision: _graphopt(original, d, target, p)))
        if fp16:
            plans.append(("original-fp16", precision, "anchor", lambda d: _to_fp16(original, d)))
        for level in ("all", "extended"):
            def offline(d: Path, level: str = level, fp16: bool = fp16) -> None:
                src = original
                if fp16:
                    src = d.with_suffix(".in.onnx")
                    _to_fp16(original, src)
                _ort_offline(src, d, device, level)
            plans.append((f"ort-offline-{level}{sfx}", precision, "anchor", offline))

        def onnxscript(d: Path, fp16: bool = fp16) -> None:
            _onnxscript(original, d)
            if fp16:
                _to_fp16(d, d)
        plans.append((f"onnxscript{sfx}", precision, "anchor", onnxscript))

        def simplified(d: Path, fp16: bool = fp16) -> None:
            _onnxsim(original, d)
            if fp16:
                _to_fp16(d, d)
        plans.append((f"onnxsim{sfx}", precision, "anchor", simplified))
        if model_type:
            plans.append((f"ort-transformers{sfx}", precision, "anchor",
                          lambda d, t=model_type, f=fp16: _ort_transformers(original, d, t, device, f)))
    variants: dict[str, dict[str, Any]] = {}
    for name, precision, role, make in plans:
        info: dict[str, Any] = {"precision": precision, "role": role}
        if make is None:
            info["path"] = str(original)
        else:
            dst = work / f"{name}.onnx"
            t0 = time.perf_counter()
            try:
                make(dst)
                info["path"] = str(dst)
            except ImportError as e:
                info["error"] = f"not installed: {e.name or e}"
            except Exception as e:  # noqa: BLE001 - an anchor that fails on a model is recorded, the run goes on
                info["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            info["prep_seconds"] = round(time.perf_counter() - t0, 2)
        variants[name] = info
    return variants


# ----------------------------------------------------------------------------- timing

class Runner:
    """One session of one variant; io-binding on CUDA (inputs placed on the device once)."""

    def __init__(self, path: str, feeds: dict[str, np.ndarray], device: str, threads: int, affinities: str | None = None,
                 exact_fp32: bool = False) -> None:
        ort = _ort()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        if affinities:
            options.add_session_config_entry("session.intra_op_thread_affinities", affinities)
        self.session = ort.InferenceSession(path, options, providers=_providers(device, exact_fp32))
        self.device = device
        names = [i.name for i in self.session.get_inputs()]
        self.feeds = {n: feeds[n] for n in names}
        self.providers = self.session.get_providers()
        if device == "cuda":
            self.binding = self.session.io_binding()
            for name, array in self.feeds.items():
                self.binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
            self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self) -> list[np.ndarray]:
        if self.device == "cuda":
            for name in self.output_names:
                self.binding.bind_output(name, "cuda")
            self.session.run_with_iobinding(self.binding)
            return self.binding.copy_outputs_to_cpu()
        return self.session.run(None, self.feeds)

    def time_runs(self, n: int) -> list[float]:
        times = []
        for _ in range(n):
            if self.device == "cuda":
                for name in self.output_names:   # outputs stay on the device; bound outside the timed region
                    self.binding.bind_output(name, "cuda")
                t0 = time.perf_counter()
                self.session.run_with_iobinding(self.binding)   # synchronizes the provider's stream at the end
            else:
                t0 = time.perf_counter()
                self.session.run(None, self.feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        return times


def pin_threads(threads: int) -> str | None:
    """Pin the calling thread to the first CPU this process may use; returns the affinities of
    a session's `threads - 1` worker threads on the next ones, in onnxruntime's format
    (processor ids from 1, one per thread; "" for one thread). None: fewer CPUs than threads,
    nothing pinned."""
    cpus = sorted(os.sched_getaffinity(0))
    if threads < 1 or len(cpus) < threads:
        return None
    os.sched_setaffinity(0, {cpus[0]})
    return ";".join(str(cpu + 1) for cpu in cpus[1:threads])


def pin_launching_thread() -> bool:
    """CUDA: keep the thread that launches the kernels on one core (the last this process may use, away from the
    first cores' interrupts): a launch-bound model's wall time moves with the host thread's migrations."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return False
    os.sched_setaffinity(0, {cpus[-1]})
    return True


def _check_outputs(expected: list[np.ndarray], actual: list[np.ndarray], precision: str) -> dict[str, Any]:
    worst, nonfinite = 0.0, False
    for e, a in zip(expected, actual):
        a = np.asarray(a)
        if e.shape != a.shape:
            return {"ok": False, "reason": f"output shape {a.shape} != {e.shape}"}
        if not np.issubdtype(e.dtype, np.floating):
            worst = max(worst, float(np.any(a != e)))
            continue
        finite = np.isfinite(e)
        if np.any(finite & ~np.isfinite(a)):
            nonfinite = True
        if finite.any():
            scale = max(float(np.abs(e[finite]).max()), 1e-6)
            diff = np.abs(a.astype(np.float64) - e)[finite & np.isfinite(a)]
            worst = max(worst, float(diff.max()) / scale if diff.size else 0.0)
    return {"ok": (not nonfinite) and worst <= TOLERANCE[precision], "max_rel_error": worst, "nonfinite": nonfinite}


def _ratios(result: dict[str, Any], precision: str) -> dict[str, Any]:
    variants = result["variants"]
    sfx = "" if precision == "fp32" else "-fp16"
    g = variants.get(f"graphopt{sfx}", {}).get("median_ms")
    orig = variants.get("original", {}).get("median_ms")
    anchors = {k: v["median_ms"] for k, v in variants.items()
               if v["role"] == "anchor" and v["precision"] == precision and v.get("median_ms") and v.get("check", {}).get("ok")}
    out: dict[str, Any] = {"graphopt_ms": g, "original_ms": orig}
    if g and orig:
        out["vs_original"] = g / orig
    again = variants.get("original-again", {}).get("median_ms")
    if again and orig and precision == "fp32":
        out["control_vs_original"] = again / orig
    if anchors:
        best = min(anchors, key=anchors.__getitem__)
        out["best_anchor"], out["best_anchor_ms"] = best, anchors[best]
        if g:
            out["vs_best_anchor"] = g / anchors[best]
    # a ratio between two variants that are one graph (timed once): 1 by construction, not a measurement
    graph_of = {name: info.get("same_graph_as", name) for name, info in variants.items()}
    mine = graph_of.get(f"graphopt{sfx}")
    out["same_graph"] = [key for key, other in (("vs_original", "original"), ("vs_best_anchor", out.get("best_anchor")))
                         if mine is not None and other is not None and graph_of.get(other) == mine]
    return out


def graph_fingerprint(path: str, weight_values: bool = True) -> str:
    """A hash of a model's graph with its value names numbered in order of appearance: two files with the same
    nodes in the same order, attributes and initializer bytes get the same fingerprint whatever their names
    (``weight_values=False``: initializers by dtype and shape only, as a kernel sees them)."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    graph = model.graph
    digest = hashlib.sha256()
    numbered: dict[str, str] = {}
    initializers = {t.name: t for t in graph.initializer}

    def ref(name: str) -> str:
        if not name:
            return ""
        if name in initializers:
            array = numpy_helper.to_array(initializers.pop(name))
            content = hashlib.sha256(array.tobytes()).hexdigest() if weight_values else ""
            numbered[name] = f"c{array.dtype}{array.shape}:{content}"
        return numbered.setdefault(name, f"v{len(numbered)}")

    for opset in sorted((o.domain, o.version) for o in model.opset_import):
        digest.update(repr(opset).encode())
    for value in graph.input:
        digest.update(f"in {ref(value.name)} {value.type.SerializeToString().hex()}".encode())
    for node in graph.node:
        attributes = sorted(a.SerializeToString().hex() for a in node.attribute)
        digest.update(repr((node.domain, node.op_type, [ref(i) for i in node.input], [ref(o) for o in node.output],
                            attributes)).encode())
    for value in graph.output:
        digest.update(f"out {ref(value.name)}".encode())
    return digest.hexdigest()


def executed_graph_fingerprint(path: str, device: str, threads: int = 1) -> str | None:
    """The fingerprint of the graph onnxruntime runs for a model file: its session optimizer's result at ENABLE_ALL on
    `device` (``optimized_model_filepath``), what the timing sessions execute: the same kernels in the same order on
    the same wiring, weights by dtype and shape (folded constants differ in their last bits between optimizers).
    Two files that end as one executed graph cannot differ in speed by anything either optimizer did. None where
    the session cannot write its graph."""
    ort = _ort()
    with tempfile.TemporaryDirectory(prefix="zoo-ran-") as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = max(threads, 1)
        options.optimized_model_filepath = str(Path(tmp) / "ran.onnx")
        try:
            ort.InferenceSession(path, options, providers=_providers(device))
            return graph_fingerprint(options.optimized_model_filepath, weight_values=False)
        except Exception:  # noqa: BLE001 - a graph onnxruntime cannot serialize is compared by its file only
            return None


def _same_graphs(variants: dict[str, dict[str, Any]], executed: dict[str, str | None] | None = None) -> dict[str, str]:
    """{variant: the earlier variant whose graph it is}: the same file graph, or (``executed``: variant -> fingerprint
    of the graph onnxruntime runs) the same executed graph. The control is never merged: it times the original twice."""
    seen: dict[str, str] = {}
    same_as: dict[str, str] = {}
    for name, info in variants.items():
        if info.get("role") == "control" or "path" not in info:
            continue
        try:
            keys = [graph_fingerprint(info["path"])]
        except Exception:  # noqa: BLE001 - a model that cannot be read again is timed on its own
            continue
        if executed and executed.get(name):
            keys.append(f"ran:{executed[name]}")
        earlier = next((seen[key] for key in keys if key in seen), None)
        if earlier is not None:
            same_as[name] = earlier
        for key in keys:
            seen.setdefault(key, earlier or name)
    return same_as


def prepare(entry: ZooEntry, work: Path, device: str, precisions: list[str]) -> dict[str, dict[str, Any]]:
    """Make the variants into work/<model>/ and record them in its variants.json (reused by the timing)."""
    folder = work / entry.name
    folder.mkdir(parents=True, exist_ok=True)
    variants = make_variants(entry, folder, device, precisions)
    (folder / "variants.json").write_text(json.dumps({"device": device, "precisions": precisions, "variants": variants}, indent=1))
    return variants


def _prepared(entry: ZooEntry, work: Path | None, device: str, precisions: list[str]) -> dict[str, dict[str, Any]] | None:
    if work is None or not (work / entry.name / "variants.json").exists():
        return None
    saved = json.loads((work / entry.name / "variants.json").read_text())
    if saved["device"] != device or saved["precisions"] != precisions:
        return None
    return saved["variants"]


def bench_one(entry: ZooEntry, device: str, precisions: list[str], runs: int, rounds: int, warmup: int,
              remeasure: int, threads: int, work: Path | None = None, control: bool = False, pin: bool = False,
              same_executed: bool = True) -> dict[str, Any]:
    feeds = load_inputs(entry)
    result: dict[str, Any] = {"model": entry.name, "exporter": entry.meta.get("exporter"), "opset": entry.meta.get("opset"),
                              "nodes": entry.meta.get("nodes"), "device": device}
    affinities = pin_threads(threads) if pin and device == "cpu" else None
    if pin and device == "cpu":
        result["pinned"] = affinities is not None
    if pin and device == "cuda":
        result["pinned"] = pin_launching_thread()
    with tempfile.TemporaryDirectory(prefix=f"zoo-{entry.name}-") as tmp:
        variants = _prepared(entry, work, device, precisions) or make_variants(entry, Path(tmp), device, precisions)
        if control:
            variants = {**variants, "original-again": {"precision": "fp32", "role": "control", "path": str(entry.path)}}
        import onnx

        runners: dict[str, Runner] = {}
        for name, info in variants.items():
            if "error" in info:
                continue
            try:
                info["nodes"] = len(onnx.load(info["path"], load_external_data=False).graph.node)
                runners[name] = Runner(info["path"], feeds, device, threads, affinities)
                info["providers"] = runners[name].providers
            except Exception as e:  # noqa: BLE001
                info["error"] = f"session: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        if "original" not in runners:
            result["error"] = variants["original"].get("error", "the original model does not load")
            result["variants"] = variants
            return result
        # Outputs are checked in sessions without TF32 (on CUDA), the timing sessions keep the provider's default.
        def checked_outputs(name: str) -> list[np.ndarray]:
            if device != "cuda":
                return runners[name].run()
            return Runner(variants[name]["path"], feeds, device, threads, affinities, exact_fp32=True).run()

        expected = checked_outputs("original")
        for name, runner in list(runners.items()):
            try:
                variants[name]["check"] = _check_outputs(expected, checked_outputs(name), variants[name]["precision"])
                for _ in range(warmup):
                    runner.run()
            except Exception as e:  # noqa: BLE001
                variants[name]["error"] = f"run: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
                del runners[name]
        # Variants that are the very same graph (graphopt changed nothing an anchor did not, or kept fp32 for fp16)
        # are timed once: two sessions of one graph differ only by this machine's noise, not by anything
        # either optimizer did; they share one runner's samples.
        # The same holds for files that onnxruntime's session optimizer turns into one executed graph.
        executed = {name: executed_graph_fingerprint(variants[name]["path"], device, threads) for name in runners} if same_executed else None
        file_same = _same_graphs({name: variants[name] for name in runners})
        same_as = _same_graphs({name: variants[name] for name in runners}, executed)
        for alias, canonical in same_as.items():
            variants[alias]["same_graph_as"] = canonical
            if alias not in file_same:
                variants[alias]["same_executed_graph"] = True   # different files, one graph run by onnxruntime
            del runners[alias]
        samples: dict[str, list[float]] = {name: [] for name in runners}
        # A block of runs lasts at least MIN_BLOCK_S: 10 runs of a 0.3 ms model are 3 ms, too short
        # to average out the machine's drift (launch-bound models moved 10-25 % between runs).
        estimate = float(np.median(runners["original"].time_runs(5))) / 1000.0
        runs = max(runs, int(MIN_BLOCK_S / max(estimate, 1e-6)))
        result["runs_per_block"] = runs
        order = np.random.default_rng(0)  # each round runs the variants in another order: no variant always follows the same one
        for _ in range(rounds):
            for name in order.permutation(list(runners)):
                samples[str(name)] += runners[str(name)].time_runs(runs)

        def summarize() -> None:
            for name, times in samples.items():
                variants[name].update(median_ms=float(np.median(times)), p10_ms=float(np.percentile(times, 10)),
                                      p90_ms=float(np.percentile(times, 90)), samples=len(times))
            for alias, canonical in same_as.items():
                variants[alias].update({k: variants[canonical][k] for k in ("median_ms", "p10_ms", "p90_ms", "samples")})

        summarize()
        result["variants"] = variants
        # The noise band: a ratio within 3 % of 1 is not a result yet; measure those variants again.
        for precision in precisions:
            sfx = "" if precision == "fp32" else "-fp16"
            attempts = 0
            while attempts < remeasure:
                r = _ratios(result, precision)
                # a loss is never taken from one measurement either: re-measure it like a tie
                close = [k for k in ("vs_original", "vs_best_anchor")
                         if k in r and r[k] > 1.0 - NOISE_BAND and k not in r["same_graph"]]
                if not close:
                    break
                attempts += 1
                names = {same_as.get(n, n) for n in (f"graphopt{sfx}", "original", r.get("best_anchor"), "original-again") if n} & set(runners)
                # in new sessions: a session's own lasting bias (thread placement, memory) is not measured again
                for name in names:
                    runners[name] = Runner(variants[name]["path"], feeds, device, threads, affinities)
                    for _ in range(warmup):
                        runners[name].run()
                result.setdefault("sessions", {}).update({name: result.get("sessions", {}).get(name, 1) + 1 for name in names})
                for _ in range(rounds):
                    for name in order.permutation(sorted(names)):
                        samples[str(name)] += runners[str(name)].time_runs(runs)
                summarize()
            r = _ratios(result, precision)
            r["remeasured"] = attempts
            r["within_noise"] = [k for k in ("vs_original", "vs_best_anchor") if k in r and abs(r[k] - 1.0) < NOISE_BAND]
            result.setdefault("ratios", {})[precision] = r
        for info in variants.values():
            info.pop("path", None)
    return result


# ----------------------------------------------------------------------------- driver

def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def print_table(results: list[dict[str, Any]], precisions: list[str]) -> None:
    for precision in precisions:
        print(f"\n{precision}: median ms; graphopt / original and graphopt / best anchor (~ within the 3 % noise band after re-measuring; "
              "= the same graph, timed once; ! output check failed; NaN: non-finite output)")
        print(f"{'model':32s} {'original':>9s} {'graphopt':>9s} {'g/orig':>7s} {'best anchor':>24s} {'g/best':>7s}")
        vs_orig, vs_best = [], []
        for r in results:
            ratios = r.get("ratios", {}).get(precision)
            if not ratios:
                print(f"{r['model']:32s} ERROR {r.get('error', '')[:80]}")
                continue
            sfx = "" if precision == "fp32" else "-fp16"
            g = r["variants"].get(f"graphopt{sfx}", {})
            flag = ""
            if g.get("error"):
                flag = f" graphopt: {g['error'][:60]}"
            elif g.get("check", {}).get("nonfinite"):
                flag = " NaN"
            elif not g.get("check", {}).get("ok", True):
                flag = " !"

            def fmt(key: str, ratios: dict[str, Any] = ratios) -> str:
                if key not in ratios:
                    return "-"
                if key in ratios.get("same_graph", []):
                    return f"{ratios[key]:.3f}="
                return f"{ratios[key]:.3f}" + ("~" if key in ratios.get("within_noise", []) else "")

            if "vs_original" in ratios:
                vs_orig.append(ratios["vs_original"])
            if "vs_best_anchor" in ratios:
                vs_best.append((ratios["vs_best_anchor"], r["model"]))
            best = f"{ratios.get('best_anchor', '-')} {ratios.get('best_anchor_ms', 0):.3f}"
            control = f"  control {ratios['control_vs_original']:.3f}" if "control_vs_original" in ratios else ""
            print(f"{r['model']:32s} {ratios.get('original_ms') or 0:9.3f} {ratios.get('graphopt_ms') or 0:9.3f} {fmt('vs_original'):>7s} "
                  f"{best:>24s} {fmt('vs_best_anchor'):>7s}{flag}{control}")
        gm_orig, gm_best = _geomean(vs_orig), _geomean([v for v, _ in vs_best])
        if vs_best:
            worst = max(vs_best)
            print(f"geomean graphopt/original {gm_orig:.3f}, graphopt/best anchor {gm_best:.3f} over {len(vs_best)} models; "
                  f"worst: {worst[1]} {worst[0]:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help=f"the built zoo (default {CACHE_DIR})")
    parser.add_argument("--models", default="", help="comma-separated zoo model names (default: all in the cache)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--precisions", default="", help="fp32,fp16 (default: fp32,fp16 on CUDA, fp32 on CPU)")
    parser.add_argument("--runs", type=int, default=20, help="runs per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--remeasure", type=int, default=2, help="re-measurements at most where graphopt is within the noise band")
    parser.add_argument("--threads", type=int, default=0, help="CPU provider intra-op threads (0: onnxruntime's default)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per model")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default benchmarks/results/zoo_bench-DATE-DEVICE.json)")
    parser.add_argument("--shard", default="", help="I/N: only the I-th of N equal parts of the models (runs that fit a time limit)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="make the variants of this many models at once first (CPU work; the timing stays one model at a time)")
    parser.add_argument("--work", type=Path, default=None, help="where --jobs puts the variants (default: a temporary folder)")
    parser.add_argument("--control", action="store_true",
                        help="also time the original in a second session (original-again): the measurement's own spread")
    parser.add_argument("--pin", action="store_true",
                        help="CPU: pin every session's threads to the same cores (the process's first --threads CPUs); "
                             "CUDA: keep the launching thread on one core")
    parser.add_argument("--file-graphs-only", action="store_true",
                        help="merge only variants whose files are one graph, not those onnxruntime turns into one executed graph")
    parser.add_argument("--report", type=Path, nargs="+", default=None, help="print the table of earlier JSON results (several merge) and exit")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)       # internal: bench one model, JSON on stdout
    parser.add_argument("--prepare", default=None, help=argparse.SUPPRESS)   # internal: make one model's variants into --work
    args = parser.parse_args(argv)
    if args.report:
        docs = [json.loads(p.read_text()) for p in args.report]
        results = [r for d in docs for r in d["results"]]
        precisions_seen = list(dict.fromkeys(p for d in docs for p in d["precisions"]))
        for d, path in zip(docs, args.report):
            print(f"{path}: {d['date']} {d['device']} {d.get('gpu') or d.get('cpu')} onnxruntime {d['onnxruntime']}; {d['command']}")
        print_table(results, precisions_seen)
        return 0

    if args.device == "auto":
        args.device = "cuda" if "CUDAExecutionProvider" in _ort().get_available_providers() else "cpu"
    precisions = [p for p in (args.precisions or ("fp32,fp16" if args.device == "cuda" else "fp32")).split(",") if p]
    if args.prepare:
        prepare(cached_models(args.cache, [args.prepare])[0], args.work, args.device, precisions)
        return 0
    if args.one:
        entry = cached_models(args.cache, [args.one])[0]
        result = bench_one(entry, args.device, precisions, args.runs, args.rounds, args.warmup, args.remeasure, args.threads, args.work,
                           control=args.control, pin=args.pin, same_executed=not args.file_graphs_only)
        print("@@RESULT@@" + json.dumps(result, default=float))
        return 0

    entries = cached_models(args.cache, [m for m in args.models.split(",") if m] or None)
    if args.shard:
        index, count = (int(v) for v in args.shard.split("/"))
        size = -(-len(entries) // count)
        entries = entries[(index - 1) * size:index * size]
    if not entries:
        print(f"error: no zoo models in {args.cache} (build them with `python -m benchmarks.zoo`)", file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or HERE / "results" / f"zoo_bench-{stamp:%Y-%m-%d}-{args.device}.json"
    ort = _ort()
    doc: dict[str, Any] = {
        "date": stamp.isoformat(timespec="seconds"), "device": args.device, "precisions": precisions,
        "command": " ".join([Path(sys.executable).name] + sys.argv), "machine": platform.node(), "cpu": platform.processor(),
        "onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
        "settings": {k: getattr(args, k) for k in ("runs", "rounds", "warmup", "remeasure", "threads", "control", "pin", "file_graphs_only")},
        "results": [],
    }
    try:
        import graphopt

        doc["graphopt"] = graphopt.__version__
    except ImportError:
        pass
    if args.device == "cuda":
        with_smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True)
        doc["gpu"] = with_smi.stdout.strip()
    common = ["--cache", str(args.cache), "--device", args.device, "--precisions", ",".join(precisions)]
    work_tmp = None
    if args.jobs > 1:
        if args.work is None:
            work_tmp = tempfile.TemporaryDirectory(prefix="zoo-bench-")
            args.work = Path(work_tmp.name)
        t0 = time.perf_counter()

        def prepare_in_subprocess(name: str) -> None:
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--prepare", name, "--work", str(args.work)] + common,
                           capture_output=True, text=True, timeout=args.timeout)

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(prepare_in_subprocess, [e.name for e in entries]))
        print(f"[zoo_bench] variants of {len(entries)} models made in {time.perf_counter() - t0:.0f}s ({args.jobs} at once)", flush=True)
    for entry in entries:
        t0 = time.perf_counter()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", entry.name] + common + [
               "--runs", str(args.runs), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
               "--remeasure", str(args.remeasure), "--threads", str(args.threads)] + (["--work", str(args.work)] if args.work else []) + (
               ["--control"] if args.control else []) + (["--pin"] if args.pin else []) + (
               ["--file-graphs-only"] if args.file_graphs_only else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            marker = [line for line in proc.stdout.splitlines() if line.startswith("@@RESULT@@")]
            if marker:
                result = json.loads(marker[-1][len("@@RESULT@@"):])
            else:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                result = {"model": entry.name, "error": f"exit {proc.returncode}: {' | '.join(tail)[:400]}"}
        except subprocess.TimeoutExpired:
            result = {"model": entry.name, "error": f"timed out after {args.timeout}s"}
        except Exception:  # noqa: BLE001
            result = {"model": entry.name, "error": traceback.format_exc(limit=1)}
        result["bench_seconds"] = round(time.perf_counter() - t0, 1)
        doc["results"].append(result)
        summary = {p: {k: round(v, 3) for k, v in result.get("ratios", {}).get(p, {}).items() if k.startswith("vs_")} for p in precisions}
        print(f"[zoo_bench] {entry.name}: {summary if 'ratios' in result else result.get('error')}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=float))
        os.replace(tmp, out)
    if work_tmp is not None:
        work_tmp.cleanup()
    print(f"\nresults: {out}")
    print_table(doc["results"], precisions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
