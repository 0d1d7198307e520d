"""Shape classes: the coarse description of an op's workload that a cost-table entry covers.

A decision compares candidates per *shape class*, never per exact shape: the shipped
table (cost_table.json) is measured on a few representative shapes, and a class says
which shapes such a measurement stands for. For a convolution the class is its kind
(dense, depthwise, grouped), its kernel size, a bucket of its channel count and whether
it runs at batch 1 or more. benchmarks/decisions_bench.py measures one point per
bucket and writes entries with these same labels, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "OpClass", "CHANNEL_BUCKETS", "channel_bucket", "batch_buckets", "conv_kind", "conv_class", "conv_worlds",
    "ROW_BUCKETS", "HIDDEN_BUCKETS", "bucket", "norm_class", "norm_worlds", "bias_act_class", "bias_act_worlds",
    "RECURRENT_HIDDEN_BUCKETS", "SEQUENCE_BUCKETS", "recurrent_class", "recurrent_worlds",
]

#: (lowest, highest or None, label): the channel buckets (max of input and output channels).
#: benchmarks/decisions_bench.py measures 16, 64, 256 and 512 channels, one per bucket.
CHANNEL_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (1, 32, "c1-32"),
    (33, 96, "c33-96"),
    (97, 384, "c97-384"),
    (385, None, "c385+"),
)


@dataclass(frozen=True)
class OpClass:
    """One op's shape class: op type, element type and named features (kind=dense, kernel=k3, ...)."""

    op: str
    dtype: str
    features: tuple[tuple[str, str], ...]

    def feature(self, name: str) -> str | None:
        return dict(self.features).get(name)

    def key(self) -> str:
        return " ".join([self.op, self.dtype, *(v for _, v in self.features)])


def channel_bucket(channels: int) -> str:
    for low, high, label in CHANNEL_BUCKETS:
        if channels >= low and (high is None or channels <= high):
            return label
    return CHANNEL_BUCKETS[0][2]


def batch_buckets(batch: Any) -> tuple[str, ...]:
    """b1 or bN (measured at 32); a symbolic batch may be either, so both."""
    if isinstance(batch, int):
        return ("b1",) if batch == 1 else ("bN",)
    return ("b1", "bN")


def conv_kind(group: int, in_channels: int, out_channels: int) -> str:
    if group == 1:
        return "dense"
    if group == in_channels and out_channels % in_channels == 0:
        return "depthwise"
    return "grouped"


def conv_class(dtype: str, x_shape: Sequence[Any], w_shape: Sequence[Any], group: int, batch: str) -> OpClass | None:
    """The class of a 2-D convolution with input [N, C, H, W] and weights [M, C/group, kH, kW]."""
    if len(x_shape) != 4 or len(w_shape) != 4 or not all(isinstance(d, int) for d in w_shape):
        return None
    in_channels = x_shape[1] if isinstance(x_shape[1], int) else int(w_shape[1]) * group
    out_channels = int(w_shape[0])
    kernel = max(int(w_shape[2]), int(w_shape[3]))
    features = (
        ("kind", conv_kind(group, in_channels, out_channels)),
        ("kernel", f"k{kernel}"),
        ("channels", channel_bucket(max(in_channels, out_channels))),
        ("batch", batch),
    )
    return OpClass("Conv", dtype, features)


def conv_worlds(convs: Sequence[tuple[str, Sequence[Any], Sequence[Any], int]]) -> list[list[OpClass]] | None:
    """The classes of a model's convolutions, (dtype, x shape, w shape, group) each, in every
    "world" its symbolic batch sizes allow (all b1, all bN); None if a class is unknowable."""
    symbolic = any(len(x) == 4 and not isinstance(x[0], int) for _, x, _, _ in convs)
    worlds = []
    for assumed in ("b1", "bN") if symbolic else ("b1",):
        classes = []
        for dtype, x, w, group in convs:
            batch = batch_buckets(x[0])[0] if len(x) == 4 and isinstance(x[0], int) else assumed
            cls = conv_class(dtype, x, w, group, batch)
            if cls is None:
                return None
            classes.append(cls)
        worlds.append(classes)
    return worlds


# --------------------------------------------------------------------------- residual norms
#: Rows (the product of all but the last axis) and hidden size (the last axis) of a residual
#: norm (SkipLayerNormalization, ...): benchmarks/ort_cpu_norms.py measures rows 1, 16, 128,
#: 1024, 4096 and hidden 64, 256, 768, 2048, 4096, one point per bucket.
ROW_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (1, 4, "r1-4"), (5, 48, "r5-48"), (49, 384, "r49-384"), (385, 2048, "r385-2048"), (2049, None, "r2049+"),
)
HIDDEN_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (1, 128, "h1-128"), (129, 512, "h129-512"), (513, 1024, "h513-1024"), (1025, 3072, "h1025-3072"), (3073, None, "h3073+"),
)


def bucket(buckets: tuple[tuple[int, int | None, str], ...], n: int) -> str:
    for low, high, label in buckets:
        if n >= low and (high is None or n <= high):
            return label
    return buckets[0][2]


