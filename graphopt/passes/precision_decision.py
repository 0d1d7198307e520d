"""Low precision for the convolutions, or float32: a decision (`--precision fp16|bf16`, ort-cuda).

On onnxruntime's CUDA provider float16 does not always pay for a convolution: at batch 1
a small CNN converted to fp16 ran slower than its float32 original on an H100 (17 of the
51 zoo models of issue 14: ResNet, RegNet, MobileNet and the paddle/tf/jax CNN exports),
because cuDNN's NCHW fp16 convolutions convert layouts for the tensor cores and the Casts
at the region's ends cost more than the smaller convolutions save. At batch 32 the same
convolutions win in fp16, by far in NHWC (ResNet-50: 2.63 ms NHWC fp16 against 3.98 ms
NCHW fp16 and 4.32 ms fp32). So converting the convolutions is a decision
(graphopt.decisions), made once per model before the conversion:

* Candidates: `fp32`, where the model's 2-D convolutions and the CNN region around them
  stay float32 (the **baseline**: the original model's form, against which "never slower"
  is judged), and the low type asked for (`fp16`/`bf16`). The low type is applied when the
  cost table predicts it faster by more than the noise margin for every convolution in
  every batch size the model allows (a dynamic batch: batch 1 and batch 32), or `--tune`
  (with the CUDA provider present) measures the whole model built both ways and finds it
  faster. A class the table has no `precision` entry for predicts nothing: the conversion
  goes as asked. (Until 2026-11-27 the low type was the baseline, so a dynamic-batch CNN
  whose convolutions lose in fp16 at batch 1 but win at batch 32 was converted, and ran
  slower than its float32 original at batch 1: EfficientNet-B0 1.16x, MobileNetV2 1.04x
  on the zoo. A user who runs large batches pins the batch with --input-shape.)
* Each candidate is read in the layout the layout decision will give it: the pass runs
  that decision (table only) on a copy converted each way, and reads the entry's
  `fp16-nhwc` or `fp16` (`fp32-nhwc` or `fp32`) figure accordingly. The entries are
  measured by benchmarks/decisions_bench.py (`--decisions precision`) on blocks of
  convolutions of one class, float32 in and out, so the Casts into and out of the
  low-precision block are in the figures.
* The region kept in float32 (`fp32`): every 2-D Conv (the seeds), and every node that
  reads only float32 values (graph inputs, or outputs of nodes kept in float32) unless it
  is a sequence op -- MatMul/Gemm on rank-3 or larger inputs, attention, LayerNorm and
  RMSNorm, recurrent ops, Einsum, graphopt's fused transformer ops: heavy ops
  (registry fact `heavy`) other than the convolution family (Conv, ConvTranspose,
  FusedConv, Batch/Instance/GroupNormalization) and classifier heads (MatMul/Gemm on
  rank-2 inputs, or tail heads: a constant weight and no heavy op after them). So a pure
  CNN stays wholly float32 (as `--precision fp32` would write it) and a transformer neck
  after a CNN backbone still runs in the low type.

The report has the decision (`decisions[]`, kind `precision`, both candidates' predicted
or measured times) and the nodes it kept (`precision_conversion.kept_for_speed`, reason
`speed_decision` in `kept`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.decisions import DecisionPoint, conv_worlds, signature_of
from graphopt.ops.targets import Target
from graphopt.passes.precision_plan import PrecisionPlan
from graphopt.passes.precision_region import joins_region, region_seed
from graphopt.report.sections import DecisionRecord

__all__ = ["KIND", "FP32", "PRECISION_CONVS", "decide_conv_precision", "whole_model_builder", "region_seed", "joins_region"]

KIND = "precision"
FP32 = "fp32"
#: `OptimizeOptions.precision_convs`: "auto" (the decision), "low" (convert as asked), "fp32" (keep them).
PRECISION_CONVS = ("auto", "low", "fp32")

#: Builds a candidate as the whole model: (model at the precision step, plan) -> None, in place.
Finish = Callable[[ir.Model, PrecisionPlan], None]




def _seeds(model: ir.Model, target: Target, plan: PrecisionPlan) -> list[ir.Node]:
    """The float32 2-D convolutions the conversion would run in the low type."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if plan.blocks_op("", "Conv", target) or plan.cannot_run_low(target, "", "Conv", opset) is not None:
        return []
    seeds = []
    for node in model.graph:
        x = node.inputs[0] if node.inputs else None
        if region_seed(node) and x is not None and x.dtype == ir.DataType.FLOAT and not (plan.keep & {node.name or "", *(v.name or "" for v in node.outputs)}):
            seeds.append(node)
    return seeds


def _worlds(seeds: Sequence[ir.Node]) -> list[list[Any]] | None:
    sites = []
    for node in seeds:
        x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        w_shape = w.const_value.shape if w is not None and w.const_value is not None else (w.shape if w is not None else None)
        if x is None or x.shape is None or w_shape is None:
            return None
        group = node.attributes.get("group")
        sites.append(("f32", list(x.shape), list(w_shape), int(group.value) if group is not None and not group.is_ref() else 1))
    return conv_worlds(sites)


def _copy(model: ir.Model) -> ir.Model:
    return ir.serde.deserialize_model(ir.serde.serialize_model(model))


def _layout_is_nhwc(model: ir.Model, target: Target, plan: PrecisionPlan, layout: Any, table: Any) -> bool:
    """Would the layout decision (table only) put this model, converted with `plan`, in NHWC?"""
    from graphopt.ops.lowering import lower_fused_ops
    from graphopt.passes.layout import convert_layout
    from graphopt.passes.precision import convert_precision

    copy = _copy(model)
    convert_precision(copy, target, plan)
    lower_fused_ops(copy, target)
    return convert_layout(copy, target, layout, decider=DecisionPoint(target.name, table=table)).mode == "nhwc"


