"""benchmarks/llm_onnx_decode.py on the CPU (one attention block, no export): the bisecting variants
turn off the rules they name, and --profile reports onnxruntime's per-op times of the timed decode
steps (the GPU command for the slow ort-cuda decode of 2026-11-27 relies on both)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
ALL = "original,graphopt,graphopt-no-gqa,graphopt-no-gqa-no-rope,graphopt-no-attention"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/llm_onnx_decode.py", *args], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=300)


def _ops(path: Path) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_bisecting_variants_and_profile(tmp_path: Path) -> None:
    run = _bench("--out", str(tmp_path), "--source", "block", "--device", "cpu", "--dtype", "fp32", "--hidden", "64", "--heads", "4",
                 "--kv-heads", "2", "--batch", "1", "--prompt", "8", "--steps", "5", "--warmup", "2", "--threads", "1",
                 "--variants", ALL, "--profile")
    assert run.returncode == 0, run.stderr
    rows = {r["variant"]: r for r in json.loads((tmp_path / "llm_onnx_decode.json").read_text())["results"]}
    assert list(rows) == ALL.split(",")
    for variant, row in rows.items():
        assert "error" not in row, (variant, row)
        assert row["max_abs_diff_vs_original"] < 1e-4, variant
        profile = row["profile"]
        assert profile["steps"] == 3  # the timed steps only: 5 minus 2 warm-up
        assert profile["node_us_per_step"] > 0 and profile["top"]
        assert all(op["op"].endswith("@CPU") for op in profile["top"])
    assert any(op["op"].startswith("GroupQueryAttention@") for op in rows["graphopt"]["profile"]["top"])
    # each bisecting variant has what the previous one turned off gone
    assert _ops(tmp_path / "graphopt-no-gqa.onnx")["GroupQueryAttention"] == 0
    assert _ops(tmp_path / "graphopt-no-gqa.onnx")["RotaryEmbedding"] > 0
    no_rope = _ops(tmp_path / "graphopt-no-gqa-no-rope.onnx")
    assert no_rope["RotaryEmbedding"] == 0 and no_rope["MultiHeadAttention"] > 0
    assert _ops(tmp_path / "graphopt-no-attention.onnx")["MultiHeadAttention"] == 0


def test_bad_variants_are_one_error_line(tmp_path: Path) -> None:
    for variants in ("original,graphopt-fast", "graphopt,graphopt-no-gqa"):  # unknown; no original to compare with
        run = _bench("--out", str(tmp_path), "--source", "block", "--device", "cpu", "--variants", variants)
        assert run.returncode == 2, variants
        assert run.stderr.strip().count("\n") == 0 and run.stderr.startswith("error: "), run.stderr


def test_original_last_and_repeated_is_still_the_reference(tmp_path: Path) -> None:
    """Variants run one after another in one process; the original again at the end shows whether
    a later variant's time is the process's state rather than its graph."""
    run = _bench("--out", str(tmp_path), "--source", "block", "--device", "cpu", "--dtype", "fp32", "--hidden", "64", "--heads", "4",
                 "--kv-heads", "2", "--batch", "1", "--prompt", "8", "--steps", "3", "--warmup", "1", "--threads", "1",
                 "--variants", "graphopt,original,original")
    assert run.returncode == 0, run.stderr
    rows = json.loads((tmp_path / "llm_onnx_decode.json").read_text())["results"]
    assert [r["variant"] for r in rows] == ["graphopt", "original", "original"]
    assert rows[1]["max_abs_diff_vs_original"] == 0.0 and rows[2]["max_abs_diff_vs_original"] == 0.0
    assert 0 < rows[0]["max_abs_diff_vs_original"] < 1e-4  # graphopt's output against the original's, not against itself


def test_weight_variants_run_matmulnbits(tmp_path: Path) -> None:
    """graphopt-int4/-int8: every MatMul weight of the block as com.microsoft.MatMulNBits, outputs within
    the quantization error (cosine similarity), not equal."""
    run = _bench("--out", str(tmp_path), "--source", "block", "--device", "cpu", "--dtype", "fp32", "--hidden", "64", "--heads", "4",
                 "--kv-heads", "2", "--batch", "1", "--prompt", "8", "--steps", "3", "--warmup", "1", "--threads", "1",
                 "--variants", "original,graphopt-int4,graphopt-int8", "--block-size", "64")
    assert run.returncode == 0, run.stderr
    rows = {r["variant"]: r for r in json.loads((tmp_path / "llm_onnx_decode.json").read_text())["results"]}
    assert 0.98 < rows["graphopt-int4"]["cosine_vs_original"] < rows["graphopt-int8"]["cosine_vs_original"] < 1.0
    assert rows["graphopt-int8"]["max_abs_diff_vs_original"] > 1e-4  # quantized: not the original's numbers
    for variant in ("graphopt-int4", "graphopt-int8"):
        ops = _ops(tmp_path / f"{variant}.onnx")
        # q, k, v (packed into one after quantizing, as GroupQueryAttention reads them) and o; left: the attention's own matmuls at most
        assert ops["MatMulNBits"] == 2 and ops["MatMul"] <= 2, (variant, ops)
