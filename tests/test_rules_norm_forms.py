"""Every exporter's form of LayerNorm and RMSNorm (tests/norm_forms.py) fuses, one rule of the
family each; look-alikes (another axis, another epsilon, the mean of another tensor, a wrong
constant) do not. Golden: rewrite count, the one node left, outputs equal (onnxruntime)."""

from __future__ import annotations

import pytest
from norm_forms import Form, layer_norm, rms_norm
from rule_testing import assert_same_outputs, op_types, optimize_with, rewrites

LN_RULES = ["FuseLayerNorm", "FuseLayerNormSecondMoment", "FuseLayerNormMoments"]


def _rule_for(form: Form) -> str:
    if form.out == "keras":
        return "FuseLayerNormMoments"
    return "FuseLayerNorm" if form.var.startswith("central") else "FuseLayerNormSecondMoment"


LN_FORMS = {
    # the mean
    "reduce-attr-op17": Form(opset=17),
    "reduce-input-op18": Form(),
    "sum-mul-op13-attr": Form(mean="sum_mul", opset=17),
    "sum-div": Form(mean="sum_div"),
    "pool": Form(mean="pool"),
    # the variance
    "central-mul": Form(var="central_mul"),
    "second-mul": Form(var="second_mul"),
    "second-pow-sum": Form(var="second_pow", mean="sum_mul"),
    # the clamp, epsilon after or before it
    "max": Form(var="second_mul", clamp="max"),
    "clip": Form(var="second_mul", clamp="clip"),
    "relu": Form(var="second_mul", clamp="relu"),
    "max-eps-first": Form(var="second_mul", clamp="max", eps_first=True),
    "clip-eps-first": Form(var="second_mul", clamp="clip", eps_first=True),
    "relu-eps-first": Form(var="central_mul", clamp="relu", eps_first=True),
    # the inverse standard deviation
    "recip": Form(inv="recip"),
    "div1": Form(inv="div1"),
    "pow": Form(inv="pow", var="second_mul", clamp="max"),
    # Keras / tf2onnx: x * a + (beta - mean * a)
    "keras": Form(out="keras", mean="pool", var="central_mul", inv="recip", gamma_shape=(1, 1, 8)),
    "keras-no-center": Form(out="keras", mean="pool", var="central_mul", inv="recip", beta=False, gamma_shape=(1, 1, 8)),
    "keras-no-scale": Form(out="keras", mean="pool", var="central_mul", inv="recip", gamma=False),
    "keras-plain": Form(out="keras", mean="pool", var="central_mul", inv="recip", gamma=False, beta=False),
    "keras-second-moment": Form(out="keras", var="second_mul", clamp="max", inv="pow"),
    "keras-opset23": Form(out="keras", mean="pool", var="central_mul", inv="div1", opset=23),
}


@pytest.mark.parametrize("target", ["onnx", "ort-cuda"])
@pytest.mark.parametrize("name", sorted(LN_FORMS))
def test_layer_norm_form_fuses(name: str, target: str) -> None:
    form = LN_FORMS[name]
    model = layer_norm(form)
    optimized, report = optimize_with(model, LN_RULES, target=target)
    rule = _rule_for(form)
    assert {r: rewrites(report, r) for r in LN_RULES} == {r: int(r == rule) for r in LN_RULES}
    assert op_types(optimized) == ["LayerNormalization"]
    ln = optimized.graph.node[0]
    assert len(ln.input) == (3 if form.beta else 2)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


