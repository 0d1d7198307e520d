"""Build the zoo: ``python -m benchmarks.zoo [--only NAME,...] [--rebuild] [--no-foreign]``.

Every model is exported, then checked in onnxruntime (CPU) against the framework's own
outputs on the same inputs; a model that fails to export or to match is recorded with
its reason and left out of the cache. The table of the zoo goes to benchmarks/ZOO.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import CACHE_DIR
from .handbuilt import HANDBUILT_MODELS
from .torch_models import TORCH_MODELS, export_torch

HERE = Path(__file__).resolve().parent
ZOO_MD = HERE.parent / "ZOO.md"
#: the virtual environments the foreign exporters run in (made as zoo-requirements.txt says)
VENVS = {"tf2onnx": os.environ.get("ZOO_TF_PYTHON", "/work/venv-zoo-tf/bin/python"),
         "paddle2onnx": os.environ.get("ZOO_PADDLE_PYTHON", "/work/venv-zoo-paddle/bin/python"),
         "jax2onnx": os.environ.get("ZOO_JAX_PYTHON", "/work/venv-zoo-jax/bin/python")}
WORKERS = {"tf2onnx": "tf_worker.py", "paddle2onnx": "paddle_worker.py", "jax2onnx": "jax_worker.py"}


@dataclass(frozen=True)
class Foreign:
    """A model built by a worker script in another framework's virtual environment."""

    name: str
    exporter: str
    worker_model: str
    family: str


FOREIGN_MODELS = [
    Foreign("tf-mobilenetv3-small", "tf2onnx", "mobilenetv3", "Keras MobileNetV3Small (hard_swish, SE)"),
    Foreign("tf-efficientnet", "tf2onnx", "efficientnet", "Keras EfficientNet (swish, SE)"),
    Foreign("tf-resnet", "tf2onnx", "resnet", "Keras ResNet v1 (bottleneck)"),
    Foreign("tf-transformer", "tf2onnx", "transformer", "Keras transformer encoder (MultiHeadAttention)"),
    Foreign("paddle-mobilenetv3-small", "paddle2onnx", "mobilenetv3", "paddle.vision MobileNetV3 small (hardswish, SE)"),
    Foreign("paddle-resnet", "paddle2onnx", "resnet", "paddle.vision ResNet BasicBlocks"),
    Foreign("paddle-crnn", "paddle2onnx", "crnn", "PaddleOCR-style CRNN (hardswish, SE, BiLSTM)"),
    Foreign("jax-cnn", "jax2onnx", "cnn", "Flax nnx CNN (NHWC, hard_swish, SE)"),
    Foreign("jax-vit", "jax2onnx", "transformer", "Flax nnx ViT encoder"),
]


def _all_names() -> list[str]:
    return [m.name for m in TORCH_MODELS] + [m.name for m in HANDBUILT_MODELS] + [m.name for m in FOREIGN_MODELS]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _foreign_version(python: str, dists: list[str]) -> str:
    code = f"import importlib.metadata as m; print(' '.join(d + ' ' + m.version(d) for d in {dists!r}))"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _build_torch(name: str, tmp: Path) -> dict[str, Any]:
    model = next(m for m in TORCH_MODELS if m.name == name)
    result = export_torch(model, tmp / "model.onnx")
    np.savez(tmp / "inputs.npz", **result["inputs"])
    np.savez(tmp / "expected.npz", *result["expected"])
    return {"exporter": f"torch.onnx.export ({model.exporter})", "exporter_version": f"torch {_version('torch')}", "family": model.family}


