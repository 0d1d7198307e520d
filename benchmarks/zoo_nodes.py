"""Node counts over the zoo: graphopt (target onnx: standard ops only) against onnx-simplifier.

    python benchmarks/zoo_nodes.py [--models a,b] [--out FILE.json]

For each model: nodes of the original, of onnxsim's output and of graphopt's; and the
shape / constant ops (Shape, Gather, Slice, Concat, Unsqueeze, Squeeze, Reshape, Cast,
Constant, ConstantOfShape, Identity, Expand, Range, Equal, Where) each leaves, so a gap
in constant-node or shape-chain cleanup shows by op type. Needs onnxsim (bench extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zoo import CACHE_DIR, cached_models  # noqa: E402

SHAPE_OPS = ("Shape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Cast", "Constant", "ConstantOfShape",
             "Identity", "Expand", "Range", "Equal", "Where")


def main(argv: list[str] | None = None) -> int:
    import onnx
    import onnxsim

    import graphopt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--models", default="")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    print(f"{'model':32s} {'original':>8s} {'onnxsim':>8s} {'graphopt':>8s}  shape/constant ops left (graphopt | onnxsim)")
    for entry in cached_models(args.cache, [m for m in args.models.split(",") if m] or None):
        model = onnx.load(str(entry.path))
        row: dict = {"model": entry.name, "original": len(model.graph.node)}
        try:
            simplified, _ = onnxsim.simplify(model)
            sim_ops = Counter(n.op_type for n in simplified.graph.node)
            row["onnxsim"] = len(simplified.graph.node)
        except Exception as e:  # noqa: BLE001
            sim_ops, row["onnxsim_error"] = Counter(), str(e).splitlines()[0][:120]
        optimized, _ = graphopt.optimize(model, target="onnx")
        g_ops = Counter(n.op_type for n in optimized.graph.node)
        row["graphopt"] = len(optimized.graph.node)
        row["shape_ops"] = {op: [g_ops.get(op, 0), sim_ops.get(op, 0)] for op in SHAPE_OPS if g_ops.get(op) or sim_ops.get(op)}
        rows.append(row)
        gaps = " ".join(f"{op}:{g}|{s}" for op, (g, s) in row["shape_ops"].items() if g > s)
        print(f"{entry.name:32s} {row['original']:8d} {row.get('onnxsim', -1):8d} {row['graphopt']:8d}  {gaps}", flush=True)
    more = [r["model"] for r in rows if "onnxsim" in r and r["graphopt"] > r["onnxsim"]]
    print(f"\ngraphopt leaves more nodes than onnxsim on {len(more)} of {len(rows)} models: {', '.join(more) or 'none'}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
