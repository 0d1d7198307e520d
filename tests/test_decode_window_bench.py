"""The GPU hooks of the torch path's sliding window on the CPU: benchmarks/llm_decode.py --family mistral --window
(the window reaches graphopt's split-K kernel in the compiled decode step, tokens equal eager's) and
benchmarks/decode_window_bench.py --smoke (the kernel with and without its key range, under TRITON_INTERPRET=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}


def _run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, f"benchmarks/{script}", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**ENV, **env}, timeout=600)


def test_llm_decode_mistral_window_reaches_the_kernel(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    run = _run("llm_decode.py", "--tiny", "--device", "cpu", "--family", "mistral", "--window", "4", "--prompt", "6",
               "--new-tokens", "8", "--batches", "1", "--runs", "1", "--warmup", "1", "--variants", "eager,graphopt-cg", "--out", str(out))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["settings"]["window"] == 4 and data["settings"]["cache"] == "a row per position"
    compiled = next(r for r in data["results"] if r["variant"] == "graphopt-cg")
    assert compiled["tokens_equal"] is True and compiled["decode_attention_windows"] == [4, 4]


def test_llm_decode_window_refused_for_a_family_without_one() -> None:
    run = _run("llm_decode.py", "--tiny", "--device", "cpu", "--family", "qwen2", "--window", "4")
    assert run.returncode == 2 and "error: --window takes a window >= 1 for a family with a sliding window" in run.stderr


def test_decode_window_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "window.json"
    run = _run("decode_window_bench.py", "--smoke", "--device", "cpu", "--out", str(out), TRITON_INTERPRET="1")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert [(r["window"], r["key range"]["rows_read"], r["whole cache"]["rows_read"]) for r in results] == [(8, 8, 64), (-1, 32, 64)]
    assert all(r["max_abs_difference"] < 1e-4 for r in results)
