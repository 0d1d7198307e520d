"""benchmarks/quant_accuracy.py (issue 18 item 4) on the CPU: its metrics on cases with a known answer
(identical logits; a perturbed copy; a token changed at a known step), and one short run end to end
(graphopt's int4 against fp32: lower cosine than the identity variant, the per-layer SNRs in its JSON)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import quant_accuracy  # noqa: E402


def _logits(steps: int = 16, vocab: int = 50) -> torch.Tensor:
    return torch.randn(steps, vocab, generator=torch.Generator().manual_seed(0))


def test_identical_logits_agree_everywhere() -> None:
    logits = _logits()
    got = quant_accuracy.compare(logits, logits.clone(), logits.argmax(-1), min_gap=0.0)
    assert got["cosine_min"] == pytest.approx(1.0) and got["cosine_median"] == pytest.approx(1.0)
    assert got["top1_agreement"] == 1.0 and got["top1_agreement_decided"] == 1.0 and got["decided_steps"] == 16
    assert got["free_first_divergence"] is None and got["free_gap_at_divergence"] is None and got["free_token_agreement"] == 1.0
    assert got["max_abs_logit_error"] == 0.0


def test_a_perturbed_copy_scores_lower_and_the_divergence_is_found() -> None:
    logits = _logits()
    noisy = logits + 2.0 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(1))
    free = logits.argmax(-1).clone()
    free[5] = (free[5] + 1) % logits.shape[1]  # the free-running tokens differ first at step 5
    free[9] = (free[9] + 1) % logits.shape[1]
    got = quant_accuracy.compare(logits, noisy, free, min_gap=0.0)
    expected_cos = torch.nn.functional.cosine_similarity(logits.double(), noisy.double(), dim=-1)
    assert got["cosine_min"] == pytest.approx(float(expected_cos.min())) and got["cosine_min"] < 0.95
    assert got["top1_agreement"] == pytest.approx(float((noisy.argmax(-1) == logits.argmax(-1)).double().mean()))
    assert got["top1_agreement"] < 1.0
    assert got["free_first_divergence"] == 5 and got["free_token_agreement"] == pytest.approx(14 / 16)
    assert got["free_gap_at_divergence"] == pytest.approx(float(quant_accuracy.top2_gap(logits)[5]))


def test_agreement_on_decided_steps_leaves_out_near_ties() -> None:
    logits = torch.zeros(4, 3)
    logits[:, 0] = torch.tensor([1.0, 1.0, 0.01, 0.01])  # steps 2 and 3: near-ties (gap 0.01)
    variant = logits.clone()
    variant[2, 1] = 0.02  # a near-tie flipped
    got = quant_accuracy.compare(logits, variant, logits.argmax(-1), min_gap=0.05)
    assert got["top1_agreement"] == 0.75 and got["decided_steps"] == 2 and got["top1_agreement_decided"] == 1.0


def test_short_run_identity_against_int4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "qa.json"
    rc = quant_accuracy.main(["--variants", "identity,int4", "--steps", "6", "--prompt", "4", "--device", "cpu", "--out", str(out)])
    assert rc == 0, capsys.readouterr().out
    results = {e["variant"]: e for e in json.loads(out.read_text())["results"]}
    identity, int4 = results["identity"], results["int4"]
    assert identity["cosine_min"] > 0.99999 and identity["top1_agreement"] == 1.0 and identity["free_first_divergence"] is None
    assert int4["cosine_min"] < 0.999 < identity["cosine_min"], int4
    weights = int4["weights"]  # the compiled graph's report: 2 layers x 4 GEMMs quantized (q|k|v and gate|up packed), the head kept
    assert weights["quantized"] == 8 and weights["kept"] == ["lm_head: lm_head"] and 20 <= weights["snr_db_min"] <= weights["snr_db_median"]
    assert "int4" in capsys.readouterr().out


def test_bad_variant_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert quant_accuracy.main(["--variants", "int3"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_short_run_of_the_onnx_path(tmp_path: Path) -> None:
    """The export run in onnxruntime agrees with torch's fp32 reference; its --weights int4 output
    (MatMulNBits, the LM head kept) scores lower, with the layers' SNRs from graphopt's report."""
    pytest.importorskip("onnxruntime")
    out = tmp_path / "qa.json"
    assert quant_accuracy.main(["--variants", "onnx,onnx-int4", "--steps", "4", "--prompt", "4", "--device", "cpu", "--out", str(out)]) == 0
    results = {e["variant"]: e for e in json.loads(out.read_text())["results"]}
    assert results["onnx"]["cosine_min"] > 0.99999 and results["onnx"]["free_first_divergence"] is None
    int4 = results["onnx-int4"]
    assert int4["cosine_min"] < 0.999 and int4["weights"]["forms"] == ["MatMulNBits"]
    assert int4["weights"]["quantized"] == 14 and len(int4["weights"]["kept"]) == 1 and int4["weights"]["snr_db_min"] >= 20
