"""Builders of written-out LayerNorm / RMSNorm in every form the exporters produce (onnx.helper),
for tests/test_rules_norm_forms.py. Each piece is chosen independently:

* mean (`mean`): ReduceMean (axes an attribute before opset 18, an input from 18), ReduceSum
  times 1/N ("sum_mul") or divided by N ("sum_div"), GlobalAveragePool ("pool");
* variance (`var`): "central_pow" / "central_mul" (mean of (x - mean)^2), "second_mul" /
  "second_pow" (mean of x^2 minus mean^2);
* clamp (`clamp`): none, "max", "clip" (min 0, no max), "relu"; epsilon added after it, or
  before it (`eps_first`);
* inverse (`inv`): "div" (Div by Sqrt), "recip" (Reciprocal(Sqrt)), "div1" (Div(1, Sqrt)),
  "pow" (Pow(v + eps, -0.5));
* output (`out`): "affine" ((x - mean) * inv * gamma + beta), "keras" (x * a + (beta - mean * a),
  a = inv * gamma; `gamma` / `beta` False drop them), with `gamma_shape` [H] or [1, 1, H].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from rule_testing import TensorProto, helper, init, make_model, rand

F = TensorProto.FLOAT
H = 8


@dataclass
class Form:
    mean: str = "reduce"
    var: str = "central_pow"
    clamp: str | None = None
    eps_first: bool = False
    inv: str = "div"
    out: str = "affine"
    gamma: bool = True
    beta: bool = True
    gamma_shape: tuple[int, ...] = (H,)
    opset: int = 18
    rank: int = 3
    # negative cases
    axis: int = -1
    eps2: float | None = None  # keras: a second inverse chain (for mean * a) with this epsilon
    other_mean: bool = False  # the centered value subtracts the mean of another input
    sum_factor: float | None = None
    clip_high: float | None = None
    clamp_at: float = 0.0
    exponent: float = -0.5


class _Builder:
    def __init__(self, form: Form) -> None:
        self.form, self.nodes, self.inits, self.n = form, [], [], 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}{self.n}"

    def const(self, value, hint: str = "c", dtype=np.float32) -> str:
        name = self.name(hint)
        self.inits.append(init(name, np.asarray(value, dtype)))
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def mean(self, v: str) -> str:
        f = self.form
        if f.mean == "pool":
            return self.op("GlobalAveragePool", v)
        reduce_op = "ReduceMean" if f.mean == "reduce" else "ReduceSum"
        axes_input = f.opset >= (18 if reduce_op == "ReduceMean" else 13)
        if axes_input:
            r = self.op(reduce_op, v, self.const([f.axis], "axes", np.int64), keepdims=1)
        else:
            r = self.op(reduce_op, v, axes=[f.axis], keepdims=1)
        if f.mean == "sum_mul":
            return self.op("Mul", r, self.const(f.sum_factor if f.sum_factor is not None else 1.0 / H, "k"))
        if f.mean == "sum_div":
            return self.op("Div", r, self.const(f.sum_factor if f.sum_factor is not None else float(H), "n"))
        return r

    def inverse_std(self, var: str, eps: float) -> tuple[str, str | None]:
        """(the inverse, or the Sqrt for "div"; the form), clamp and epsilon in the asked order."""
        f = self.form

        def clamp(v: str) -> str:
            if f.clamp == "max":
                return self.op("Max", v, self.const(f.clamp_at, "zero"))
            if f.clamp == "clip":
                hi = [self.const(f.clip_high, "hi")] if f.clip_high is not None else []
                return self.op("Clip", v, self.const(f.clamp_at, "zero"), *hi)
            if f.clamp == "relu":
                return self.op("Relu", v)
            return v

        e = self.const(eps, "eps")
        veps = clamp(self.op("Add", var, e)) if f.eps_first else self.op("Add", clamp(var), e)
        if f.inv == "pow":
            return self.op("Pow", veps, self.const(f.exponent, "e")), "inv"
        std = self.op("Sqrt", veps)
        if f.inv == "div":
            return std, "std"
        if f.inv == "recip":
            return self.op("Reciprocal", std), "inv"
        return self.op("Div", self.const(1.0, "one"), std), "inv"


def layer_norm(form: Form) -> onnx.ModelProto:
    """x [N, 5, H] (or [N, 5, 2, H] at rank 4) -> the written-out LayerNorm of `form`."""
    f, b = form, _Builder(form)
    mean = b.mean("x")
    needs_centered = f.var.startswith("central") or f.out == "affine"
    centered = b.op("Sub", "x", b.mean("y") if f.other_mean else mean) if needs_centered else ""
    if f.var.startswith("central"):
        sq = b.op("Pow", centered, b.const(2.0, "two")) if f.var == "central_pow" else b.op("Mul", centered, centered)
        var = b.mean(sq)
    else:
        sq = b.op("Mul", "x", "x") if f.var == "second_mul" else b.op("Pow", "x", b.const(2.0, "two"))
        var = b.op("Sub", b.mean(sq), b.op("Mul", mean, mean))
    inv, kind = b.inverse_std(var, 1e-5)
    gamma = b.const(rand(*f.gamma_shape), "gamma") if f.gamma else None
    beta = b.const(rand(*f.gamma_shape), "beta") if f.beta else None
    if f.out == "affine":
        norm = b.op("Div", centered, inv) if kind == "std" else b.op("Mul", centered, inv)
        y = b.op("Mul", norm, gamma) if gamma else norm
        y = b.op("Add", y, beta) if beta else y
    else:
        a = b.op("Mul", inv, gamma) if gamma else inv
        a2 = a
        if f.eps2 is not None:  # the shift's own inverse, with another epsilon
            inv2, _ = b.inverse_std(var, f.eps2)
            a2 = b.op("Mul", inv2, gamma) if gamma else inv2
        xa = b.op("Mul", "x", a)
        shift = b.op("Mul", b.op("Neg", mean), a2)
        y = b.op("Add", xa, b.op("Add", shift, beta) if beta else shift)
    dims = ["N", 5, H] if f.rank == 3 else ["N", 5, 2, H]
    inputs = [helper.make_tensor_value_info("x", F, dims)]
    if f.other_mean:
        inputs.append(helper.make_tensor_value_info("y", F, dims))
    model = make_model(b.nodes, inputs, [helper.make_tensor_value_info(y, F, None)], b.inits, opset=f.opset)
    if f.opset >= 23:
        model.ir_version = 11
    return model


def rms_norm(square: str = "pow", mean: str = "reduce", inv: str = "recip", weight: str = "after", opset: int = 18,
             exponent: float = -0.5, axis: int = -1) -> onnx.ModelProto:
    """x -> mean(x^2) + eps -> inverse sqrt -> x * inverse * weight; `weight` "after" ((x * inv) * w)
    or "inside" (x * (inv * w), Keras); `inv` as in Form, "div" being x / Sqrt."""
    b = _Builder(Form(mean=mean, inv=inv, opset=opset, exponent=exponent, axis=axis))
    sq = b.op("Pow", "x", b.const(2.0, "two")) if square == "pow" else b.op("Mul", "x", "x")
    inverse, kind = b.inverse_std(b.mean(sq), 1e-6)
    w = b.const(rand(H, positive=True), "w")
    if weight == "inside":
        y = b.op("Mul", "x", b.op("Mul", inverse, w))
    else:
        norm = b.op("Div", "x", inverse) if kind == "std" else b.op("Mul", "x", inverse)
        y = b.op("Mul", norm, w)
    model = make_model(b.nodes, [helper.make_tensor_value_info("x", F, ["N", 5, H])], [helper.make_tensor_value_info(y, F, None)],
                       b.inits, opset=opset)
    if opset >= 23:
        model.ir_version = 11
    return model
