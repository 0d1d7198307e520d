"""Fused-op counts on the torture set (tests/architectures.py): graphopt beside onnxscript's ORT fusions.

For every export of the torture set, counts the fused onnxruntime ops (attention in its forms,
rotary, skip norms, ...) that `graphopt optimize --target ort-cpu|ort-cuda` and onnxscript's
`optimize_for_ort` produce from the same file, checks both outputs against the original in
onnxruntime (CPU; ort-cuda models only structurally), and lists graphopt's remaining
near-misses for attention and rotary with their reasons.

    python benchmarks/torture_fusions.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from architectures import build, cases  # noqa: E402

import graphopt  # noqa: E402

FUSED = {
    "attention": ("Attention", "MultiHeadAttention", "GroupQueryAttention"),
    "rotary": ("RotaryEmbedding",),
    "skip-norm": ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"),
    "norm": ("LayerNormalization", "SimplifiedLayerNormalization"),
    "gelu": ("Gelu", "FastGelu", "BiasGelu"),
}


def fused_counts(model: onnx.ModelProto) -> dict[str, int]:
    ops = Counter(n.op_type for n in model.graph.node)
    return {kind: sum(ops[o] for o in names) for kind, names in FUSED.items()}


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def max_error(reference: list[np.ndarray], model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float | str:
    try:
        got = run(model, feeds)
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"fails: {str(error).splitlines()[0][:80]}"
    return max(float(np.max(np.abs(a - b))) / max(1.0, float(np.max(np.abs(a)))) for a, b in zip(reference, got))


def onnxscript_fusions(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    irmodel = ir.serde.deserialize_model(model)
    optimize_for_ort(irmodel)
    return ir.serde.serialize_model(irmodel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    warnings.simplefilter("ignore")
    for name, exporter in cases():
        path, feeds = build(name, exporter)
        original = onnx.load(str(path))
        reference = run(original, feeds)
        row: dict[str, Any] = {"model": f"{name}-{exporter}", "nodes": len(original.graph.node)}
        for target in ("ort-cpu", "ort-cuda"):
            optimized, report = graphopt.optimize(original, target=target)
            row[f"graphopt {target}"] = fused_counts(optimized)
            if target == "ort-cpu":
                row["graphopt error"] = max_error(reference, optimized, feeds)
                row["near-misses"] = {
                    rule: sorted({m.reason for m in report.rules[rule].near_misses if m.depth > 2})[:3]
                    for rule in ("FuseAttention", "FuseRotaryEmbedding")
                    if rule in report.rules and report.rules[rule].applications == 0
                }
        try:
            peer = onnxscript_fusions(original)
            row["onnxscript"] = fused_counts(peer)
            row["onnxscript error"] = max_error(reference, peer, feeds)
        except Exception as error:  # noqa: BLE001 - the peer's failure is a result
            row["onnxscript"] = f"fails: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print("\n| model | graphopt ort-cpu attn/rotary/skip | graphopt ort-cuda attn/rotary/skip | onnxscript attn/rotary/skip | graphopt err | onnxscript err |")
    print("|---|---|---|---|---|---|")

    def short(c: Any) -> str:
        return c if isinstance(c, str) else f"{c['attention']}/{c['rotary']}/{c['skip-norm']}"

    def err(e: Any) -> str:
        return e if isinstance(e, str) else f"{e:.1e}"

    for r in rows:
        print(f"| {r['model']} | {short(r['graphopt ort-cpu'])} | {short(r['graphopt ort-cuda'])} | {short(r['onnxscript'])} | "
              f"{err(r['graphopt error'])} | {err(r.get('onnxscript error', '-'))} |")


if __name__ == "__main__":
    main()
