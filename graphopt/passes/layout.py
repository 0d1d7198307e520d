"""NHWC layout for onnxruntime's CUDA provider (``--target ort-cuda``).

cuDNN's fastest convolutions (tensor cores, float16 and TF32) read and write NHWC;
an NCHW model makes them convert layouts inside every Conv. onnxruntime's CUDA
provider has NHWC kernels for what matters in a CNN: com.microsoft.NhwcConv
(float32/float16; X and Y NHWC, W stays [M, C/group, kH, kW]) and
com.microsoft.GroupNorm (which runs *only* in NHWC, ``channels_last = 1``).

The pass, on the main graph, after lowering:

1. **Decide** (forward, in topological order) which nodes run in NHWC:
   *anchors* that have an NHWC kernel (Conv -> NhwcConv; com.microsoft.FusedConv,
   whose CUDA kernel is NCHW only, split into NhwcConv + Add(Z) + activation, see
   `LayoutOptions.fused_conv`; com.microsoft.GroupNorm, always, since its kernel
   has no NCHW form), then every *layout-agnostic* node (elementwise ops, Clip,
   Reduce* with constant axes, Concat/Split, GlobalAverage/MaxPool as Reduce over
   H, W) whose 4-D inputs mostly already are NHWC: constants are permuted once,
   a remaining NCHW input gets a Transpose.
2. **Rewrite**: each chosen node is rebuilt on the NHWC values; where an NCHW
   consumer (or a graph output) still reads a value, a Transpose back is added.
3. **Clean up**: Transpose pairs that meet cancel (a chain folds into one
   permutation; the identity disappears), Transposes that only move size-1 axes
   become Reshapes, dead nodes go.

MaxPool / AveragePool have no public NHWC op: they stay NCHW between a Transpose
pair unless `LayoutOptions.internal_nhwc_pools` puts them in onnxruntime's internal
``com.ms.internal.nhwc`` domain (the kernels its own layout transformer uses;
registered by the CUDA provider when built with NHWC ops). That domain is not a
public contract, so it is off by default until checked on the GPU machine.

**NhwcConv or FusedConv, and where the bias goes: decisions, not rules.** onnxruntime's
CUDA Conv adds its bias with cudnnAddTensor, a separate kernel that took 1.25 ms of the
2.9 ms GPU time of ResNet-50 b32 in float16 (CUPTI kernel profile, H200,
onnxruntime-gpu 1.31.1); a bias-free NhwcConv followed by an ordinary Add of the bias ran
ResNet-50 b32 in 2.60 ms against 3.25 ms with the bias in the conv (float32: 4.05 ms
against 4.31 ms for the NCHW graph with FusedConv). But the same NHWC + Add form cost
6-21 % on MobileNetV3-style models (depthwise convolutions, decomposed HardSwish,
squeeze-excite; issue 14). So "auto" is a decision (graphopt.decisions): the candidates
"nchw" (the baseline), "nhwc-add" and "nhwc-kernel" are compared on the shipped cost
table by the shape class of every convolution (dense / depthwise / grouped, kernel size,
channels, batch, dtype) and NHWC is chosen only where the table predicts it faster for
all of them; a convolution class nobody measured keeps the model NCHW. "nchw" is the model
as it is: each convolution is read in the form it has (a Conv + activation the fused_conv
decision left is read from that decision's figures, `_layout_readings`), and NHWC needs at
least the measured blocks' convolutions per Transpose it adds. With `--tune`
and the CUDA provider present, the whole model is timed in each form instead.
`conv_bias="add"`/`"kernel"` and `layout="nhwc"` force the choice; `auto_dtypes` limits
the dtypes "auto" considers, and `fused_conv="keep"` keeps FusedConv inside an NHWC
graph, between Transposes.

`emulate_nhwc_ops` rewrites the NHWC-only ops into standard ops (Transpose +
NCHW op + Transpose) so the result can be checked on onnxruntime's CPU provider,
which has none of them (graphopt.passes.nhwc_emulation).

The pass is spread over modules by job: this one holds the options, the NCHW/NHWC
decision and the entry point `convert_layout`; graphopt.passes.nhwc_rewrite chooses and
rebuilds the nodes, graphopt.passes.transpose_cleanup cleans up after it,
graphopt.passes.nhwc_emulation turns NHWC-only ops back into standard ops for the CPU
provider, and graphopt.passes.nhwc_graph holds what they share.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.ops.targets import MS_DOMAIN, Target
from graphopt.passes._common import in_qdq_unit
from graphopt.passes.nhwc_graph import _ONNX, _attr, _dtype, _rank, _x
from graphopt.passes.nhwc_rewrite import _Layout
from graphopt.passes.transpose_cleanup import _cancel_transposes, _remove_dead, _transposes_to_reshapes
from graphopt.report.sections import LayoutSummary

__all__ = ["LayoutOptions", "convert_layout"]

#: "auto" converts a model only when it has at least this many convolutions per Transpose the
#: NHWC layout adds at its boundaries: the cost table's NHWC figures were measured on blocks of
#: 6 convolutions with 2 boundary Transposes (benchmarks/decisions_bench.py), so a model with
#: more Transposes per convolution than that is outside what was measured (ResNet-50: 53 for 4;
#: MobileNetV2: 52 for 2; a ViT's patch embedding: 1 for 2, and a 3-convolution CRNN stem: 3
#: for 2, left NCHW). Transposes NCHW needs anyway (around a UNet's GroupNorms) do not count.
AUTO_CONVS_PER_TRANSPOSE = 3


@dataclass(frozen=True)
class LayoutOptions:
    #: "nhwc": convert; "nchw": keep NCHW (only ops that exist solely in NHWC, GroupNorm,
    #: get Transposes around them); "auto": a decision (graphopt.decisions) between NCHW
    #: and NHWC for the model's Convs of the `auto_dtypes`, from the cost table (or timed,
    #: with --tune); NHWC also needs more Convs than the Transposes the NHWC region adds at
    #: its boundaries (`AUTO_CONVS_PER_TRANSPOSE`).
    mode: str = "auto"
    #: The dtypes whose Convs "auto" considers for NHWC (the cost table decides which of
    #: them win). Set to {"f16", "bf16"} to keep float32 models NCHW with FusedConv.
    auto_dtypes: frozenset[str] = frozenset({"f32", "f16", "bf16"})
    #: What NHWC does with a com.microsoft.FusedConv (NCHW-only kernel): "unfuse" into
    #: NhwcConv + Add(Z) + activation, or "keep" it NCHW between Transposes.
    fused_conv: str = "unfuse"
    #: Run MaxPool/AveragePool/GlobalMaxPool in onnxruntime's internal NHWC domain.
    internal_nhwc_pools: bool = False
    #: Where NhwcConv's bias is added: "kernel" (its bias input: the CUDA kernel adds it
    #: with cudnnAddTensor, a separate kernel), "add" (a bias-free NhwcConv followed by an
    #: elementwise Add of the bias, onnxruntime's own broadcast kernel) or "auto" (a
    #: decision from the cost table; "kernel", which changes nothing, where it has no entry).
    conv_bias: str = "auto"


# ----------------------------------------------------------------------------- entry points


def _count_transposes(model: ir.Model) -> int:
    return sum(1 for n in model.graph if n.op_type == "Transpose" and n.domain in _ONNX)


#: The layout decision's candidates: NCHW as the model is (the baseline), or NHWC with each
#: convolution's bias added by an elementwise Add or inside NhwcConv.
LAYOUT_CANDIDATES = ("nchw", "nhwc-add", "nhwc-kernel")


def _conv_sites(model: ir.Model, target: Target, options: LayoutOptions) -> tuple[list[tuple[str, list[Any], list[Any], int]], list[str]]:
    """(dtype, input shape, weight shape, group) of every 2-D convolution the target could run in
    NHWC, and the form each has now ("FusedConv" or "Conv")."""
    kernels = target.kernels.get((MS_DOMAIN, "NhwcConv"), frozenset())
    sites = []
    forms = []
    for node in model.graph:
        if node.op_type not in ("Conv", "FusedConv") or node.domain not in (*_ONNX, MS_DOMAIN) or _rank(node.inputs[0]) != 4:
            continue
        if in_qdq_unit(node):
            continue  # stays NCHW: see nhwc_rewrite's anchor
        x, w = _x(node), node.inputs[1]
        dtype = _dtype(x)
        if dtype not in kernels or dtype not in options.auto_dtypes:
            continue
        w_shape = w.const_value.shape if w is not None and w.const_value is not None else (w.shape if w is not None else None)
        sites.append((dtype, list(x.shape or []), list(w_shape) if w_shape is not None else [], int(_attr(node, "group", 1))))
        forms.append(node.op_type)
    return sites, forms


def _with_forms(worlds: list[list[Any]] | None, forms: list[str]) -> list[list[Any]] | None:
    """Each convolution's class, told the form it has now (a feature no entry restricts)."""
    from graphopt.decisions import OpClass

    if worlds is None:
        return None
    return [[OpClass(c.op, c.dtype, (*c.features, ("form", form))) for c, form in zip(world, forms)] for world in worlds]


