"""On the GPU machine: check the ort-cuda capability table against onnxruntime-gpu
itself, and run the example model optimized for ort-cuda on the CUDA provider.

    python benchmarks/gpu_targets.py OUT_DIR

Writes OUT_DIR/ort_cuda_kernels.json (the CUDA provider's kernel table, in the
format of graphopt/ops/data/ort_cpu_kernels.json) and OUT_DIR/gpu_targets.json,
and prints a short table last.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    ort.preload_dlls()
    # onnxruntime's kernel listing loads every provider library; it crashes the process
    # when one of them (TensorRT) cannot load, so it runs in a child process.
    import subprocess

    from graphopt.ops.targets import TARGETS

    snap = out / "ort_cuda_kernels.json"
    child = subprocess.run(
        [sys.executable, "-c", "import sys, json, onnxruntime as o; o.preload_dlls(); from graphopt.ops.snapshot_ort_kernels import snapshot; "
         "open(sys.argv[1], 'w').write(json.dumps(snapshot('CUDAExecutionProvider'), sort_keys=True))", str(snap)],
        capture_output=True, text=True,
    )
    problems = []
    live: dict[tuple[str, ...], set[str]] = {}
    if child.returncode == 0:
        table = json.loads(snap.read_text())
        live = {tuple(k.split("::", 1)): set(v) for k, v in table["kernels"].items()}
    else:
        problems.append(f"kernel listing unavailable (exit {child.returncode}): {child.stderr.strip().splitlines()[-1:] }")
    for key, dtypes in TARGETS["ort-cuda"].kernels.items() if live else ():
        if key not in live:
            problems.append(f"{key}: no CUDA kernel at all")
        elif not dtypes <= live[key]:
            problems.append(f"{key}: table says {sorted(dtypes)}, CUDA has {sorted(live[key])}")

    # The example model, optimized for ort-cuda, on the CUDA provider vs the original on CPU.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import make_example

    import graphopt

    folder = Path(tempfile.mkdtemp())
    src, dst = folder / "model.onnx", folder / "model.opt.onnx"
    import onnx

    onnx.save(make_example.build(), src)
    report = graphopt.optimize_file(src, dst, target="ort-cuda")
    x = np.random.default_rng(0).standard_normal((4, 3, 64, 64)).astype(np.float32)
    cpu = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    session = ort.InferenceSession(str(dst), providers=["CUDAExecutionProvider"])
    cuda = session.run(None, {"image": x})[0]
    result = {
        "onnxruntime": ort.__version__,
        "providers": session.get_providers(),
        "table_problems": problems,
        "cuda_contrib_kernels": len([k for k in live if k[0] == "com.microsoft"]),
        "example_rewrites": report.total_rewrites,
        "example_ops_after": report.after.ops,
        "example_max_abs_diff_cuda_vs_cpu": float(np.abs(cuda - cpu).max()),
    }
    (out / "gpu_targets.json").write_text(json.dumps(result, indent=1))
    print("ort-cuda table problems:", len(problems))
    for p in problems:
        print("  ", p)
    print(f"example on CUDA: {report.total_rewrites} rewrites, max |cuda - cpu| = {result['example_max_abs_diff_cuda_vs_cpu']:.2e}, providers {result['providers']}")


if __name__ == "__main__":
    main()