def norm_class(op: str, dtype: str, rows: str, hidden: int, *, bias: bool, sum_used: bool) -> OpClass:
    """The class of a residual norm `op` over [rows, hidden] (rows: a ROW_BUCKETS label), with or
    without the bias input, its input+skip sum used by other nodes or not."""
    features = (
        ("sum", "sum-used" if sum_used else "sum-unused"),
        ("bias", "bias" if bias else "no-bias"),
        ("rows", rows),
        ("hidden", bucket(HIDDEN_BUCKETS, hidden)),
    )
    return OpClass(op, dtype, features)


def norm_worlds(op: str, dtype: str, shape: Sequence[Any], *, bias: bool, sum_used: bool) -> list[list[OpClass]] | None:
    """The classes of one residual norm with input `shape`, one world per row bucket its symbolic
    dimensions allow (all of them when any is symbolic); None when the hidden size is unknown."""
    if not shape or not isinstance(shape[-1], int):
        return None
    return [[norm_class(op, dtype, label, int(shape[-1]), bias=bias, sum_used=sum_used)] for label in _row_labels(shape)]


def _row_labels(shape: Sequence[Any]) -> list[str]:
    """The ROW_BUCKETS labels of all but the last axis: one if known, every one if any is symbolic."""
    dims = list(shape[:-1])
    if all(isinstance(d, int) for d in dims):
        rows = 1
        for d in dims:
            rows *= int(d)
        return [bucket(ROW_BUCKETS, rows)]
    return [label for _, _, label in ROW_BUCKETS]


# --------------------------------------------------------------------------- a GEMM's bias + activation
def bias_act_class(op: str, dtype: str, rows: str, n: int) -> OpClass:
    """The class of a bias activation `op` (BiasGelu, FastGelu) over a GEMM's [rows, N] output
    (rows: a ROW_BUCKETS label; N bucketed as a norm's hidden size): benchmarks/ort_bias_act.py
    measures rows 1, 16, 128, 1024, 4096 and N 64, 256, 768, 2048, 4096 with K = N / 4."""
    return OpClass(op, dtype, (("rows", rows), ("n", bucket(HIDDEN_BUCKETS, n))))


def bias_act_worlds(op: str, dtype: str, shape: Sequence[Any]) -> list[list[OpClass]] | None:
    """The classes of one bias activation over `shape`, one world per row bucket its symbolic
    dimensions allow; None when N (the last axis) is unknown."""
    if not shape or not isinstance(shape[-1], int):
        return None
    return [[bias_act_class(op, dtype, label, int(shape[-1]))] for label in _row_labels(shape)]


# --------------------------------------------------------------------------- recurrent ops
#: Hidden size and sequence length of a recurrent op (LSTM, GRU, RNN): benchmarks/decisions_bench.py
#: (`--decisions recurrent_precision`) measures hidden 64, 128, 256, 512 and sequences 25 and 100,
#: one point per bucket.
RECURRENT_HIDDEN_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (1, 96, "h1-96"), (97, 192, "h97-192"), (193, 384, "h193-384"), (385, None, "h385+"),
)
SEQUENCE_BUCKETS: tuple[tuple[int, int | None, str], ...] = ((1, 50, "s1-50"), (51, None, "s51+"))


def recurrent_class(op: str, dtype: str, hidden: int, direction: str, sequence: str, batch: str) -> OpClass:
    """The class of a recurrent op (`op`: LSTM, GRU or RNN) of `hidden` units, run in one
    direction (forward or reverse: "forward") or both ("bidirectional"), over a sequence of a
    SEQUENCE_BUCKETS label, at batch b1 or bN."""
    features = (
        ("hidden", bucket(RECURRENT_HIDDEN_BUCKETS, hidden)),
        ("direction", "bidirectional" if direction == "bidirectional" else "forward"),
        ("sequence", sequence),
        ("batch", batch),
    )
    return OpClass(op, dtype, features)


def recurrent_worlds(sites: Sequence[tuple[str, str, int, str, Any, Any]]) -> list[list[OpClass]]:
    """The classes of a model's recurrent ops, (op, dtype, hidden, direction, sequence length,
    batch) each, in every "world" their symbolic dimensions allow: a symbolic batch is b1 or bN,
    a symbolic sequence short or long, so a model with both has four worlds."""
    batches = ("b1", "bN") if any(not isinstance(s[5], int) for s in sites) else ("b1",)
    sequences = [label for _, _, label in SEQUENCE_BUCKETS] if any(not isinstance(s[4], int) for s in sites) else [""]
    worlds = []
    for assumed_batch in batches:
        for assumed_sequence in sequences:
            world = []
            for op, dtype, hidden, direction, length, batch in sites:
                b = batch_buckets(batch)[0] if isinstance(batch, int) else assumed_batch
                s = bucket(SEQUENCE_BUCKETS, length) if isinstance(length, int) else assumed_sequence
                world.append(recurrent_class(op, dtype, hidden, direction, s, b))
            worlds.append(world)
    return worlds