def _build_handbuilt(name: str, tmp: Path) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    model = next(m for m in HANDBUILT_MODELS if m.name == name)
    proto, feeds = model.make()
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, tmp / "model.onnx")
    np.savez(tmp / "inputs.npz", **feeds)
    # the reference is onnxruntime itself with its graph optimizations off
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(str(tmp / "model.onnx"), options, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.savez(tmp / "expected.npz", *expected)
    return {"exporter": "onnx.helper", "exporter_version": f"onnx {_version('onnx')}", "family": model.style}


def _build_foreign(name: str, tmp: Path) -> dict[str, Any]:
    model = next(m for m in FOREIGN_MODELS if m.name == name)
    python = VENVS[model.exporter]
    if not Path(python).exists():
        raise RuntimeError(f"no {model.exporter} environment at {python} (see benchmarks/zoo-requirements.txt)")
    proc = subprocess.run([python, str(HERE / "workers" / WORKERS[model.exporter]), model.worker_model, str(tmp)],
                          capture_output=True, text=True, timeout=1200)
    (tmp / "worker.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = [line for line in (proc.stdout + proc.stderr).strip().splitlines() if line.strip()][-1:]
        raise RuntimeError(f"{model.exporter} worker failed: {tail[0] if tail else proc.returncode}")
    dists = {"tf2onnx": ["tf2onnx", "tensorflow-cpu"], "paddle2onnx": ["paddle2onnx", "paddlepaddle"], "jax2onnx": ["jax2onnx", "jax"]}
    return {"exporter": model.exporter, "exporter_version": _foreign_version(python, dists[model.exporter]), "family": model.family}


def _check(tmp: Path) -> dict[str, Any]:
    """Run the export in onnxruntime (CPU, default optimizations) against the framework's outputs."""
    import onnxruntime as ort

    with np.load(tmp / "inputs.npz") as f:
        feeds = {k: f[k] for k in f.files}
    with np.load(tmp / "expected.npz") as f:
        expected = [f[k] for k in f.files]
    session = ort.InferenceSession(str(tmp / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    if sorted(names) != sorted(feeds):   # a converter may rename the inputs: feed them in order
        feeds = dict(zip(names, feeds.values()))
        np.savez(tmp / "inputs.npz", **feeds)
    actual = session.run(None, feeds)
    worst = 0.0
    for e, a in zip(expected, actual):
        if e.shape != a.shape:
            return {"ok": False, "reason": f"output shape {a.shape} != {e.shape}"}
        scale = max(float(np.abs(e).max()), 1e-6)
        worst = max(worst, float(np.abs(a.astype(np.float64) - e).max()) / scale)
    finite = all(bool(np.isfinite(a).all()) for a in actual)
    return {"ok": finite and worst < 1e-3, "max_rel_error": worst, "finite": finite}


def _describe(path: Path) -> dict[str, Any]:
    import onnx

    proto = onnx.load(str(path))
    ops = Counter((f"{n.domain}." if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in proto.graph.node)
    return {
        "opset": next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None),
        "nodes": len(proto.graph.node),
        "op_counts": dict(ops.most_common()),
        "bytes": path.stat().st_size,
        "inputs": [(i.name, [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim]) for i in proto.graph.input],
    }


def build(name: str, cache: Path, rebuild: bool = False) -> dict[str, Any]:
    final = cache / name
    if not rebuild and (final / "meta.json").exists():
        meta = json.loads((final / "meta.json").read_text())
        if meta.get("status") == "ok":
            return meta
    tmp = cache / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    meta: dict[str, Any] = {"name": name}
    try:
        if any(m.name == name for m in TORCH_MODELS):
            meta.update(_build_torch(name, tmp))
        elif any(m.name == name for m in HANDBUILT_MODELS):
            meta.update(_build_handbuilt(name, tmp))
        else:
            meta.update(_build_foreign(name, tmp))
        meta["build_seconds"] = round(time.perf_counter() - t0, 1)
        meta.update(_describe(tmp / "model.onnx"))
        meta["check"] = _check(tmp)
        meta["status"] = "ok" if meta["check"]["ok"] else "mismatch"
    except Exception as e:  # noqa: BLE001 - one model's failure is recorded, the zoo goes on
        meta["status"] = "failed"
        lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if line.strip()]
        # torch's ConversionError puts the cause last, after its advice; others put it first
        cause = next((line for line in reversed(lines) if "Error" in line and line is not lines[0]), lines[0] if lines else "")
        meta["reason"] = f"{type(e).__name__}: {cause.strip()[:300]}"
        (tmp / "error.txt").write_text(traceback.format_exc())
    (tmp / "expected.npz").unlink(missing_ok=True)   # used by the check only: keeps the cache small
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return meta


def write_table(cache: Path, out: Path = ZOO_MD) -> None:
    metas = [json.loads(p.read_text()) for p in sorted(cache.glob("*/meta.json"))]
    ok = [m for m in metas if m["status"] == "ok"]
    exporters = sorted({m["exporter"] for m in ok})
    lines = [
        "# The zoo (issue 14)",
        "",
        "Built by `python -m benchmarks.zoo` (benchmarks/zoo/) from code and configs with seeded random weights;",
        "cached in `benchmarks/.zoo/` (ignored by git). Written by the build: do not edit by hand.",
        f"{len(ok)} models from {len(exporters)} exporters; {sum(m['bytes'] for m in ok) / 2**20:.1f} MiB of model files.",
        "",
        "| model | exporter | exporter version | opset | nodes | MiB | family / style | check (max rel. error vs the framework) |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for m in ok:
        lines.append(f"| {m['name']} | {m['exporter']} | {m['exporter_version']} | {m['opset']} | {m['nodes']} | "
                     f"{m['bytes'] / 2**20:.2f} | {m['family']} | {m['check']['max_rel_error']:.1e} |")
    failed = [m for m in metas if m["status"] != "ok"]
    if failed:
        lines += ["", "## Not in the zoo", "", "| model | status | reason |", "|---|---|---|"]
        for m in failed:
            lines.append(f"| {m['name']} | {m['status']} | {m.get('reason') or m.get('check')} |")
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names (default: all)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild models already in the cache")
    parser.add_argument("--no-foreign", action="store_true", help="skip the tf2onnx / paddle2onnx / jax2onnx models")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help=f"cache folder (default {CACHE_DIR})")
    parser.add_argument("--list", action="store_true", help="list the model names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(_all_names()))
        return 0
    names = [n for n in args.only.split(",") if n] or _all_names()
    unknown = sorted(set(names) - set(_all_names()))
    if unknown:
        print(f"error: unknown zoo model(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.no_foreign:
        names = [n for n in names if not any(f.name == n for f in FOREIGN_MODELS)]
    args.cache.mkdir(parents=True, exist_ok=True)
    for name in names:
        meta = build(name, args.cache, args.rebuild)
        detail = f"{meta.get('nodes')} nodes, opset {meta.get('opset')}" if meta["status"] == "ok" else meta.get("reason") or meta.get("check")
        print(f"[zoo] {name:32s} {meta['status']:8s} {meta.get('build_seconds', '-')}s  {detail}", flush=True)
    write_table(args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
