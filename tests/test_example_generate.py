"""examples/generate.py (issue 17's generation example): both front doors give eager's greedy tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import generate  # noqa: E402


def test_both_paths_generate_eagers_tokens_and_report_their_times(capsys: pytest.CaptureFixture[str]) -> None:
    steps = 8
    _, reference, results = generate.run_paths("tiny", "cpu", prompt_tokens=8, steps=steps, paths="torch,onnx")
    assert reference.shape == (1, steps)
    assert set(results) == {"torch.compile(backend='graphopt')", "graphopt --kv-buffer shared + onnxruntime"}
    for result in results.values():
        assert result["equal_to_eager"] == steps and result["step_ms"] > 0 and result["prefill_ms"] > 0 and result["of_limit"] > 0
    onnx = results["graphopt --kv-buffer shared + onnxruntime"]
    assert onnx["fused"].get("FuseGroupQueryAttention") == 2, onnx["fused"]  # attention over the shared buffer, a layer each


def test_the_command_line_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--size", "tiny", "--prompt", "4", "--steps", "4", "--paths", "onnx"]) == 0
    out = capsys.readouterr().out
    assert "graphopt --kv-buffer shared + onnxruntime" in out and "4/4" in out and "torch.compile" not in out and "of limit" in out


def test_a_step_reads_every_weight_and_the_cache() -> None:
    model = generate.build_decoder("tiny", "cpu", generate.torch.float32)
    weights = sum(p.numel() for p in model.parameters()) * 4
    kv = 2 * 2 * 2 * 16 * (8 + 4 / 2) * 4  # k and v, 2 layers, 2 kv heads, head 16, mean position 10, fp32
    assert generate.step_bytes(model, 8, 4) == weights + kv
    assert generate.copy_bandwidth("cpu") > 1e8  # bytes/s: any machine copies faster than 100 MB/s