LN_LOOK_ALIKES = {
    "another-axis": (Form(axis=1), "not only the last one"),
    "another-axis-keras": (Form(out="keras", axis=1, inv="recip"), "not only the last one"),
    "pool-of-rank-4": (Form(mean="pool", rank=4), "averages more than the last axis"),
    "sum-times-wrong-factor": (Form(mean="sum_mul", sum_factor=0.1), "not by 0.125"),
    "sum-divided-by-wrong-n": (Form(mean="sum_div", sum_factor=4.0), "not by 8"),
    "clamped-at-one": (Form(var="second_mul", clamp="max", clamp_at=1.0), "clamps at 1, not 0"),
    "clip-with-upper-bound": (Form(var="second_mul", clamp="clip", clip_high=10.0), "upper bound"),
    "pow-minus-one": (Form(inv="pow", exponent=-1.0), "not -0.5"),
    "mean-of-another-tensor": (Form(other_mean=True, var="second_mul"), None),
    "keras-mismatched-epsilons": (Form(out="keras", mean="pool", var="central_mul", inv="recip", eps2=1e-3), None),
}


@pytest.mark.parametrize("name", sorted(LN_LOOK_ALIKES))
def test_layer_norm_look_alike_does_not_fuse(name: str) -> None:
    form, reason = LN_LOOK_ALIKES[name]
    model = layer_norm(form)
    optimized, report = optimize_with(model, LN_RULES, target="ort-cuda")
    assert sum(rewrites(report, r) for r in LN_RULES) == 0
    assert "LayerNormalization" not in op_types(optimized)
    assert len(optimized.graph.node) == len(model.graph.node)
    if reason is not None:
        reasons = [m.reason for r in LN_RULES for m in report.rules[r].near_misses]
        assert any(reason in text for text in reasons), reasons


def test_keras_layer_norm_below_opset_17_does_not_fuse() -> None:
    model = layer_norm(Form(out="keras", mean="pool", var="central_mul", inv="recip", opset=13))
    optimized, report = optimize_with(model, LN_RULES, target="onnx")
    assert rewrites(report, "FuseLayerNormMoments") == 0 and "LayerNormalization" not in op_types(optimized)


RMS_FORMS = {
    "pow-recip": {},
    "mul-recip": {"square": "mul"},
    "mul-div-pool": {"square": "mul", "inv": "div", "mean": "pool"},  # jax2onnx's nnx.RMSNorm, pooled
    "pow-div1-op13-attr": {"inv": "div1", "opset": 13},
    "sum-div": {"mean": "sum_div"},
    "pow-minus-half": {"inv": "pow"},
    "keras-inside": {"square": "mul", "mean": "pool", "weight": "inside"},  # tf2onnx's keras RMSNormalization
    "keras-inside-pow": {"square": "mul", "inv": "pow", "weight": "inside"},
}


@pytest.mark.parametrize("target", ["ort-cpu", "onnx"])
@pytest.mark.parametrize("name", sorted(RMS_FORMS))
def test_rms_norm_form_fuses(name: str, target: str) -> None:
    kwargs = dict(RMS_FORMS[name])
    if target == "onnx":  # plain ONNX has RMSNormalization from opset 23
        kwargs["opset"] = 23
    model = rms_norm(**kwargs)
    optimized, report = optimize_with(model, ["FuseRMSNorm"], target=target)
    assert rewrites(report, "FuseRMSNorm") == 1
    assert op_types(optimized) == ["SimplifiedLayerNormalization" if target == "ort-cpu" else "RMSNormalization"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kwargs, reason", [
    ({"axis": 1}, "not only the last one"),
    ({"inv": "pow", "exponent": 0.5}, "not -0.5"),
    ({"mean": "sum_mul", "axis": 1}, "not only the last one"),
], ids=["another-axis", "pow-plus-half", "sum-over-another-axis"])
def test_rms_norm_look_alike_does_not_fuse(kwargs: dict, reason: str) -> None:
    model = rms_norm(**kwargs)
    optimized, report = optimize_with(model, ["FuseRMSNorm"], target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 0
    assert len(optimized.graph.node) == len(model.graph.node)
    assert any(reason in m.reason for m in report.rules["FuseRMSNorm"].near_misses), [m.reason for m in report.rules["FuseRMSNorm"].near_misses]
