"""The report's optional sections: verification, precision conversion, weight quantization,
layout, latency, the decisions' records, and the rewrites' snapshots (only with a written report).

Kept apart from graphopt.report.model (which re-exports them) because a default run fills
none of them: their classes are not created on a small model's start-up (each dataclass
costs ~0.5 ms to create on Python 3.11)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "Verification",
    "PrecisionSummary",
    "WeightLayer",
    "WeightQuantSummary",
    "LayoutSummary",
    "Alternative",
    "DecisionRecord",
    "RangeKeep",
    "Latency",
    "SnapshotNode",
    "SnapshotValue",
    "SnapshotEdge",
    "GraphSnapshot",
]

@dataclass
class Verification:
    passed: bool
    runs: int
    max_abs_diff: dict[str, float]
    rtol: float
    atol: float
    input_shapes: dict[str, list[int]]
    dropped: list[str] = field(default_factory=list)  # rewrites left out because they changed numbers
    message: str = ""
    #: The onnxruntime execution provider the check ran on.
    provider: str = ""
    #: What the check does not prove when it ran elsewhere than the target's provider ("" when it ran there).
    caveat: str = ""
    #: With --weights: each float output's cosine similarity with the original's (the lowest over the runs),
    #: and the least one accepted (QUANTIZED_MIN_COSINE); empty and None otherwise.
    cosine: dict[str, float] = field(default_factory=dict)
    min_cosine: float | None = None


@dataclass
class PrecisionSummary:
    """What `--precision` did (graphopt.passes.precision): nodes converted and kept, casts, constants."""

    precision: str  # "fp16" or "bf16"
    nodes_converted: int = 0  # float32 nodes now computing in the low type
    nodes_kept: int = 0  # float32 nodes left in float32
    kept: dict[str, int] = field(default_factory=dict)  # why, by reason: block_list, no_kernel, shape, ...
    kept_ops: dict[str, int] = field(default_factory=dict)  # kept nodes by op type
    casts_inserted: int = 0  # Casts added at the boundaries of the converted region
    casts_retargeted: int = 0  # Cast(to=float) nodes now casting to the low type
    casts_removed: int = 0  # Casts the cleanup removed (no-ops, pairs)
    constants_converted: int = 0  # float32 constants converted in place
    constants_copied: int = 0  # constants also read in float32: a converted copy was added
    values_clamped: int = 0  # constant elements beyond the low type's range, set to its largest finite value
    values_flushed: int = 0  # non-zero constant elements that became zero (underflow)
    _casts: set[int] = field(default_factory=set, repr=False)
    _typed: int = 0  # untyped outputs given their type before converting
    _unmatched_keep: list[str] = field(default_factory=list, repr=False)
    #: Nodes kept in float32 by the range check, with the value that decided it.
    kept_for_range: list[RangeKeep] = field(default_factory=list)
    #: Nodes kept in float32 because the precision decision found the low type slower for the
    #: model's convolutions (graphopt.passes.precision_decision; the decision is in `decisions`).
    kept_for_speed: list[str] = field(default_factory=list)
    #: Nodes kept in float32 because the target has no kernel for them in the low type, with
    #: the target's words (reason "no_kernel", `detail`: the CUDA provider's Clip-11 is float only).
    kept_for_kernel: list[RangeKeep] = field(default_factory=list)
    #: Where the range check's calibration inputs came from ("synthesized", a file), or why it did not run.
    calibration: str = ""


@dataclass
class WeightLayer:
    """One MatMul/Gemm with a constant 2-D weight, and what `--weights` did with it."""

    node: str
    op: str  # "MatMul" or "Gemm"
    k: int
    n: int
    quantized: bool
    #: Why it was kept: "keep_list" (--weights-keep), "lm_head" (the default block list), "budget"
    #: (its SNR is under --weights-min-snr), "no_kernel" (the target has no MatMulNBits for its type),
    #: "speed_decision" (the cost table predicts the quantized form no faster: decisions[], kind weights);
    #: on the torch path also "speed_measured" (every quantized form was timed slower than the
    #: unquantized matmul, or faster by less than the margin; CUDA and CPU); "" when quantized.
    reason: str = ""
    #: Output SNR in dB of x @ W against x @ dequantize(quantize(W)), x standard normal [rows, K]
    #: (a proxy for calibration activations); None when not measured (kept before measuring).
    snr_db: float | None = None
    #: The weight's own SNR in dB (dequantized against original).
    weight_snr_db: float | None = None
    #: How the quantized layer runs where it differs per layer (torch: "wq_linear", "dequant",
    #: "int4pack", "int8pack", "_scaled_mm"); "" on the ONNX path (the summary's form) and for kept layers.
    layer_form: str = ""
    #: The reason in words (the block-list glob that matched, the timings), "" when none.
    detail: str = ""


@dataclass
class WeightQuantSummary:
    """What `--weights int4|int8` did (graphopt.passes.weight_quant)."""

    weights: str  # "int4", "int8", or "fp8" (torch precision="fp8")
    block_size: int  # 0 for FP8's per-row scales
    symmetric: bool
    #: How quantized layers are run: "MatMulNBits" (com.microsoft), "DequantizeLinear" (opset 21
    #: blocked), "Cast-Mul" (standard ops before opset 21, int8 only); "per layer" on the torch
    #: path (each layer's `layer_form`, chosen by measurement on CUDA).
    form: str
    accuracy_level: int | None  # MatMulNBits' accuracy_level (None for the standard forms)
    min_snr_db: float
    quantized: int = 0
    kept: int = 0
    #: Weight bytes of the quantized layers before and after (packed weights, scales, zero points).
    bytes_before: int = 0
    bytes_after: int = 0
    layers: list[WeightLayer] = field(default_factory=list)
    _unmatched_keep: list[str] = field(default_factory=list, repr=False)


@dataclass
class LayoutSummary:
    """What the NHWC layout pass did (graphopt.passes.layout, ort-cuda): the mode it ran in,
    the nodes it moved to NHWC by op, and the Transposes: inserted at the layout
    boundaries, cancelled where two met, turned into Reshapes, left in the graph."""

    mode: str  # "nhwc" or "nchw"
    converted: dict[str, int] = field(default_factory=dict)
    fused_convs_split: int = 0  # com.microsoft.FusedConv -> NhwcConv + Add(Z) + activation
    transposes_inserted: int = 0
    transposes_cancelled: int = 0
    transposes_as_reshape: int = 0
    transposes: int = 0  # Transpose nodes in the main graph afterwards


@dataclass
class Alternative:
    """One candidate of a decision: its predicted time (cost table) and measured time (--tune)."""

    candidate: str
    predicted_ms: float | None = None
    measured_ms: float | None = None
    source: str = ""  # the cost-table entries or the measurement the figures come from


@dataclass
class DecisionRecord:
    """A choice between forms that can cost time (graphopt.decisions): what was chosen and why."""

    kind: str  # "layout", "conv_bias", "fused_conv", ...
    site: str  # the node it is about, or "model"
    chosen: str
    baseline: str  # the form that changes nothing (chosen when nothing predicts a gain)
    basis: str  # "table", "measured", "forced", "no_entry"
    reason: str
    alternatives: list[Alternative] = field(default_factory=list)


@dataclass
class RangeKeep:
    """A node --precision kept in float32, and why: because of the values it reads or writes
    (measured in float32 on calibration inputs, or found non-finite in the low type), or
    because the target has no kernel for it in the low type (`detail` says which)."""

    node: str
    op: str
    reason: str  # "overflow", "underflow", "non_finite"; "no_kernel"
    max_abs: float | None = None  # the largest |value| it reads or writes, in float32
    detail: str = ""  # for "no_kernel": the target's reason


@dataclass
class Latency:
    """Measured run time of the model before and after (milliseconds; None: not measured)."""

    before_ms: float | None = None
    after_ms: float | None = None
    provider: str = ""  # where it was measured, e.g. "CUDAExecutionProvider"
    runs: int = 0


@dataclass
class SnapshotNode:
    """A node of a snapshot: its name (as `GraphView.label` gives it) and op type."""

    name: str
    op: str


@dataclass
class SnapshotValue:
    """A value crossing a snapshot's boundary: read from outside, or used outside."""

    name: str
    dtype: str | None  # short name: f32, f16, i64, ... (None: unknown)
    shape: list[int | str | None] | None  # symbolic dims as names (None: unknown rank)
    const: bool = False  # an initializer or constant, not computed


@dataclass
class SnapshotEdge:
    """A value flowing from `src` to `dst`: "n<k>" is nodes[k], "i<k>" inputs[k], "o<k>" outputs[k]."""

    src: str
    dst: str
    dtype: str | None
    shape: list[int | str | None] | None


@dataclass
class GraphSnapshot:
    """A small picture of a subgraph: the nodes a rule matched (before) or inserted (after),
    with the values entering and leaving it. Captured by graphopt.report.snapshot."""

    nodes: list[SnapshotNode]
    inputs: list[SnapshotValue]
    outputs: list[SnapshotValue]
    edges: list[SnapshotEdge]
    truncated: int = 0  # nodes left out beyond the size cap
