"""Quantized weights, or the weights as they are: a decision (`--weights int4|int8` on ort-cpu / ort-cuda).

A weight-only quantized MatMul is not faster by construction: on an H100 with onnxruntime-gpu
1.31.1, a 4-layer TinyLlama-shaped fp16 decoder decoded at batch 1 in 0.750 ms/step with
int4 com.microsoft.MatMulNBits against 1.035 ms unquantized, but in 1.176 ms with int8 (its
8-bit CUDA kernel is slower than cuBLAS's fp16 GEMM there). So, as for the convolutions'
precision (graphopt/passes/precision_decision.py), the quantization of a model's MatMuls is
a decision made once per model from the cost table (kind `weights`):

* Candidates: `unquantized` (the baseline: the model as it came) and the asked type (`int4`,
  `int8`). The asked type is applied unless the table predicts it no faster (by the noise
  margin) in a shape class it has entries for: op MatMul, the activation's type, bits
  (`b4`/`b8`) and the rows the MatMul reads (`r1`: one row, a decode step at batch 1;
  `rN`: more; a symbolic row count allows both). Classes the table has no entry for predict
  nothing: a model with no entry at all is quantized as asked.
* When the asked type loses, every layer stays as it is (kept reason `speed_decision`, in the
  report's weight layers) and the decision says why, with both predictions.

The entries are whole decode steps of the decoder above, per MatMul (benchmarks/llm_onnx_decode.py
with --variants graphopt,graphopt-int4,graphopt-int8; RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from graphopt.decisions.shapes import OpClass
from graphopt.report.sections import DecisionRecord

__all__ = ["KIND", "BASELINE", "decide_weight_quantization"]

KIND = "weights"
BASELINE = "unquantized"
_DTYPES = {ir.DataType.FLOAT: "f32", ir.DataType.FLOAT16: "f16", ir.DataType.BFLOAT16: "bf16"}


def _row_buckets(activation: ir.Value) -> tuple[str, ...]:
    """The row classes a MatMul's activation [..., K] allows: r1, rN or both (symbolic rows)."""
    shape = activation.shape
    if shape is None:
        return ("r1", "rN")
    rows = 1
    for dim in list(shape)[:-1]:
        if not isinstance(dim, int):
            return ("r1", "rN")
        rows *= dim
    return ("r1",) if rows == 1 else ("rN",)


def _worlds(activations: Sequence[ir.Value], bits: int) -> list[list[OpClass]]:
    """One world per row class the model allows (all layers read the same rows in a decoder)."""
    buckets = sorted({b for a in activations for b in _row_buckets(a)})
    worlds = []
    for bucket in buckets:
        world = [OpClass("MatMul", _DTYPES.get(a.dtype, "f32"), (("bits", f"b{bits}"), ("rows", bucket)))
                 for a in activations if a.dtype in _DTYPES and bucket in _row_buckets(a)]
        if world:
            worlds.append(world)
    return worlds


def decide_weight_quantization(activations: Sequence[ir.Value], weights: str, bits: int, decider: Any) -> DecisionRecord | None:
    """Decide whether the MatMuls reading `activations` get their weights quantized (`weights`)
    or stay as they are; None when there is nothing to decide (no provider, no layer)."""
    if decider.ep is None or not activations:
        return None
    worlds = _worlds(activations, bits)
    # A world (row class) with no entry predicts nothing; the others must all predict a gain.
    measured = [world for world in worlds if all(decider.table.lookup(decider.ep, KIND, cls) is not None for cls in world)]
    site = f"model ({len(activations)} MatMuls)"
    if not measured:
        record = decider.choose(KIND, site, [BASELINE, weights], BASELINE, worlds)
        record.chosen = weights
        record.reason = f"no measured entry for these MatMuls on {decider.ep}: {weights} as asked"
        return record
    record = decider.choose(KIND, site, [BASELINE, weights], BASELINE, measured)
    if record.chosen == BASELINE and record.basis == "table":
        record.reason += f"; kept as they are: {weights} predicted no faster here"
    if len(measured) < len(worlds):
        record.reason += " (row classes with no entry predict nothing)"
    return record
