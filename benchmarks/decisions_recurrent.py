"""The recurrent ops' blocks and forms for benchmarks/decisions_bench.py (`--decisions recurrent_precision`).

A block is one recurrent op (LSTM, GRU or RNN; forward or bidirectional; input size = hidden
size; weights and bias, no initial state) over x [sequence, batch, hidden] float32, its output
Y the block's output. Two forms, both as graphopt writes the block with `--precision fp16`
on ort-cuda: `fp32` (the op kept float32: `precision_recurrent="fp32"`, no Cast) and `fp16`
(the op converted: `precision_recurrent="low"`, with the Casts from and to float32 at the
block's ends), so the entries read as graphopt/passes/precision_recurrent.py compares them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphopt.decisions.shapes import RECURRENT_HIDDEN_BUCKETS, SEQUENCE_BUCKETS, batch_buckets, bucket

__all__ = ["OPS", "DIRECTIONS", "recurrent_block", "recurrent_forms", "recurrent_entry"]

#: --rnn-ops label -> op type, and the gates each op's weights stack.
OPS = {"lstm": "LSTM", "gru": "GRU", "rnn": "RNN"}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DIRECTIONS = ("forward", "bidirectional")


def recurrent_block(op: str, direction: str, hidden: int, sequence: int, batch: int, seed: int = 0) -> onnx.ModelProto:
    """x [sequence, batch, hidden] -> `op` (hidden units, `direction`) -> y [sequence, directions, batch, hidden]."""
    rng = np.random.default_rng(seed)
    gates, directions = _GATES[op], 2 if direction == "bidirectional" else 1
    scale = 1.0 / np.sqrt(hidden)
    inits = [
        numpy_helper.from_array((rng.standard_normal((directions, gates * hidden, hidden)) * scale).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((directions, gates * hidden, hidden)) * scale).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((directions, 2 * gates * hidden)) * 0.1).astype(np.float32), "B"),
    ]
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y"], hidden_size=hidden, direction=direction, name="recurrent")
    graph = helper.make_graph(
        [node], "recurrent_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [sequence, batch, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [sequence, directions, batch, hidden])], inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def recurrent_forms(model: onnx.ModelProto) -> dict[str, onnx.ModelProto]:
    """candidate -> the block as graphopt writes it with --precision fp16 (no range check: random
    weights stay in range; an empty cost table: every other decision keeps the block as it is)."""
    import graphopt
    from graphopt.decisions import CostTable

    def form(forced: str) -> onnx.ModelProto:
        return graphopt.optimize(model, target="ort-cuda", precision="fp16", precision_recurrent=forced, range_check=False,
                                 cost_table=CostTable([]))[0]

    return {"fp32": form("fp32"), "fp16": form("low")}


def recurrent_entry(ep: str, device: str, op: str, direction: str, hidden: int, sequence: int, batch: int,
                    times: dict[str, float], runs: int, cuda: bool) -> dict[str, Any] | None:
    """The cost-table entry of one measured block (None unless both forms were timed)."""
    if set(times) != {"fp32", "fp16"}:
        return None
    return {
        "ep": ep, "decision": "recurrent_precision", "op": op, "dtype": "f32",
        "match": {"hidden": [bucket(RECURRENT_HIDDEN_BUCKETS, hidden)], "direction": [direction],
                  "sequence": [bucket(SEQUENCE_BUCKETS, sequence)], "batch": list(batch_buckets(batch))},
        "times_ms": dict(times), "per": 1, "device": device,
        "source": (f"benchmarks/decisions_bench.py: {op} {direction}, hidden {hidden}, input {hidden}, sequence {sequence}, batch {batch}, "
                   f"f32 in and out; fp16 form with Casts from and to float32 at the block's ends; median of {runs} runs, ORT_ENABLE_ALL"
                   + (", io-binding" if cuda else "")),
    }
