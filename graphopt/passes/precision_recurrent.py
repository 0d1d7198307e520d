"""Low precision for the recurrent ops, or float32: a decision (`--precision fp16|bf16`, ort-cuda).

Recurrent ops (LSTM, GRU, RNN) used to convert whenever a conversion was asked for. On
onnxruntime's CUDA provider that does not always pay: paddle-crnn (a paddle2onnx CRNN, a
conv backbone then two bidirectional LSTMs of 48 units over 40 steps at batch 1) ran 1.034x
its float32 original in fp16 on an H100 (4.302 against 4.160 ms; onnxruntime's own offline
fp16 4.318), its convolutions already kept float32 by the convolutions' decision: a short,
narrow cuDNN recurrence at batch 1 is bound by its step-by-step launches, not by arithmetic,
and the Casts at its ends are extra. So converting the recurrent ops is a decision
(graphopt.decisions), made once per model after the convolutions' one (precision_decision):

* Candidates: `fp32`, where the model's recurrent ops and the light ops reading only float32
  values around them stay float32 (the **baseline**, the original's form), and the low type
  asked for. The low type is applied when the cost table's `recurrent_precision` entries
  predict it faster by more than the noise margin for the recurrent ops in every batch size
  and sequence length the model allows (a symbolic batch: b1 and bN; a symbolic sequence:
  short and long), or `--tune` measures the whole model built both ways and finds it faster.
  A class no entry covers predicts nothing: the conversion goes as asked.
* Classes (graphopt.decisions.shapes.recurrent_class): op, hidden-size bucket, direction
  (one, or bidirectional), sequence-length bucket, batch b1/bN. The entries are measured by
  benchmarks/decisions_bench.py (`--decisions recurrent_precision`) on one recurrent op,
  float32 in and out, so the Casts into and out of the low type are in the fp16 figures.
* The region kept (graphopt.passes.precision_region): the recurrent ops, and every node
  reading only float32 values that is not heavy (layout and elementwise ops, fused
  activations, classifier heads on rank-2 tensors and tail heads: a MatMul/Gemm with a constant
  weight and no heavy op after it, like a CRNN's per-step classifier); convolutions stay with it
  only when the convolutions' decision keeps them too. Listed in `precision_conversion.kept_for_speed`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import onnx_ir as ir

from graphopt.decisions import DecisionPoint
from graphopt.decisions.shapes import recurrent_worlds
from graphopt.ops.targets import Target
from graphopt.passes.precision_decision import FP32, PRECISION_CONVS, Finish, settle, whole_model_builder
from graphopt.passes.precision_plan import PrecisionPlan
from graphopt.passes.precision_region import recurrent_seed
from graphopt.report.sections import DecisionRecord

__all__ = ["KIND", "PRECISION_RECURRENT", "decide_recurrent_precision"]

KIND = "recurrent_precision"
#: `OptimizeOptions.precision_recurrent`: "auto" (the decision), "low" (convert as asked), "fp32" (keep them).
PRECISION_RECURRENT = PRECISION_CONVS

#: Gates per op: the weights W are [directions, gates * hidden, input].
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _seeds(model: ir.Model, target: Target, plan: PrecisionPlan) -> list[ir.Node]:
    """The float32 recurrent ops the conversion would run in the low type."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    seeds = []
    for node in model.graph:
        x = node.inputs[0] if node.inputs else None
        if not recurrent_seed(node) or x is None or x.dtype != ir.DataType.FLOAT:
            continue
        if plan.blocks_op("", node.op_type, target) or plan.cannot_run_low(target, "", node.op_type, opset) is not None:
            continue
        if (plan.keep | plan.range_keep) & {node.name or "", *(v.name or "" for v in node.outputs)}:
            continue
        seeds.append(node)
    return seeds


def _hidden_size(node: ir.Node) -> int | None:
    attr = node.attributes.get("hidden_size")
    if attr is not None and not attr.is_ref():
        return int(attr.value)
    w = node.inputs[1] if len(node.inputs) > 1 else None
    shape = w.const_value.shape if w is not None and w.const_value is not None else (w.shape if w is not None else None)
    if shape is None or len(shape) != 3 or not isinstance(shape[1], int):
        return None
    return int(shape[1]) // _GATES[node.op_type]


def _site(node: ir.Node) -> tuple[str, str, int, str, Any, Any] | None:
    """(op, dtype, hidden, direction, sequence length, batch) of one recurrent op; None if unknown."""
    x = node.inputs[0]
    hidden = _hidden_size(node)
    if x is None or x.shape is None or len(x.shape) != 3 or hidden is None:
        return None
    direction = node.attributes.get("direction")
    layout = node.attributes.get("layout")
    batch_first = layout is not None and not layout.is_ref() and int(layout.value) == 1
    length, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    way = str(direction.value) if direction is not None and not direction.is_ref() else "forward"
    return node.op_type, "f32", hidden, way, length, batch


def decide_recurrent_precision(
    model: ir.Model,
    target: Target,
    plan: PrecisionPlan,
    decider: DecisionPoint,
    *,
    layout: Any = "auto",
    forced: str = "auto",
    finish: Finish | None = None,
) -> tuple[PrecisionPlan, DecisionRecord | None]:
    """Decide whether the model's recurrent ops run in the low type (the plan as it is) or stay
    float32 (the plan with `fp32_recurrent`); returns the plan and the decision's record (None
    when there is nothing to decide). `forced` is `OptimizeOptions.precision_recurrent`;
    `finish` turns a copy of the model into the model graphopt writes (for --tune)."""
    if forced not in PRECISION_RECURRENT:
        raise ValueError(f"precision_recurrent must be one of {', '.join(PRECISION_RECURRENT)}, not {forced!r}")
    seeds = _seeds(model, target, plan)
    if not seeds or (decider.ep is None and forced == "auto"):
        return plan, None
    low = plan.precision
    kept = dataclasses.replace(plan, fp32_recurrent=True)
    sites = [_site(node) for node in seeds]
    worlds = None if any(s is None for s in sites) else recurrent_worlds([s for s in sites if s is not None])
    build, signature = None, ""
    if forced == "auto" and decider.can_tune and finish is not None:
        build, signature = whole_model_builder(model, plan, kept, finish, layout, kind=KIND)
    chosen = {"auto": None, "low": low, "fp32": FP32}[forced]
    ops = Counter(node.op_type for node in seeds)
    site = f"model ({len(seeds)} recurrent ops: {', '.join(f'{n} {op}' for op, n in sorted(ops.items()))})"
    record = decider.choose(KIND, site, [FP32, low], FP32, worlds, forced=chosen, build=build, signature=signature)
    return settle(record, plan, kept)
