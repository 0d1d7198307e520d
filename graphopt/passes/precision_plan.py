"""What a precision conversion keeps in float32: the plan, and the op tables it reads.

A `PrecisionPlan` is the conversion asked for (`--precision fp16|bf16`, `--keep-fp32`, and
the nodes the range check keeps); it answers, for one op, whether it will run in the low
type on a target: the default block list (`DEFAULT_KEEP_FP32`), ops whose output type an
attribute sets, the target's capability table and the standard op schemas. The rewrite
driver asks it while the rules run (so no fused op is emitted that the target cannot run
in the type it will have), and the conversion pass (graphopt.passes.precision) asks it
node by node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import onnx
import onnx_ir as ir

from graphopt.errors import GraphoptError
from graphopt.ops.registry import has_fact, names_with
from graphopt.ops.targets import Target
from graphopt.passes._common import ONNX_DOMAINS

__all__ = ["PRECISIONS", "DEFAULT_KEEP_FP32", "PrecisionPlan", "default_blocked", "parse_precision"]

#: Accepted values of `--precision`; "fp32" (or None) leaves the model's precision alone.
PRECISIONS = ("fp32", "fp16", "bf16")

_LOW: dict[str, tuple[str, ir.DataType, str]] = {
    "fp16": ("f16", ir.DataType.FLOAT16, "tensor(float16)"),
    "bf16": ("bf16", ir.DataType.BFLOAT16, "tensor(bfloat16)"),
}

#: Op types (standard domain) kept in float32 unless the user says otherwise: the
#: registry's fact `keep_fp32` (graphopt/ops/standard_ops.py says which and why). The
#: other op classes this pass reads are facts there too: `attribute_typed` (an attribute
#: sets the float output type), `follows_inputs` (elementwise and layout ops that stay
#: float32 when their float inputs are), `heavy` (their precision decides a fusion's
#: worth), and `fp32_outputs` (statistics outputs that stay float32).
DEFAULT_KEEP_FP32: frozenset[str] = names_with("keep_fp32")


def _is_heavy(domain: str, op_type: str) -> bool:
    # ops outside the standard domain (fused ops) count as heavy too
    return has_fact(domain, op_type, "heavy") or domain not in ONNX_DOMAINS


def parse_precision(name: str | None) -> str | None:
    """"fp16" / "bf16" (case-insensitive), or None for "fp32" / None; else a GraphoptError."""
    if name is None:
        return None
    key = str(name).strip().lower()
    if key not in PRECISIONS:
        raise GraphoptError(f"unknown precision '{name}' (known: {', '.join(PRECISIONS)})")
    return None if key == "fp32" else key


@lru_cache(maxsize=2048)
def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


@lru_cache(maxsize=2048)
def _schema_takes(op_type: str, opset: int, low_type: str) -> bool:
    """Does the standard op take the low type for some type parameter that takes float32?"""
    schema = _schema(op_type, opset)
    if schema is None:
        return True  # not a standard op (e.g. SimplifiedLayerNormalization): the target table decides
    return any("tensor(float)" in c.allowed_type_strs and low_type in c.allowed_type_strs for c in schema.type_constraints)


def default_blocked(domain: str, op_type: str, target: Target | None) -> bool:
    """On the default block list, and not an op whose 16-bit kernel on `target` accumulates in float32."""
    if domain not in ONNX_DOMAINS or op_type not in DEFAULT_KEEP_FP32:
        return False
    return target is None or op_type not in target.float32_accumulating


@dataclass(frozen=True)
class PrecisionPlan:
    """The conversion asked for: the low type and what stays float32.

    The rewrite driver consults it while rules run (in float32) so that a rule does
    not emit a fused op the target cannot run in the type it will have afterwards."""

    precision: str  # "fp16" or "bf16"
    #: The user's additions to the block list: op types ("Gemm", "com.microsoft.Gelu"), node or output names.
    keep: frozenset[str] = frozenset()
    #: Node or output names the range check keeps in float32 (`range_checked_plan`).
    range_keep: frozenset[str] = frozenset()
    #: Keep the 2-D convolutions and the CNN region around them in float32: the precision
    #: decision found the low type slower for them (graphopt.passes.precision_decision).
    fp32_convs: bool = False
    #: Keep the recurrent ops (LSTM, GRU, RNN) and the light ops around them in float32: the
    #: recurrent precision decision found the low type slower (graphopt.passes.precision_recurrent).
    fp32_recurrent: bool = False

    @classmethod
    def make(cls, precision: str | None, keep: Iterable[str] = ()) -> PrecisionPlan | None:
        parsed = parse_precision(precision)
        return None if parsed is None else cls(parsed, frozenset(k for k in keep if k))

    @property
    def low(self) -> str:
        """The low type's short name: f16 or bf16."""
        return _LOW[self.precision][0]

    @property
    def low_type(self) -> ir.DataType:
        return _LOW[self.precision][1]

    def blocks_op(self, domain: str, op_type: str, target: Target | None = None) -> bool:
        """Is the op on the block list (the default one, or the user's, by any of its names)?"""
        if default_blocked(domain, op_type, target):
            return True
        return bool(self.keep and _op_names(domain, op_type, target) & self.keep)

    def cannot_run_low(self, target: Target, domain: str, op_type: str, opset: int | None) -> str | None:
        """Why the target cannot run this op in the low type (None if it can)."""
        if has_fact(domain, op_type, "attribute_typed"):
            return f"{op_type}'s output type is set by an attribute"
        reason = target.why_not(domain, op_type, self.low, opset)
        if reason is not None:
            return reason
        lowered_domain, lowered_op = target.lowered(domain, op_type)
        if lowered_domain in ONNX_DOMAINS and not _schema_takes(lowered_op, opset or onnx.defs.onnx_opset_version(), _LOW[self.precision][2]):
            return f"{lowered_op} does not take {self.low} at opset {opset}"
        return None

    def runs_low(self, target: Target, domain: str, op_type: str, dtype: str | None, opset: int | None) -> bool:
        """Would a node of this op, reading `dtype`, run in the low type after conversion?"""
        return dtype == "f32" and not self.blocks_op(domain, op_type, target) and self.cannot_run_low(target, domain, op_type, opset) is None

    def fusion_problem(
        self,
        target: Target,
        domain: str,
        op_type: str,
        dtype: str | None,
        opset: int | None,
        matched: Sequence[tuple[str, str, str | None]],
    ) -> str | None:
        """The driver's capability check for a node a rewrite would emit, in the type it
        will run in after conversion. `matched` lists (domain, op, dtype) of the nodes the
        rewrite replaces: a fused op the target has only in float32 is refused when it
        would pull the heavy ops it replaces (fact `heavy`: Conv, MatMul, normalizations,
        fused ops), which could run in the low type, back to float32. Activations,
        elementwise and layout ops do not count: Conv+BatchNormalization folded into a
        Conv that stays float32 is still a gain."""
        if self.runs_low(target, domain, op_type, dtype, opset):
            return None  # its low-type kernel exists (checked by runs_low)
        if dtype == "f32" and not self.blocks_op(domain, op_type, target):
            why = self.cannot_run_low(target, domain, op_type, opset)
            if any(_is_heavy(d, o) and self.runs_low(target, d, o, t, opset) for d, o, t in matched):
                return f"{why}: with --precision {self.precision} it would keep in f32 ops that run in {self.low}"
        return target.why_not(domain, op_type, dtype, opset)


def _formal(formals: Sequence[Any], i: int) -> Any:
    if i < len(formals):
        return formals[i]
    if formals and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return formals[-1]
    return None


def _op_names(domain: str, op_type: str, target: Target | None) -> set[str]:
    """The names a user may give an op by: "Gelu", "graphopt.Gelu", "com.microsoft.Gelu"."""
    domain = "" if domain == "ai.onnx" else domain
    names = {op_type, f"{domain}.{op_type}" if domain else op_type}
    if target is not None and domain:
        lowered_domain, lowered_op = target.lowered(domain, op_type)
        names |= {lowered_op, f"{lowered_domain}.{lowered_op}" if lowered_domain else lowered_op}
    return names

