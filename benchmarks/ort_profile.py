"""Why is one variant of a zoo model slower than another in onnxruntime? The ops onnxruntime
runs after its own session optimizer, and the GPU kernels they launch.

    python benchmarks/ort_profile.py --models resnet-dynamo,regnet-dynamo --out DIR
    python benchmarks/ort_profile.py --models resnet-dynamo --variants original,graphopt,graphopt-fp16

Per model and variant (original; graphopt --target ort-cuda, fp32 and fp16; onnxruntime's
offline optimizer at ENABLE_ALL; original-fp16: onnxruntime's float16 converter), on the
CUDA provider with io-binding. A graphopt variant may name options after a "+":
``graphopt-fp16+keep=Softmax`` keeps those ops in float32 (``keep_fp32``), ``graphopt+off=FuseLayerNormMoments``
disables those rules (several joined by ":"), to see what one decision or rule is worth:

* the op types of the graph onnxruntime actually runs (the session's optimized model,
  ``optimized_model_filepath``), so a fusion onnxruntime makes on the original but not on
  graphopt's output shows as a count that differs;
* the median wall time of a run, and from torch.profiler (CUPTI sees onnxruntime's kernels)
  the kernels per run, the summed GPU time and the kernels that take the most of it.

Output: ``DIR/ort_profile.json`` and a short table per model, printed last.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zoo import CACHE_DIR, cached_models, load_inputs  # noqa: E402

VARIANTS = ("original", "graphopt", "graphopt-fp16", "ort-offline-all")


def _make(variant: str, src: Path, dst: Path) -> Path:
    import graphopt

    if variant == "original":
        return src
    if variant == "original-fp16":
        import onnx
        from onnxruntime.transformers import float16

        onnx.save(float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))
        return dst
    if variant.startswith("graphopt"):
        base, *options = variant.split("+")
        settings = dict(option.split("=", 1) for option in options)
        unknown = set(settings) - {"keep", "off"}
        if unknown:
            raise ValueError(f"unknown option(s) {sorted(unknown)} in {variant} (keep=OP:OP, off=RULE:RULE)")
        graphopt.optimize_file(src, dst, target="ort-cuda", precision="fp16" if base.endswith("fp16") else None,
                               keep_fp32=tuple(filter(None, settings.get("keep", "").split(":"))),
                               disable=tuple(filter(None, settings.get("off", "").split(":"))))
        return dst
    if variant == "ort-offline-all":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(dst)
        ort.InferenceSession(str(src), options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        return dst
    raise ValueError(variant)


def _session(path: Path, optimized: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])


def _op_counts(path: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts = collections.Counter(f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    return dict(sorted(counts.items()))


def profile_variant(path: Path, feeds: dict[str, np.ndarray], work: Path, runs: int) -> dict[str, Any]:
    import onnxruntime as ort
    from gpu_profile import kernel_profile

    optimized = work / f"{path.stem}.ort-optimized.onnx"
    sess = _session(path, optimized)
    binding = sess.io_binding()
    for inp in sess.get_inputs():
        value = feeds[inp.name]
        if inp.type == "tensor(float16)" and value.dtype != np.float16:
            value = value.astype(np.float16)
        binding.bind_ortvalue_input(inp.name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cuda")

    def call() -> None:
        sess.run_with_iobinding(binding)

    for _ in range(10):
        call()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return {"median_ms": float(np.median(times)), "ort_ops": _op_counts(optimized), "kernels": kernel_profile(call, runs=10, top=12)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma-separated zoo model names")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    results: dict[str, Any] = {}
    for entry in cached_models(args.cache, args.models.split(",")):
        feeds = load_inputs(entry)
        results[entry.name] = {}
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for variant in args.variants.split(","):
                try:
                    path = _make(variant, entry.path, work / f"{variant}.onnx")
                    results[entry.name][variant] = profile_variant(path, feeds, work, args.runs)
                except Exception as e:  # noqa: BLE001
                    results[entry.name][variant] = {"error": f"{type(e).__name__}: {str(e).strip()[:300]}"}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ort_profile.json").write_text(json.dumps(results, indent=1))
    for model, variants in results.items():
        print(f"== {model}")
        ops = sorted({op for v in variants.values() for op in v.get("ort_ops", {})})
        names = list(variants)
        for i, n in enumerate(names):
            print(f"  [{i}] {n}")
        print(f"{'':34}" + "".join(f"{'[' + str(i) + ']':>17}" for i in range(len(names))))
        for key in ("median_ms",):
            print(f"{key:34}" + "".join(f"{variants[n].get(key, float('nan')):>17.3f}" for n in names))
        print(f"{'gpu_ms_per_run':34}" + "".join(f"{variants[n].get('kernels', {}).get('gpu_ms_per_run', float('nan')):>17.3f}" for n in names))
        print(f"{'kernels_per_run':34}" + "".join(f"{variants[n].get('kernels', {}).get('kernels_per_run', float('nan')):>17}" for n in names))
        for op in ops:
            counts = [variants[n].get("ort_ops", {}).get(op, 0) for n in names]
            if len(set(counts)) > 1:
                print(f"  {op[:32]:32}" + "".join(f"{c:>17}" for c in counts))
        for n in names:
            if "error" in variants[n]:
                print(f"  {n}: {variants[n]['error']}")
            for k in variants[n].get("kernels", {}).get("top", [])[:6]:
                print(f"  [{names.index(n)}] {k['ms_per_run']:8.4f} ms x{k['calls_per_run']:<5} {k['name'][:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