#: The layout each candidate would get is estimated on copies of the model: not for models
#: with more weights than this (their candidates are read in NCHW).
LAYOUT_ESTIMATE_MAX_BYTES = 1 << 30


def _worth_estimating(model: ir.Model, decider: DecisionPoint, worlds: list[list[Any]] | None) -> bool:
    """Does the table cover every convolution's class (else nothing is predicted, whatever the
    layout), and is the model small enough to copy twice?"""
    assert decider.ep is not None
    if not worlds or any(decider.table.lookup(decider.ep, KIND, cls) is None for world in worlds for cls in world):
        return False
    weights = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    return weights <= LAYOUT_ESTIMATE_MAX_BYTES


def decide_conv_precision(
    model: ir.Model,
    target: Target,
    plan: PrecisionPlan,
    decider: DecisionPoint,
    *,
    layout: Any = "auto",
    forced: str = "auto",
    finish: Finish | None = None,
) -> tuple[PrecisionPlan, DecisionRecord | None]:
    """Decide whether the model's convolutions run in the low type (the plan as it is) or stay
    float32 (the plan with `fp32_convs`); returns the plan and the decision's record (None
    when there is nothing to decide). `forced` is `OptimizeOptions.precision_convs`;
    `finish` turns a copy of the model into the model graphopt writes (for --tune)."""
    if forced not in PRECISION_CONVS:
        raise ValueError(f"precision_convs must be one of {', '.join(PRECISION_CONVS)}, not {forced!r}")
    seeds = _seeds(model, target, plan)
    if not seeds or (decider.ep is None and forced == "auto"):
        return plan, None
    low = plan.precision
    kept = dataclasses.replace(plan, fp32_convs=True)
    worlds = _worlds(seeds)
    nhwc: dict[str, bool] = {}
    failed: list[str] = []
    if forced == "auto" and decider.ep is not None and not decider.can_tune and _worth_estimating(model, decider, worlds):
        for name, variant in ((low, plan), (FP32, kept)):
            try:
                nhwc[name] = _layout_is_nhwc(model, target, variant, layout, decider.table) if target.name == "ort-cuda" else False
            except Exception as error:  # noqa: BLE001 - an estimate that fails reads the NCHW figures, and says so
                nhwc[name] = False
                failed.append(f"{name}: {str(error).splitlines()[0][:120] if str(error) else type(error).__name__}")

    def readings(cls: Any, candidate: str) -> list[tuple[str, str]]:
        return [(KIND, f"{candidate}-nhwc" if nhwc.get(candidate) else candidate)]

    build, signature = None, ""
    if forced == "auto" and decider.can_tune and finish is not None:
        build, signature = whole_model_builder(model, plan, kept, finish, layout)
    chosen = {"auto": None, "low": low, "fp32": FP32}[forced]
    site = f"model ({len(seeds)} convolutions)"
    record = decider.choose(KIND, site, [FP32, low], FP32, worlds, forced=chosen, build=build, signature=signature, readings=readings)
    if nhwc and record.basis == "table":
        record.reason += "; read in the layout each would get: " + ", ".join(f"{c} {'NHWC' if v else 'NCHW'}" for c, v in nhwc.items())
        if failed:
            record.reason += f" (the layout could not be estimated for {'; '.join(failed)}: read in NCHW)"
    return settle(record, plan, kept)


def settle(record: DecisionRecord, plan: PrecisionPlan, kept: PrecisionPlan) -> tuple[PrecisionPlan, DecisionRecord]:
    """The plan a precision decision's record stands for (shared by the convolutions' and the
    recurrent ops' decisions): no entry converts as asked; float32 chosen gives `kept`, and says why."""
    low = plan.precision
    if record.basis == "no_entry":  # nothing predicted: the conversion goes as asked
        record.chosen = low
        record.reason = record.reason.replace("keeping the model as it is", f"{low} as asked")
    if record.chosen != FP32:
        return plan, record
    how = {"measured": "measured", "table": "predicted"}.get(record.basis)
    if how:
        record.reason += f"; kept in float32: {low} {how} no faster here"
    return kept, record


def whole_model_builder(
    model: ir.Model, plan: PrecisionPlan, kept: PrecisionPlan, finish: Finish, layout: Any, kind: str = KIND
) -> tuple[Any, str]:
    """For --tune: each candidate as the whole model graphopt would write, with random inputs
    (`FP32` built with the plan `kept`, the low type with `plan`); and the signature the
    measurements are cached under (decision `kind`)."""
    from graphopt.inputs import _resolve_shapes, make_inputs

    data = ir.serde.serialize_model(model).SerializeToString()
    feeds: dict[str, np.ndarray] = make_inputs(model, _resolve_shapes(model.graph, {}), seed=0)

    def build(candidate: str) -> tuple[bytes, dict[str, np.ndarray]]:
        import onnx

        proto = onnx.ModelProto()
        proto.ParseFromString(data)
        copy = ir.serde.deserialize_model(proto)
        finish(copy, kept if candidate == FP32 else plan)
        return ir.serde.serialize_model(copy).SerializeToString(), feeds

    keeps = (sorted(plan.keep), sorted(plan.range_keep))
    decided = () if kind == KIND else (plan.fp32_convs,)  # the decisions made before this one
    return build, signature_of(kind, data, plan.precision, keeps, repr(layout), *decided)
