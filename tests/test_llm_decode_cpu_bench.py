"""benchmarks/llm_decode_cpu.py (issue 18's CPU decode figures): a tiny run writes what RESULTS.md quotes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import llm_decode_cpu  # noqa: E402


def test_a_tiny_run_times_each_variant_and_compares_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "decode.json"
    assert llm_decode_cpu.main(["--size", "tiny", "--variants", "graphopt,graphopt-int4-head,torchao-int4", "--runs", "1",
                                "--prompt", "4", "--new-tokens", "12", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    results = {e["variant"]: e for e in data["results"]}
    assert list(results) == ["eager", "graphopt", "graphopt-int4-head", "torchao-int4"], "eager first: the token reference"
    for name in ("eager", "graphopt", "graphopt-int4-head"):
        assert results[name]["status"] == "ok" and results[name]["decode_ms"] > 0 and len(results[name]["tokens"][0]) == 12
    assert results["graphopt"]["token_agreement"] == 1.0 and results["graphopt"]["logits_cosine_min"] > 0.9999
    quantized = results["graphopt-int4-head"]
    assert 0.9 < quantized["logits_cosine_min"] < 1.0  # quantized, and close
    forms = quantized["weight_forms"]
    assert all(set(graph) <= {"int4pack", "unquantized"} for graph in forms.values())
    assert all(w["measured_ms"] for w in quantized["weights"]), "every site decided by the CPU clock"
    assert results["torchao-int4"]["status"] == "ok" or results["torchao-int4"]["status"].startswith("skipped: torchao not importable")
    assert "graphopt-int4-head" in capsys.readouterr().out


def test_an_unknown_variant_is_refused() -> None:
    with pytest.raises(SystemExit) as exit_info:
        llm_decode_cpu.main(["--variants", "graphopt-int3"])
    assert exit_info.value.code == 2
