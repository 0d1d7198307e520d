"""Targets and their capability tables: which ops a rewrite may emit, per dtype.

A rewrite emits standard ONNX ops or graphopt's own fused ops (domain
`graphopt`). Standard ops are allowed when the model's opset defines them. A
graphopt op is allowed only when the target has a lowering for it *and* the op
it lowers to has a kernel for the dtype on that target. Nothing else is ever
emitted: the driver checks every new node before committing a rewrite. Which op a
graphopt op lowers to, per target, and the kernel's contract are declared with the op
(graphopt/ops/fused_ops.py, read through graphopt.ops.registry).

The ort-cpu table is read from the installed onnxruntime's kernel registry the first
time it is needed (snapshot_ort_kernels.installed_kernels, cached on disk per
onnxruntime build), so graphopt never promises a kernel the onnxruntime it runs with
lacks (1.32 dropped ReduceLogSum's integer kernels, for one); where the registry cannot
be read it falls back to the shipped snapshot (data/ort_cpu_kernels.json). The same
registry confirms the standard ops `--target onnx` lowers graphopt ops to (onnxruntime
1.32 has no kernel for Swish-24). The ort-cuda table lists the CUDA provider's contrib
kernels: the CUDA provider's registry cannot be read from a CPU-only build, so where
the installed build does not register that provider the shipped table is used
unconfirmed (`Target.confirmed` says which); it is checked on the GPU machine.
For standard ops ort-cuda reads the CUDA provider's whole table (data/ort_cuda_kernels.json,
read from onnxruntime-gpu's registry by benchmarks/snapshot_ort_cuda_kernels.sh, or the
installed build's where it registers the provider) only where a kernel's absence would
move work to the CPU: a float16/bfloat16 node whose op has a float32 CUDA kernel at the
model's opset but none in that type (Clip-11 is float only: `why_not` says so and the
precision conversion keeps it float32), and a standard op a rewrite would add that the
CUDA provider has no kernel for at all at that opset (Mish: `missing_kernel`). Ops the
provider lacks in every type (shape arithmetic onnxruntime runs on the CPU by design) are
not judged by it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import onnx

from graphopt.ops import registry
from graphopt.ops.opspec import GRAPHOPT_DOMAIN, MS_DOMAIN, Contract, Lowering

__all__ = ["Lowering", "Target", "TARGETS", "get_target", "KernelTable", "GRAPHOPT_DOMAIN", "MS_DOMAIN"]

_F = frozenset

class KernelTable(Mapping[tuple[str, str], frozenset[str]]):
    """(domain, op) -> dtypes of its newest kernel, and the opset ranges it has kernels
    for. Loaded on first use: from the installed onnxruntime's registry for `provider`,
    else from the shipped snapshot `fallback` (data/), else from `fixed`."""

    def __init__(self, provider: str, fallback: str | None = None, fixed: Mapping[tuple[str, str], frozenset[str]] | None = None) -> None:
        self.provider, self.fallback, self.fixed = provider, fallback, fixed
        self._kernels: dict[tuple[str, str], frozenset[str]] | None = None
        self._ranges: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {}
        #: (domain, op) -> ((first opset, last opset), element types) per kernel range, where the table records them.
        self._range_types: dict[tuple[str, str], tuple[tuple[int, int, frozenset[str]], ...]] = {}
        #: "onnxruntime X.Y.Z" when read from the installed build, else where the table came from.
        self.source = ""

    def _load(self) -> dict[tuple[str, str], frozenset[str]]:
        if self._kernels is None:
            from graphopt.ops.snapshot_ort_kernels import installed_kernels

            data = installed_kernels(self.provider) if os.environ.get("GRAPHOPT_ORT_REGISTRY", "1") != "0" else None
            if data is not None:
                self.source = f"onnxruntime {data.get('onnxruntime', '?')} ({self.provider}, read at run time)"
            elif self.fallback is not None:
                data = json.loads((Path(__file__).parent / "data" / self.fallback).read_text())
                self.source = f"shipped snapshot data/{self.fallback} (onnxruntime {data.get('onnxruntime', '?')}), unconfirmed"
            if data is None:
                self._kernels = dict(self.fixed or {})
                self.source = f"graphopt's own table of the {self.provider} kernels, unconfirmed (this onnxruntime build does not register {self.provider})"
            else:
                self._kernels = {_key(k): frozenset(v) for k, v in data["kernels"].items()}
                self._ranges = {_key(k): tuple((int(a), int(b)) for a, b in v) for k, v in data.get("ranges", {}).items()}
                self._range_types = {
                    _key(k): tuple((*_span(span), frozenset(types)) for span, types in v.items()) for k, v in data.get("range_types", {}).items()
                }
        return self._kernels

    def types_at(self, key: tuple[str, str], opset: int | None) -> frozenset[str] | None:
        """The element types of `key`'s kernel for `opset` (of the kernel range covering it;
        empty where no range covers it); None where the table does not record types per
        range (an older snapshot) or the opset is not known."""
        self._load()
        if not self._range_types or opset is None:
            return None
        return next((types for lo, hi, types in self._range_types.get(key, ()) if lo <= opset <= hi), frozenset())

    @property
    def confirmed(self) -> bool:
        """Whether the table was read from the installed onnxruntime."""
        self._load()
        return self.source.startswith("onnxruntime")

    def covers(self, key: tuple[str, str], opset: int | None) -> bool:
        """Whether `key` has a kernel at `opset` (True where the ranges are not known)."""
        self._load()
        spans = self._ranges.get(key)
        return spans is None or opset is None or any(a <= opset <= b for a, b in spans)

    def __getitem__(self, key: tuple[str, str]) -> frozenset[str]:
        return self._load()[key]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def _span(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi)


def _key(text: str) -> tuple[str, str]:
    domain, _, op = text.partition("::")
    return (domain, op)


# Every kernel of onnxruntime's CPU provider, standard ops included: a node the
# CPU provider has no kernel for makes the session fail to load.
_ORT_CPU = KernelTable("CPUExecutionProvider", fallback="ort_cpu_kernels.json")

# Every kernel of the CUDA provider, standard ops included (onnxruntime-gpu's registry; the
# shipped snapshot where this build cannot list it). Read by `Target.why_not` and
# `Target.missing_kernel` for standard ops only: the CUDA provider hands an op it lacks to
# the CPU provider, which is what they keep graphopt from causing.
_ORT_CUDA_ALL = KernelTable("CUDAExecutionProvider", fallback="ort_cuda_kernels.json")

# Contrib kernels of the CUDA provider (cuda_contrib_kernels.cc) graphopt emits.
_ORT_CUDA_KNOWN: dict[tuple[str, str], frozenset[str]] = {
    # contrib_ops/cuda/fused_conv.cc: float only; activation Relu only (see graphopt.FusedConv's contract).
    (MS_DOMAIN, "FusedConv"): _F({"f32"}),
    (MS_DOMAIN, "FusedMatMul"): _F({"f32", "f64", "f16", "bf16"}),
    (MS_DOMAIN, "Attention"): _F({"f32", "f16"}),
    (MS_DOMAIN, "MultiHeadAttention"): _F({"f32", "f16"}),
    (MS_DOMAIN, "GroupQueryAttention"): _F({"f16", "bf16"}),
    (MS_DOMAIN, "RotaryEmbedding"): _F({"f32", "f16", "bf16"}),
    (MS_DOMAIN, "SkipLayerNormalization"): _F({"f32", "f16"}),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): _F({"f32", "f16"}),
    (MS_DOMAIN, "BiasGelu"): _F({"f32", "f64", "f16", "bf16"}),
    (MS_DOMAIN, "FastGelu"): _F({"f32", "f16", "bf16"}),
    (MS_DOMAIN, "QuickGelu"): _F({"f32", "f64", "f16", "bf16"}),
    (MS_DOMAIN, "Gelu"): _F({"f32", "f64", "f16", "bf16"}),
    (MS_DOMAIN, "BiasSplitGelu"): _F({"f32", "f16"}),
    # contrib_ops/cuda/quantization/matmul_nbits.cc: weight-only int4/int8 (graphopt.passes.weight_quant).
    (MS_DOMAIN, "MatMulNBits"): _F({"f32", "f16", "bf16"}),
    # contrib_ops/cuda/diffusion/group_norm.cc: X float/float16 in NHWC (channels_last = 1 only),
    # gamma/beta float32 whatever X is; shape limits in graphopt.GroupNorm's contract (fused_ops.py).
    (MS_DOMAIN, "GroupNorm"): _F({"f32", "f16"}),
    # contrib_ops/cuda/diffusion/nhwc_conv.cc: cuda::Conv<T, NHWC=true> for float and float16;
    # X and Y are NHWC, W stays [M, C/group, kH, kW] (prepacked to NHWC when constant). Emitted
    # by the layout pass (graphopt/passes/layout.py), not by rules.
    (MS_DOMAIN, "NhwcConv"): _F({"f32", "f16"}),
    # core/providers/cuda/cuda_nhwc_kernels.cc (built with onnxruntime_USE_CUDA_NHWC_OPS): the
    # NHWC pools of the internal layout domain. Used by the layout pass only when asked
    # (LayoutOptions.internal_nhwc_pools): the domain is onnxruntime-internal.
    ("com.ms.internal.nhwc", "MaxPool"): _F({"f32", "f16"}),
    ("com.ms.internal.nhwc", "AveragePool"): _F({"f32", "f16"}),
    ("com.ms.internal.nhwc", "GlobalAveragePool"): _F({"f32", "f16"}),
    ("com.ms.internal.nhwc", "GlobalMaxPool"): _F({"f32", "f16"}),
    ("", "SimplifiedLayerNormalization"): _F({"f32", "f64", "f16", "bf16"}),
    # contrib_ops/cuda/layer_norm.cc: LayerNormalization in the default domain, opsets 1-16 (graphopt.LayerNorm).
    ("", "LayerNormalization"): _F({"f32", "f64", "f16", "bf16"}),
}


class _CudaKernels(KernelTable):
    """The CUDA contrib kernels graphopt emits: the entries of _ORT_CUDA_KNOWN, confirmed
    (and narrowed to their dtypes) by the installed build's registry where it registers the
    CUDA provider (onnxruntime-gpu); as written above where it does not (a CPU-only build:
    the shipped snapshot is of one onnxruntime version and does not confirm them)."""

    def __init__(self, whole: KernelTable, known: Mapping[tuple[str, str], frozenset[str]]) -> None:
        super().__init__(whole.provider, fixed=known)
        self.whole = whole

    def _load(self) -> dict[tuple[str, str], frozenset[str]]:
        if self._kernels is None:
            known = dict(self.fixed or {})
            live = self.whole._load()
            self.source, self._ranges = self.whole.source, self.whole._ranges
            if self.whole.confirmed:
                self._kernels = {k: v & live[k] for k, v in known.items() if k in live and v & live[k]}
            else:
                self._kernels = known
        return self._kernels


_ORT_CUDA = _CudaKernels(_ORT_CUDA_ALL, _ORT_CUDA_KNOWN)


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    kernels: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    #: graphopt op -> how this target runs it (from the op registry; the torch target's own).
    lowerings: Mapping[str, Lowering] = field(default_factory=dict)
    #: True when `kernels` lists every op the target runs (standard ops too).
    complete: bool = False
    #: Per-kernel checks of attributes and input shapes (see `Contract`; declared with the lowerings).
    contracts: Mapping[tuple[str, str], Contract] = field(default_factory=dict)
    #: For `onnx`: the runtime whose kernels confirm the standard ops graphopt's own ops
    #: are lowered to (the installed onnxruntime's CPU provider, what --verify runs on).
    runtime_check: KernelTable | None = None
    #: Ops the target has kernels for that run slower than the standard ops a rule would
    #: replace with them (measured; the registry's `slower_on_ort_cpu` fact): not emitted.
    slower_than_composed: frozenset[tuple[str, str]] = frozenset()
    #: For a target that runs standard ops it has no kernel for elsewhere (ort-cuda: on the CPU,
    #: with copies): its provider's whole kernel table, standard ops included, per opset range
    #: and type. Read for standard ops only (`why_not`'s 16-bit check, `missing_kernel`).
    standard_kernels: KernelTable | None = None
    #: Standard ops on the precision block list (graphopt.passes.precision_plan.DEFAULT_KEEP_FP32)
    #: whose 16-bit kernels on this target accumulate in float32, so the list's reason (sums in
    #: 16 bits) does not hold: they are converted like any op rather than wrapped in Casts.
    float32_accumulating: frozenset[str] = frozenset()

    def slower_kernel(self, domain: str, op_type: str) -> str | None:
        """None unless a rewrite emitting this op would run slower on the target than the ops it replaces."""
        key = self.lowered(domain, op_type)  # a graphopt op is judged by the kernel it lowers to
        if key not in self.slower_than_composed:
            return None
        return f"target {self.name} runs {_name(key)} slower than the ops it would replace (measured; graphopt/ops/standard_ops.py)"

    def missing_kernel(self, domain: str, op_type: str, opset: int | None) -> str | None:
        """None unless the op is a standard op the target's provider has no kernel for, in
        any type, at `opset` (it would run on another provider: ort-cuda has no Mish). Asked
        for ops a rewrite would add to the graph, not for the ones the model has."""
        key = self.lowered(domain, op_type)
        table = self.standard_kernels
        if table is None or key[0] not in ("", "ai.onnx") or key in self.kernels or opset is None:
            return None
        if key in table and table.covers(key, opset):
            return None
        return f"{_PROVIDER_WORDS.get(table.provider, table.provider)} has no {_name(key)} kernel at opset {opset}: it would run on the CPU (kernel table: {table.source})"

    def _no_16bit_kernel(self, key: tuple[str, str], dtype: str | None, opset: int | None) -> str | None:
        """Why a float16/bfloat16 node of this standard op would leave the target's provider:
        it has a float32 kernel at this opset and none in `dtype` (the CUDA provider's Clip-11
        is float only). Ops it lacks in every type are not judged here."""
        table = self.standard_kernels
        if table is None or dtype not in _TYPE_WORDS:
            return None
        types = table.types_at(key, opset)
        if not types or "f32" not in types or dtype in types:
            return None
        return (
            f"{_PROVIDER_WORDS.get(table.provider, table.provider)} has no {_TYPE_WORDS[dtype]} kernel for {_name(key)} at opset {opset} "
            f"(only {', '.join(sorted(types & _FLOATS))}; the node would run on the CPU)"
        )

    @property
    def confirmed(self) -> bool:
        """Whether the kernel table was read from the installed onnxruntime (not a shipped one)."""
        return not isinstance(self.kernels, KernelTable) or self.kernels.confirmed

    @property
    def kernel_source(self) -> str:
        """Where the kernel table came from (the installed onnxruntime, or a table shipped with graphopt)."""
        return self.kernels.source if isinstance(self.kernels, KernelTable) else "graphopt's own"

    def has_contract(self, domain: str, op_type: str) -> bool:
        """Whether the kernel this op runs on has a contract (`contract_problem` reads shapes only then)."""
        return self.lowered(domain, op_type) in self.contracts

    def contract_problem(self, domain: str, op_type: str, attrs: Mapping[str, Any], shapes: Sequence[Any]) -> str | None:
        """None if the kernel this op runs on accepts these attributes and input shapes (see `Contract`:
        None for an omitted input, UNKNOWN_SHAPE for a given one whose shape is not known)."""
        check = self.contracts.get(self.lowered(domain, op_type))
        return None if check is None else check(attrs, shapes)

    def lowering(self, op_type: str) -> Lowering | None:
        """How graphopt.<op_type> is lowered on this target, or None when it is not."""
        return self.lowerings.get(op_type)

    def lowered(self, domain: str, op_type: str) -> tuple[str, str]:
        """The op this target runs for (domain, op_type): graphopt ops map through the lowering table."""
        if domain == GRAPHOPT_DOMAIN:
            low = self.lowering(op_type)
            return low.key if low is not None else (domain, op_type)
        return (domain, op_type)

    def why_not(self, domain: str, op_type: str, dtype: str | None, opset: int | None) -> str | None:
        """None if the target can run this op for this dtype; else the reason it cannot."""
        lowered = domain == GRAPHOPT_DOMAIN
        if lowered:
            low = self.lowering(op_type)
            if low is None:
                return f"target {self.name} has no lowering for graphopt.{op_type}"
            domain, op_type = low.key
        key = (domain, op_type)
        if key in self.kernels:
            if dtype is not None and dtype not in self.kernels[key]:
                return f"target {self.name} has no {_name(key)} kernel for {dtype}"
            if domain in ("", "ai.onnx") and isinstance(self.kernels, KernelTable) and not self.kernels.covers(key, opset):
                return f"target {self.name} has no {_name(key)} kernel at opset {opset}"
            return None
        if domain in ("", "ai.onnx"):
            reason = self._no_16bit_kernel(key, dtype, opset)
            if reason is not None:
                return reason
        if lowered and self.runtime_check is not None and domain in ("", "ai.onnx") and _is_standard(op_type, opset or onnx.defs.onnx_opset_version()):
            # A standard op graphopt lowers its own op to: onnxruntime must run it (it has
            # no Swish-24 kernel in 1.32, and does not expand its function body either).
            runtime = self.runtime_check
            if key not in runtime or not runtime.covers(key, opset) or (dtype is not None and dtype not in runtime[key]):
                return f"the installed onnxruntime has no {_name(key)} kernel{f' for {dtype}' if dtype else ''}{f' at opset {opset}' if opset else ''}"
        if self.complete:
            return f"target {self.name} has no kernel for {_name(key)}"
        if domain in ("", "ai.onnx"):
            version = opset or onnx.defs.onnx_opset_version()
            if _is_standard(op_type, version):
                return None
            return f"target {self.name} cannot run {_name(key)}: the model's opset {version} does not define it"
        return f"target {self.name} cannot run {_name(key)}"


@lru_cache(maxsize=1024)
def _is_standard(op_type: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    return True


_TYPE_WORDS = {"f16": "float16", "bf16": "bfloat16"}
_FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
_PROVIDER_WORDS = {"CUDAExecutionProvider": "onnxruntime's CUDA provider", "CPUExecutionProvider": "onnxruntime's CPU provider"}


def _name(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}" if key[0] else key[1]


TARGETS: dict[str, Target] = {
    "onnx": Target("onnx", "standard ONNX ops only; runs in any runtime", lowerings=registry.lowerings_for("onnx"), runtime_check=_ORT_CPU),
    "ort-cpu": Target(
        "ort-cpu", "onnxruntime, CPU execution provider", _ORT_CPU, registry.lowerings_for("ort-cpu"), complete=True, contracts=registry.contracts_for("ort-cpu"),
        slower_than_composed=registry.ops_with("slower_on_ort_cpu"),
    ),
    "ort-cuda": Target(
        "ort-cuda", "onnxruntime, CUDA execution provider", _ORT_CUDA, registry.lowerings_for("ort-cuda"), contracts=registry.contracts_for("ort-cuda"),
        standard_kernels=_ORT_CUDA_ALL,
        # core/providers/cuda/math/softmax.h: AccumulateType<MLFloat16> is float (the warp- and
        # block-wise softmax kernels reduce in it). A Softmax read from an fp16 MatMul kept in
        # float32 cost two Casts per attention (tf-transformer: 4 of its 10 Casts in fp16).
        float32_accumulating=frozenset({"Softmax", "LogSoftmax"}),
    ),
}


def get_target(name: str) -> Target:
    from graphopt.errors import GraphoptError

    try:
        return TARGETS[name]
    except KeyError:
        raise GraphoptError(f"unknown target '{name}' (known: {', '.join(TARGETS)})") from None
