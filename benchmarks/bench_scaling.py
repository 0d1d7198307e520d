"""How graphopt's cost grows with graph size: BERT with 2, 6, 12 and 24 layers
(dynamo exports from tests/models.py), load + optimize, and save, timed apart.

    python benchmarks/bench_scaling.py [--repeat 7]

File-to-file time on this machine is dominated by writing the weights (0.4-0.8 GB),
whose speed swings with the disk's write-back; the load + optimize part is what the
graph's size drives, so it is reported on its own as well.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # graphopt from this checkout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--layers", default="2,6,12,24")
    args = parser.parse_args()

    import models  # tests/models.py: cached builders

    import graphopt
    from graphopt.ir.onnx_io import load_model, save_model

    rows = {}
    for layers in (int(x) for x in args.layers.split(",")):
        path = models.bert(layers=layers, exporter="dynamo")
        load, optimize, save = [], [], []
        for attempt in range(args.repeat + 1):  # the first run warms caches and is not counted
            with tempfile.TemporaryDirectory(dir=path.parent.parent) as out:
                t0 = time.perf_counter()
                model = load_model(path)
                t1 = time.perf_counter()
                model, report = graphopt.optimize(model)
                t2 = time.perf_counter()
                save_model(model, Path(out) / "model.onnx")
                t3 = time.perf_counter()
            if attempt:
                load.append(t1 - t0)
                optimize.append(t2 - t1)
                save.append(t3 - t2)
        rows[layers] = (report.before.nodes, statistics.median(load), statistics.median(optimize), statistics.median(save))
        n, lo, op, sv = rows[layers]
        print(f"L{layers:<3} nodes {n:5d}  load {lo:.3f} s  optimize {op:.3f} s  save {sv:.3f} s  total {lo + op + sv:.3f} s", flush=True)
    if 12 in rows and 24 in rows:
        a, b = rows[12], rows[24]
        print(f"24/12 layers: optimize {b[2] / a[2]:.2f}x, load {b[1] / a[1]:.2f}x, save {b[3] / a[3]:.2f}x, file to file {sum(b[1:]) / sum(a[1:]):.2f}x")


if __name__ == "__main__":
    main()
