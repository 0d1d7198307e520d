"""End to end on models exported by both torch exporters (tiny BERT, GPT-2 and CNNs
built from configs with random weights): every target's output runs in
onnxruntime with the original's outputs, and the expected rules fire."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import onnx
import pytest

import graphopt
from graphopt.verify import verify

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _models():
    name = "graphopt_test_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("models.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


models = _models()


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("name", sorted(models.TINY_MODELS))
def test_exported_model_optimizes_and_verifies(name: str, target: str, tmp_path: Path) -> None:
    source = models.TINY_MODELS[name]()
    out = tmp_path / "out.onnx"
    report = graphopt.optimize_file(source, out, target=target)
    assert out.exists()
    assert report.after.nodes <= report.before.nodes
    result = verify(source, out)
    assert result.passed, result.message


def test_cnn_without_exporter_folding_gets_batchnorm_folded_and_fused() -> None:
    source = models.TINY_MODELS["small-cnn-dynamo-noopt"]()
    before = Counter(n.op_type for n in onnx.load(source).graph.node)
    assert before["BatchNormalization"] > 0
    optimized, report = graphopt.optimize(onnx.load(source), target="ort-cpu")
    after = Counter((n.domain, n.op_type) for n in optimized.graph.node)
    assert after[("", "BatchNormalization")] == 0
    folded = sum(report.rules[r].applications for r in report.rules if r.startswith("Fold") and "BatchNorm" in r)
    assert folded == before["BatchNormalization"]
    # FuseConvActivation fused them; unmeasured (nothing on the CPU provider is), the fused_conv
    # decision gives every one back as the input's Conv + activation, which onnxruntime fuses itself.
    fused = report.rules["FuseConvActivation"].applications
    assert fused > 0 and after[("com.microsoft", "FusedConv")] == 0
    assert [(d.chosen, d.basis) for d in report.decisions] == [("Conv+activation", "no_entry")] * fused


def test_transformer_exports_explain_what_did_not_fold() -> None:
    # BERT's MatMuls are 3-D, so MatMul+Add -> Gemm must not fire, and the report says why.
    source = models.TINY_MODELS["bert-tiny-torchscript"]()
    _, report = graphopt.optimize(source, target="onnx")
    stats = report.rules["MatMulAddToGemm"]
    assert stats.applications == 0 and stats.attempts > 0
    assert any("rank 3" in miss.reason for miss in stats.near_misses)
