"""Golden tests for pad_conv.pdll: a zero Pad folds into the Conv after it."""

from __future__ import annotations

import numpy as np
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rand, rewrites

F = TensorProto.FLOAT


def pad_conv_model(pads, mode="constant", value=None, opset=13, conv_pads=(0, 0, 0, 0)):
    inits = [init("w", rand(6, 3, 3, 3))]
    if opset >= 11:
        inits.append(init("pads", np.array(pads, np.int64)))
        pad_inputs = ["x", "pads"]
        if value is not None:
            inits.append(init("v", np.array(value, np.float32)))
            pad_inputs.append("v")
        pad = helper.make_node("Pad", pad_inputs, ["p"], mode=mode)
    else:
        attrs = {"pads": list(pads), "mode": mode}
        if value is not None:
            attrs["value"] = float(value)
        pad = helper.make_node("Pad", ["x"], ["p"], **attrs)
    conv = helper.make_node("Conv", ["p", "w"], ["y"], pads=list(conv_pads))
    return make_model([pad, conv], [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])], [helper.make_tensor_value_info("y", F, None)], inits, opset=opset)


@pytest.mark.parametrize("opset", [10, 13, 18])
def test_zero_pad_folds_into_conv(opset: int) -> None:
    model = pad_conv_model([0, 0, 1, 2, 0, 0, 2, 1], opset=opset, conv_pads=(1, 1, 1, 1))
    optimized, report = optimize_with(model, ["FoldPadIntoConv"])
    assert rewrites(report, "FoldPadIntoConv") == 1
    assert op_types(optimized) == ["Conv"]
    pads = [list(a.ints) for a in optimized.graph.node[0].attribute if a.name == "pads"][0]
    assert pads == [2, 3, 3, 2]
    assert_same_outputs(model, optimized)


def test_explicit_zero_value_folds() -> None:
    model = pad_conv_model([0, 0, 1, 1, 0, 0, 1, 1], value=0.0)
    optimized, report = optimize_with(model, ["FoldPadIntoConv"])
    assert rewrites(report, "FoldPadIntoConv") == 1
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize(
    "pads, mode, value, reason",
    [
        ([0, 1, 1, 1, 0, 0, 1, 1], "constant", None, "channel"),
        ([0, 0, 1, 1, 0, 0, 1, 1], "reflect", None, "mode"),
        ([0, 0, 1, 1, 0, 0, 1, 1], "constant", 1.5, "non-zero"),
        ([0, 0, -1, 0, 0, 0, 0, 0], "constant", None, "negative"),
    ],
)
def test_pad_that_conv_cannot_express_stays(pads, mode, value, reason) -> None:
    model = pad_conv_model(pads, mode=mode, value=value)
    optimized, report = optimize_with(model, ["FoldPadIntoConv"])
    assert rewrites(report, "FoldPadIntoConv") == 0
    assert op_types(optimized) == ["Pad", "Conv"]
    assert reason in report.rules["FoldPadIntoConv"].near_misses[0].reason


def test_pad_before_valid_conv_folds() -> None:
    """TF-style "same" padding as exported: an explicit Pad, then a Conv with auto_pad = VALID."""
    model = pad_conv_model([0, 0, 0, 0, 0, 0, 1, 1])
    conv = model.graph.node[1]
    del conv.attribute[:]
    conv.attribute.append(helper.make_attribute("auto_pad", "VALID"))
    conv.attribute.append(helper.make_attribute("strides", [2, 2]))
    optimized, report = optimize_with(model, ["FoldPadIntoConv"])
    assert rewrites(report, "FoldPadIntoConv") == 1
    assert op_types(optimized) == ["Conv"]
    attrs = {a.name: helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs["auto_pad"] == b"NOTSET" and list(attrs["pads"]) == [0, 0, 1, 1]
    assert_same_outputs(model, optimized)


def test_pad_before_same_conv_stays() -> None:
    model = pad_conv_model([0, 0, 1, 1, 0, 0, 1, 1])
    conv = model.graph.node[1]
    del conv.attribute[:]
    conv.attribute.append(helper.make_attribute("auto_pad", "SAME_UPPER"))
    optimized, report = optimize_with(model, ["FoldPadIntoConv"])
    assert rewrites(report, "FoldPadIntoConv") == 0
    assert op_types(optimized) == ["Pad", "Conv"]
    assert "SAME_UPPER" in report.rules["FoldPadIntoConv"].near_misses[0].reason
