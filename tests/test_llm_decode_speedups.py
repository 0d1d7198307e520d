"""benchmarks/llm_decode.py's speed line (the `wq ro` step prints it): each weight-quantized variant
against fp16 in the same compile mode and batch; variants that failed or were skipped are left out."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import llm_decode  # noqa: E402


def test_speedups_compare_each_quantized_variant_with_fp16_of_its_mode() -> None:
    results = [
        {"batch": 1, "variant": "eager", "decode_ms": 20.0},
        {"batch": 1, "variant": "graphopt-ro", "decode_ms": 1.4},
        {"batch": 1, "variant": "graphopt-int4-ro", "decode_ms": 0.7},
        {"batch": 1, "variant": "graphopt-int8-ro", "status": "skipped: past the 200 s budget"},
        {"batch": 1, "variant": "graphopt-cg", "decode_ms": 2.0},
        {"batch": 1, "variant": "graphopt-int4-cg", "decode_ms": 1.6},
        {"batch": 8, "variant": "graphopt-int4-ro", "decode_ms": 1.0},  # no fp16 at batch 8: no line
    ]
    lines = llm_decode.speedups(results)
    assert lines == ["batch 1, decode speed over fp16 (its ms / the variant's): int4/fp16 2.00x, int4 (cg)/fp16 1.25x"]
