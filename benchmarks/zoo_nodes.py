"""Node counts over the zoo: graphopt against onnx-simplifier and onnxscript, per target.

    python benchmarks/zoo_nodes.py [--models a,b] [--targets onnx,ort-cuda] [--precision fp16] [--out FILE.json]

For each model and target: nodes of the original, of the anchors' outputs and of graphopt's.
Target `onnx` (standard ops only) compares with `onnxsim.simplify` and onnxscript's
`optimizer.optimize`; target `ort-cuda` with onnxscript's `rewriter.ort_fusions.optimize_for_ort`
(its optimizer + onnxruntime fusions; onnxsim has no ort target, its column repeats the onnx one).
Also the shape / constant ops (Shape, Gather, Slice, Concat, Unsqueeze, Squeeze, Reshape, Cast,
Constant, ConstantOfShape, Identity, Expand, Range, Equal, Where, ReduceProd) each leaves, so a gap
in constant-node or shape-chain cleanup shows by op type. Needs onnxsim and onnxscript (bench extras);
a missing anchor is a column of -1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zoo import CACHE_DIR, cached_models  # noqa: E402

SHAPE_OPS = ("Shape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Cast", "Constant", "ConstantOfShape",
             "Identity", "Expand", "Range", "Equal", "Where", "ReduceProd")


def _onnxsim(model: Any) -> Counter[str] | str:
    try:
        import onnxsim

        simplified, _ = onnxsim.simplify(model)
    except Exception as e:  # noqa: BLE001 - an anchor's failure is a row entry, not the end of the run
        return str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    return Counter(n.op_type for n in simplified.graph.node)


def _onnxscript(model: Any, target: str) -> Counter[str] | str:
    try:
        import onnx_ir as ir

        copy = ir.serde.deserialize_model(model)
        if target == "onnx":
            import onnxscript.optimizer

            onnxscript.optimizer.optimize(copy)
        else:
            from onnxscript.rewriter.ort_fusions import optimize_for_ort

            copy, _ = optimize_for_ort(copy)
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    return Counter(node.op_type for node in copy.graph)


def main(argv: list[str] | None = None) -> int:
    import onnx

    import graphopt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--models", default="")
    parser.add_argument("--targets", default="onnx", help="comma-separated graphopt targets (onnx, ort-cuda, ort-cpu)")
    parser.add_argument("--precision", default=None, help="graphopt --precision on the ort targets (e.g. fp16)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    rows = []
    print(f"{'model':28s} {'target':8s} {'original':>8s} {'onnxsim':>8s} {'oscript':>8s} {'graphopt':>8s}  "
          "shape/constant ops graphopt leaves beyond the best anchor (graphopt|onnxsim|onnxscript)")
    for entry in cached_models(args.cache, [m for m in args.models.split(",") if m] or None):
        model = onnx.load(str(entry.path))
        sim = _onnxsim(model)
        for target in targets:
            row: dict[str, Any] = {"model": entry.name, "target": target, "original": len(model.graph.node)}
            script = _onnxscript(model, target)
            for name, ops in (("onnxsim", sim), ("onnxscript", script)):
                if isinstance(ops, str):
                    row[f"{name}_error"] = ops
                else:
                    row[name] = sum(ops.values())
            kwargs: dict[str, Any] = {"target": target}
            if args.precision and target != "onnx":
                kwargs["precision"] = args.precision
            optimized, _ = graphopt.optimize(model, **kwargs)
            g_ops = Counter(n.op_type for n in optimized.graph.node)
            row["graphopt"] = len(optimized.graph.node)
            s_ops = sim if isinstance(sim, Counter) else Counter()
            o_ops = script if isinstance(script, Counter) else Counter()
            row["shape_ops"] = {op: [g_ops.get(op, 0), s_ops.get(op, 0), o_ops.get(op, 0)]
                                for op in SHAPE_OPS if g_ops.get(op) or s_ops.get(op) or o_ops.get(op)}
            rows.append(row)
            gaps = " ".join(f"{op}:{g}|{s}|{o}" for op, (g, s, o) in row["shape_ops"].items() if g > min(s, o))
            print(f"{entry.name:28s} {target:8s} {row['original']:8d} {row.get('onnxsim', -1):8d} {row.get('onnxscript', -1):8d} "
                  f"{row['graphopt']:8d}  {gaps}", flush=True)
    more = [f"{r['model']}/{r['target']}" for r in rows if r["graphopt"] > min(r.get("onnxsim", 1 << 30), r.get("onnxscript", 1 << 30))]
    print(f"\ngraphopt leaves more nodes than the best anchor on {len(more)} of {len(rows)} rows: {', '.join(more) or 'none'}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
