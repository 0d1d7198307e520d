"""benchmarks/fp8_bench.py without a GPU: its table keeps going past a failed variant and names
kept layers and refusals; bad arguments are a usage error. (The timed parts run on the GPU:
`bash benchmarks/gpu_session.sh fp8`.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import fp8_bench  # noqa: E402


def test_table_shows_every_part_and_failures() -> None:
    results = [
        {"part": "decode", "variant": "inductor-ro", "decode_ms": 2.0, "tokens_per_s": 500.0, "fp8_gemms": 0, "status": "ok"},
        {"part": "decode", "variant": "graphopt-ro-fp8", "decode_ms": 1.6, "tokens_per_s": 625.0, "fp8_gemms": 154, "equal_steps": 40,
         "token_agreement": 0.9, "kept": ["lm_head.weight: the lm head (precision_keep)"], "status": "ok"},
        {"part": "prefill", "variant": "graphopt-ro", "status": "error: RuntimeError: boom"},
        {"part": "gemm", "gemm": "o", "m": 1, "k": 2048, "n": 2048, "bf16_ms": 0.01, "scaled_mm_error": "RuntimeError: x",
         "quantize_scaled_mm_ms": 0.008, "speedup": 1.25, "status": "ok"},
    ]
    text = fp8_bench.table(results, "NVIDIA H100 80GB HBM3")
    assert text.splitlines()[0] == "GPU: NVIDIA H100 80GB HBM3"
    assert "graphopt-ro-fp8" in text and "40 steps equal, 90% of tokens" in text and "154" in text
    assert "error: RuntimeError: boom" in text
    assert "error" in next(line for line in text.splitlines() if line.startswith("o ")) and "1.25x" in text
    assert "kept in bf16: lm_head.weight" in text


def test_unknown_variant_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "benchmarks/fp8_bench.py", "--variants", "nope", "--device", "cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "variants" in done.stderr