def _layout_readings(cls: Any, candidate: str) -> list[tuple[str, str]]:
    """Where the table's time of one convolution in a layout candidate is read. The layout
    entries' "nchw" is graphopt's NCHW output as benchmarks/decisions_bench.py wrote it:
    FusedConv in float32. The baseline is the model as it is now, so an NCHW convolution
    the fused_conv decision left as Conv + activation (the input's form) is read from that
    decision's "Conv+activation" figure, measured on the same block; where there is none
    (float16: FusedConv is float32 only) the layout entry's "nchw" is that form already."""
    if candidate != "nchw":
        return [("layout", candidate)]
    fused = cls.feature("form") == "FusedConv"
    return [("fused_conv", "FusedConv" if fused else "Conv+activation"), ("layout", "nchw")]


def _decide_layout(model: ir.Model, target: Target, options: LayoutOptions, decider: Any) -> tuple[str, str, Any]:
    """(mode, conv_bias, the decision's record or None) for this model: "auto" and
    conv_bias="auto" are decisions (graphopt.decisions); explicit options are taken as they are."""
    from graphopt.decisions import conv_worlds

    if options.mode not in ("auto", "nchw", "nhwc"):
        raise ValueError(f"layout must be 'auto', 'nchw' or 'nhwc', not {options.mode!r}")
    if options.conv_bias not in ("auto", "add", "kernel"):
        raise ValueError(f"conv_bias must be 'auto', 'add' or 'kernel', not {options.conv_bias!r}")
    if options.mode == "nchw":
        return "nchw", "kernel", None
    sites, forms = _conv_sites(model, target, options)
    worlds = _with_forms(conv_worlds(sites), forms) if sites else None
    if options.mode == "nhwc":
        if options.conv_bias != "auto":
            return "nhwc", options.conv_bias, None
        if not sites:
            return "nhwc", "kernel", None
        chosen = decider.choose("layout", "model (--layout nhwc)", ["nhwc-kernel", "nhwc-add"], "nhwc-kernel", worlds)
        return "nhwc", chosen.chosen.split("-", 1)[1], chosen
    if not sites:
        return "nchw", "kernel", None  # nothing to decide: no convolution NHWC could speed up
    candidates = ["nchw", *(c for c in LAYOUT_CANDIDATES[1:] if options.conv_bias in ("auto", c.split("-", 1)[1]))]
    build, signature = None, ""
    if decider.can_tune:
        build, signature = _tune_builder(model, target, options)
    chosen = decider.choose("layout", "model", candidates, "nchw", worlds, build=build, signature=signature, readings=_layout_readings)
    if chosen.chosen == "nchw":
        return "nchw", "kernel", chosen
    return "nhwc", chosen.chosen.split("-", 1)[1], chosen


