"""Which nodes of graphopt's output onnxruntime's CUDA provider hands to the CPU provider.

    python benchmarks/ort_placement.py --models hb-fpn-upsample-op11,jax-cnn --precisions fp32,fp16

A node the CUDA provider has no kernel for (that op, that opset, those types) runs on the
CPU with a copy each way: the session's own log says which (onnxruntime's "Node
placements", at INFO level). Per model and variant this prints those lines, and also
writes the CUDA provider's kernel table (graphopt.ops.snapshot_ort_kernels) next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zoo import CACHE_DIR, cached_models  # noqa: E402

_SESSION = """
import onnxruntime as ort, sys
ort.preload_dlls() if hasattr(ort, "preload_dlls") else None
o = ort.SessionOptions(); o.log_severity_level = 1
ort.set_default_logger_severity(1)
ort.InferenceSession(sys.argv[1], o, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
"""


def placements(path: Path) -> list[str]:
    """The session log's lines about nodes placed on the CPU provider (and memcpy)."""
    run = subprocess.run([sys.executable, "-c", _SESSION, str(path)], capture_output=True, text=True, timeout=300, env=os.environ)
    log = run.stdout + run.stderr
    keep, on_cpu = [], False
    for line in log.splitlines():
        text = re.sub(r"^.*?\] ", "", line)
        if "Node placements" in text or "Memcpy" in text or "All nodes placed" in text:
            keep.append(text)
            on_cpu = False
        if "Node(s) placed on [CPUExecutionProvider]" in text:
            on_cpu = True
            keep.append(text)
        elif on_cpu and text.strip().startswith(("Node name", " ")):
            keep.append(text)
        elif on_cpu and not text.strip():
            on_cpu = False
    return keep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import graphopt

    names = args.models.split(",")
    missing = set(names) - {e.name for e in cached_models(args.cache, names)}
    if missing:  # hand-built and small models build in seconds
        import importlib

        build = importlib.import_module("zoo.__main__").build
        for name in sorted(missing):
            build(name, args.cache)
    results: dict[str, dict[str, list[str]]] = {}
    for entry in cached_models(args.cache, names):
        results[entry.name] = {"original": placements(entry.path)}
        with tempfile.TemporaryDirectory() as tmp:
            for precision in args.precisions.split(","):
                out = Path(tmp) / f"{precision}.onnx"
                graphopt.optimize_file(entry.path, out, target="ort-cuda", precision=None if precision == "fp32" else precision)
                results[entry.name][f"graphopt-{precision}"] = placements(out)
    for model, variants in results.items():
        for variant, lines in variants.items():
            print(f"== {model} {variant}")
            for line in lines[:40]:
                print("   ", line[:200])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ort_placement.json").write_text(json.dumps(results, indent=1))
        # Read in a child process: listing the registry in this one crashes where
        # onnxruntime-gpu's TensorRT library cannot load (None then).
        from graphopt.ops.snapshot_ort_kernels import installed_kernels

        table = installed_kernels("CUDAExecutionProvider")
        if table is not None:
            (args.out / "ort_cuda_kernels.json").write_text(json.dumps(table, indent=1, sort_keys=True))
        print(f"CUDA provider's kernel table: {'written' if table is not None else 'not readable here (see benchmarks/snapshot_ort_cuda_kernels.sh)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
