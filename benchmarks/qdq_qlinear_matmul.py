"""Would a rule lowering QDQ MatMuls to QLinearMatMul beat onnxruntime's own choice? (issue 18 item 3)

    python benchmarks/qdq_qlinear_matmul.py --model bert-qdq-pc --threads 1 --rounds 15

onnxruntime's CPU optimizer leaves some DQ -> MatMul -> Q units of a static per-channel
S8S8 model in float (bert-qdq-pc: 16 of 32 MatMuls). This script lowers every
DequantizeLinear(activation) x DequantizeLinear(constant weight) -> MatMul -> QuantizeLinear
unit of a qdq_zoo model to one QLinearMatMul, as such a rule would, and times both models
side by side (interleaved rounds, medians, ORT_ENABLE_ALL; with --threads 1 the calling
thread's CPU time), with the outputs compared.
The rule is only worth writing if the lowered model is faster.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import qdq_zoo  # noqa: E402


def lower_to_qlinear_matmul(src: Path, dst: Path) -> int:
    """Write ``src`` with each DQ x DQ(const) -> MatMul -> Q unit as QLinearMatMul; returns how many."""
    import onnx
    from onnx import helper

    model = onnx.load(str(src))
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    constants = {i.name for i in graph.initializer}
    replaced: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    for n in graph.node:
        if n.op_type != "MatMul":
            continue
        a, b = (producer.get(x) for x in n.input)
        after = users.get(n.output[0], [])
        if not (a and b and a.op_type == b.op_type == "DequantizeLinear" and b.input[0] in constants
                and len(after) == 1 and after[0].op_type == "QuantizeLinear"):
            continue
        q = after[0]
        replaced[id(n)] = helper.make_node("QLinearMatMul", [*a.input[:3], *b.input[:3], q.input[1], q.input[2]], [q.output[0]],
                                           name=f"{n.name}_qlinear")
        dropped.add(id(q))
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(dst))
    return len(replaced)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-qdq-pc")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    model_dir = qdq_zoo.build([args.model])[0]
    feeds = qdq_zoo.load_feeds(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        lowered = Path(tmp) / "qlinear.onnx"
        count = lower_to_qlinear_matmul(model_dir / "model.onnx", lowered)
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        sessions = {name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
                    for name, path in (("original", model_dir / "model.onnx"), ("qlinear", lowered))}
        outputs = {name: s.run(None, feeds)[0] for name, s in sessions.items()}
        times: dict[str, list[float]] = {name: [] for name in sessions}
        # one thread computes on the caller's: its CPU time, which other jobs on a shared machine barely move
        clock = time.thread_time if args.threads == 1 else time.perf_counter
        for _ in range(args.rounds):
            for name in random.sample(list(sessions), len(sessions)):
                for _ in range(args.runs):
                    t0 = clock()
                    sessions[name].run(None, feeds)
                    times[name].append((clock() - t0) * 1e3)
    ref = outputs["original"]
    error = float(np.abs(outputs["qlinear"] - ref).max() / np.abs(ref).max())
    orig, low = (float(np.median(times[n])) for n in ("original", "qlinear"))
    clock_name = "thread CPU time" if args.threads == 1 else "wall time"
    print(f"{args.model}: {count} MatMul units lowered to QLinearMatMul; threads {args.threads} ({clock_name}); onnxruntime {ort.__version__}")
    print(f"original {orig:.2f} ms, lowered {low:.2f} ms: {low / orig:.2f}x; max rel. error {error:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
