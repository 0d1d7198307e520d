"""graphopt ops as ATen ops only: the forms the torch backend lowers a fused op to where no
custom op may run.

With inductor and no CUDA graphs (kernels="none", the default mode) a ``torch.ops.graphopt``
custom op costs more than it saves: its Python dispatch per call, and it is a fusion
barrier for inductor. The rewrites that find a LLaMA block's parts still pay there when
what they leave is the canonical ATen form inductor fuses best: one pointwise expression
for a rotary embedding on caches folded at compile time, RMSNorm as one fp32 reduction,
SwiGLU as silu(gate) * up, GatedGelu as gelu(gate) * up. Each form here is attached to its op's `GraphoptLowering.aten`;
`torch_lowering.torch_target(kernels="none")` offers exactly the ops that have one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from graphopt.ops import registry
from graphopt.ops.fx_builder import FxBuilder
from graphopt.ops.torch_fused import GRAPHOPT, LoweringFn, norm_stats, rotary_with
from graphopt.pattern.native import RewriteDeclined

__all__ = ["ATEN_FORMS"]

aten = torch.ops.aten
prims = torch.ops.prims


def _cast(b: FxBuilder, x: Any, dtype: torch.dtype) -> Any:
    return x if b.meta(x).dtype == dtype else b.call(prims.convert_element_type.default, x, dtype)


def _rotate(b: FxBuilder, x: Any, cos: Any, sin: Any, interleaved: bool) -> Any:
    """x * cos + rotate(x) * sin on the first `rotary` features of x [batch, heads, seq, head]
    (cos, sin [batch or 1, seq, rotary]), the rest passed through: graphopt::rotary's meaning."""
    rot, head = b.size(cos, -1), b.size(x, -1)
    if not isinstance(rot, int) or rot % 2:
        raise RewriteDeclined(f"a rotary width {rot} that does not halve")
    dtype = b.meta(x).dtype
    cos, sin = (b.call(aten.unsqueeze.default, _cast(b, c, dtype), 1) for c in (cos, sin))
    xr = x if rot == head else b.call(aten.slice.Tensor, x, -1, 0, rot)
    if interleaved:
        odd, even = b.call(aten.slice.Tensor, xr, -1, 1, rot, 2), b.call(aten.slice.Tensor, xr, -1, 0, rot, 2)
        pairs = b.call(aten.stack.default, [b.call(aten.neg.default, odd), even], -1)
        rotated = b.call(aten.flatten.using_ints, pairs, -2, -1)
    else:
        half = rot // 2
        first, second = b.call(aten.slice.Tensor, xr, -1, 0, half), b.call(aten.slice.Tensor, xr, -1, half, rot)
        rotated = b.call(aten.cat.default, [b.call(aten.neg.default, second), first], -1)
    out = b.call(aten.add.Tensor, b.call(aten.mul.Tensor, xr, cos), b.call(aten.mul.Tensor, rotated, sin))
    if rot == head:
        return out
    return b.call(aten.cat.default, [out, b.call(aten.slice.Tensor, x, -1, rot, head)], -1)


def _rotary(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return rotary_with(b, args, attrs, _rotate)


def _rms(b: FxBuilder, x: Any, weight: Any, eps: float) -> Any:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis in fp32 (one reduction), back in x's dtype."""
    xf = _cast(b, x, torch.float32)
    var = b.call(aten.mean.dim, b.call(aten.mul.Tensor, xf, xf), [-1], True)
    normed = b.call(aten.mul.Tensor, xf, b.call(aten.rsqrt.default, b.call(aten.add.Tensor, var, eps)))
    return _cast(b, b.call(aten.mul.Tensor, normed, _cast(b, weight, torch.float32)), b.meta(x).dtype)


def _last_axis(b: FxBuilder, x: Any, attrs: dict[str, Any]) -> None:
    axis = int(attrs.get("axis", -1))
    if axis not in (-1, b.rank(x) - 1):
        raise RewriteDeclined(f"the ATen RMSNorm normalizes the last axis, not {axis}")


def _rms_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    x, weight = b.tensor(args[0]), b.tensor(args[1])
    _last_axis(b, x, attrs)
    return [_rms(b, x, weight, float(attrs.get("epsilon", 1e-5)))]


def _skip_rms_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    a, skip, gamma = (b.tensor(x) for x in args[:3])
    eps = float(attrs.get("epsilon", 1e-5))
    total = b.call(aten.add.Tensor, a, skip)
    outputs: list[Any] = [_rms(b, total, gamma, eps), None, None, total]
    if wanted & {1, 2}:
        mean, var = norm_stats(b, total, rms=True)
        outputs[1] = mean
        outputs[2] = b.call(aten.rsqrt.default, b.call(aten.add.Tensor, var, eps))
    return outputs


def _swiglu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    gate, up = b.tensor(args[0]), b.tensor(args[1])
    return [b.call(aten.mul.Tensor, b.call(aten.silu.default, gate), up)]


def _gated_gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    gate, up = b.tensor(args[0]), b.tensor(args[1])
    return [b.call(aten.mul.Tensor, b.call(aten.gelu.default, gate, approximate=str(attrs.get("approximate", "none"))), up)]


#: graphopt op -> its ATen-only form. Ops left out have none on purpose: their fusion is
#: found on an op dynamo's graph already has (FuseSkipLayerNorm on aten.layer_norm,
#: FuseScaledDotProductAttention on SDPA), and its ATen form would be that op again: a
#: rewrite that gives inductor nothing, and hands it graphopt's traced copy instead of
#: dynamo's graph. (SkipRMSNorm is reached only from an RMSNorm graphopt fused.)
ATEN_FORMS: dict[str, LoweringFn] = {
    "RotaryEmbedding": _rotary,
    "RMSNorm": _rms_norm,
    "SkipRMSNorm": _skip_rms_norm,
    "SwiGLU": _swiglu,
    "GatedGelu": _gated_gelu,
}

for _op, _form in ATEN_FORMS.items():
    registry.register_torch_lowering(_op, replace(GRAPHOPT[_op], aten=_form))