def _tune_builder(model: ir.Model, target: Target, options: LayoutOptions) -> tuple[Any, str]:
    """For --tune: each layout candidate as the whole model in that layout, with random inputs."""
    import dataclasses

    from graphopt.decisions import DecisionPoint, signature_of
    from graphopt.inputs import _resolve_shapes, make_inputs

    proto = ir.serde.serialize_model(model)
    data = proto.SerializeToString()
    feeds = make_inputs(model, _resolve_shapes(model.graph, {}), seed=0)

    def build(candidate: str) -> tuple[bytes, dict[str, np.ndarray]]:
        copy = ir.serde.deserialize_model(onnx_proto_copy(data))
        mode, bias = ("nchw", "kernel") if candidate == "nchw" else ("nhwc", candidate.split("-", 1)[1])
        convert_layout(copy, target, dataclasses.replace(options, mode=mode, conv_bias=bias), decider=DecisionPoint(target.name))
        return ir.serde.serialize_model(copy).SerializeToString(), feeds

    return build, signature_of("layout", data, options)


def onnx_proto_copy(data: bytes) -> Any:
    import onnx

    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    return proto


def convert_layout(
    model: ir.Model, target: Target, options: LayoutOptions | str | None = None, *, stats: Any = None, decider: Any = None
) -> LayoutSummary:
    """Run the layout pass on the main graph for `target` (a no-op for targets without
    NhwcConv and GroupNorm kernels); returns what it did, transposes left included.
    `decider` (a graphopt.decisions.DecisionPoint; by default one on the shipped cost
    table) makes the "auto" choices and keeps their records."""
    from graphopt.decisions import DecisionPoint

    started = time.perf_counter()
    if options is None or isinstance(options, str):
        options = LayoutOptions(mode=options or "auto")
    decider = decider if decider is not None else DecisionPoint(target.name)
    nhwc_capable = (MS_DOMAIN, "NhwcConv") in target.kernels
    mode, conv_bias, decision = _decide_layout(model, target, options, decider) if nhwc_capable else ("nchw", "kernel", None)
    options = dataclasses.replace(options, conv_bias=conv_bias)
    summary = LayoutSummary(mode=mode)
    if (MS_DOMAIN, "NhwcConv") in target.kernels or (MS_DOMAIN, "GroupNorm") in target.kernels:
        layout = _Layout(model, target, options, summary)
        chosen = layout.plan(nhwc=mode == "nhwc")
        measured = decision is not None and decision.basis == "measured"
        if mode == "nhwc" and options.mode == "auto" and not measured:
            # The table's NHWC figures hold where the model has at least the measured blocks'
            # convolutions per Transpose NHWC adds (over those NCHW needs anyway, around GroupNorm).
            convs = sum(1 for n in chosen if n.op_type in ("Conv", "FusedConv"))
            nchw = layout.plan(nhwc=False)
            added = layout.boundary(chosen) - layout.boundary(nchw)
            if convs < AUTO_CONVS_PER_TRANSPOSE * added:
                summary.mode = "nchw"
                chosen = nchw
                if decision is not None:
                    decision.chosen = "nchw"
                    decision.reason += (
                        f"; but NHWC would add {added} Transposes for {convs} convolutions (the table's figures hold from"
                        f" {AUTO_CONVS_PER_TRANSPOSE} per Transpose): kept NCHW"
                    )
        changed = layout.run(chosen)
        if changed:
            before = _count_transposes(model)
            _cancel_transposes(model, layout.b)
            _remove_dead(model)
            summary.transposes_cancelled = max(0, before - _count_transposes(model))
            _transposes_to_reshapes(model, layout.b, summary)
            _remove_dead(model)
    summary.transposes = _count_transposes(model)
    if stats is not None:
        stats.runs += 1
        stats.changes += sum(summary.converted.values())
        stats.time_s += time.perf_counter() - started
    return summary
