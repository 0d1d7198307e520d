"""Every exporter's form of LayerNorm and RMSNorm (tests/norm_forms.py) fuses, one rule of the
family each; look-alikes (another axis, another epsilon, the mean of another tensor, a wrong
constant) do not. Golden: rewrite count, the one node left, outputs equal (onnxruntime)."""

from __future__ import annotations

import pytest
from norm_forms import Form, layer_norm, rms_norm
from rule_testing import assert_same_outputs, op_types, optimize_with, rewrites

LN_RULES = ["FuseLayerNorm", "FuseLayerNormSecondMoment", "FuseLayerNormMoments", "FuseLayerNormUnscaled", "FoldScaleIntoLayerNorm",
            "FoldBiasIntoLayerNorm"]


def _expected(form: Form) -> dict[str, int]:
    """The rewrites per rule: one fused rule, and for a LayerNorm written without gamma or beta, the fold of the one it has."""
    if form.out == "keras":
        return {"FuseLayerNormMoments": 1}
    if form.gamma and form.beta:
        return {"FuseLayerNorm" if form.var.startswith("central") else "FuseLayerNormSecondMoment": 1}
    folds = {"FoldScaleIntoLayerNorm": int(form.gamma), "FoldBiasIntoLayerNorm": int(form.beta)}
    return {"FuseLayerNormUnscaled": 1, **{k: v for k, v in folds.items() if v}}


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
    # no gamma, no beta, or only one of them
    "plain": Form(gamma=False, beta=False),
    "plain-second-moment-pow": Form(var="second_mul", clamp="max", inv="pow", gamma=False, beta=False),
    "plain-pool-recip": Form(mean="pool", var="central_mul", inv="recip", gamma=False, beta=False),
    "scale-only": Form(beta=False),
    "scale-only-second-moment": Form(var="second_mul", clamp="relu", inv="recip", beta=False),
    "bias-only": Form(gamma=False),
    "bias-only-sum-div1": Form(mean="sum_div", inv="div1", gamma=False),
}


@pytest.mark.parametrize("target", ["onnx", "ort-cuda"])
@pytest.mark.parametrize("name", sorted(LN_FORMS))
def test_layer_norm_form_fuses(name: str, target: str) -> None:
    form = LN_FORMS[name]
    model = layer_norm(form)
    optimized, report = optimize_with(model, LN_RULES, target=target)
    expected = _expected(form)
    assert {r: rewrites(report, r) for r in LN_RULES} == {r: expected.get(r, 0) for r in LN_RULES}
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


def test_unscaled_layer_norm_times_a_per_token_tensor_keeps_the_mul() -> None:
    """gamma of shape [N, 5, 1] is not a per-feature scale: LayerNormalization(x, ones) * it."""
    import numpy as np
    from rule_testing import helper, init

    model = layer_norm(Form(gamma=False, beta=False))
    y = model.graph.output[0].name
    model.graph.node.append(helper.make_node("Mul", [y, "per_token"], ["scaled"]))
    model.graph.initializer.append(init("per_token", np.full((1, 5, 1), 2.0, np.float32)))
    model.graph.output[0].name = "scaled"
    optimized, report = optimize_with(model, LN_RULES, target="onnx")
    assert rewrites(report, "FuseLayerNormUnscaled") == 1 and rewrites(report, "FoldScaleIntoLayerNorm") == 0
    assert op_types(optimized) == ["LayerNormalization", "Mul"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_keras_layer_norm_below_opset_17_fuses_only_where_onnxruntime_runs_it() -> None:
    """tf2onnx's default opset is below 17: plain ONNX has no LayerNormalization there, onnxruntime does."""
    model = layer_norm(Form(out="keras", mean="pool", var="central_mul", inv="recip", opset=13))
    optimized, report = optimize_with(model, LN_RULES, target="onnx")
    assert rewrites(report, "FuseLayerNormMoments") == 0 and "LayerNormalization" not in op_types(optimized)
    optimized, report = optimize_with(model, LN_RULES, target="ort-cpu")
    assert rewrites(report, "FuseLayerNormMoments") == 1 and op_types(optimized) == ["LayerNormalization"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


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


@pytest.mark.parametrize("mean", ["reduce", "sum_div"])
def test_layer_norm_below_opset_17_is_not_cut_into_an_rms_norm(mean: str) -> None:
    """(x - mean) / sqrt(mean((x - mean)^2) + eps) * gamma is an RMSNorm of x - mean; fused as one it
    kept the LayerNorm from fusing whole (graphopt's own rules, or onnxruntime's fusion): 4 kernels
    instead of 1. FuseRMSNorm leaves it; the LayerNorm rules make it one LayerNormalization
    (onnxruntime's, in the default domain below opset 17)."""
    model = layer_norm(Form(mean=mean, opset=13))
    optimized, report = optimize_with(model, ["FuseRMSNorm"], target="ort-cuda")
    assert rewrites(report, "FuseRMSNorm") == 0
    assert len(optimized.graph.node) == len(model.graph.node)
    assert any("a LayerNorm, not an RMSNorm" in m.reason for m in report.rules["FuseRMSNorm"].near_misses)
    optimized, report = optimize_with(model, ["FuseRMSNorm", *LN_RULES], target="ort-cuda")
    assert rewrites(report, "FuseLayerNorm") == 1 and op_types(optimized) == ["LayerNormalization"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)
