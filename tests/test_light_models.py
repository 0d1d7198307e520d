"""The "light" real models shipped in the onnx package (ResNet50, DenseNet121,
Inception, VGG19, …): after optimization no BatchNormalization is left where the
Conv before it could absorb it, and the outputs match the original's."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import run

import graphopt

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
MODELS = sorted(p.name for p in LIGHT.glob("light_*.onnx"))


def test_the_light_models_are_there() -> None:
    assert {"light_resnet50.onnx", "light_densenet121.onnx", "light_vgg19.onnx", "light_inception_v2.onnx"} <= set(MODELS)


def absorbable_batchnorms(model: onnx.ModelProto) -> list[str]:
    """BNs whose input comes from a Conv used by nothing else (so it could have been folded)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    uses = Counter(name for node in model.graph.node for name in node.input)
    outputs = {o.name for o in model.graph.output}
    found = []
    for node in model.graph.node:
        if node.op_type != "BatchNormalization":
            continue
        conv = producers.get(node.input[0])
        if conv is not None and conv.op_type == "Conv" and uses[node.input[0]] == 1 and node.input[0] not in outputs:
            found.append(node.name or node.output[0])
    return found


@pytest.mark.parametrize("name", MODELS)
def test_light_model_optimizes_with_equal_outputs(name: str) -> None:
    original = onnx.load(LIGHT / name)
    optimized, report = graphopt.optimize(original, target="onnx")
    assert absorbable_batchnorms(optimized) == []
    before = Counter(n.op_type for n in original.graph.node)
    after = Counter(n.op_type for n in optimized.graph.node)
    assert len(optimized.graph.node) <= len(original.graph.node)
    if before["BatchNormalization"]:
        folded = sum(report.rules[r].applications for r in ("FoldConvBatchNorm", "FoldConvBatchNormComputedWeights"))
        assert folded == before["BatchNormalization"] - after["BatchNormalization"] > 0
    initializers = {i.name for i in optimized.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in optimized.graph.input
        if i.name not in initializers
    }
    expected, actual = run(original, feeds), run(optimized, feeds)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)
