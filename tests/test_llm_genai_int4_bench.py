"""benchmarks/llm_genai_int4.py without the builder or an export: its variant names, its bad-option exit,
and the logits cosine it reports (the decode runs need the onnxruntime-genai builder; RESULTS.md 2026-11-28)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from llm_genai_int4 import cosines, parse_variant  # noqa: E402


def test_variant_names_give_the_options() -> None:
    assert parse_variant("graphopt-int4", 32) == {"kind": "graphopt-int4", "block": 32, "level": None, "head": False, "symmetric": None}
    assert parse_variant("graphopt-int4-head-sym-b64-acc1", 32) == {
        "kind": "graphopt-int4", "block": 64, "level": 1, "head": True, "symmetric": True}
    assert parse_variant("graphopt-int4-asym-head", 32)["symmetric"] is False
    assert parse_variant("builder-int4-b128-acc0", 32) == {"kind": "builder-int4", "block": 128, "level": 0, "head": False, "symmetric": None}
    assert parse_variant("graphopt", 32)["kind"] == "graphopt" and parse_variant("export", 64)["block"] == 64


@pytest.mark.parametrize("name", ["graphopt-int8", "builder-int4-head", "graphopt-fast", "export-b32", "graphopt-int4-b"])
def test_bad_variant_names(name: str) -> None:
    with pytest.raises(ValueError, match="variant"):
        parse_variant(name, 32)


def test_a_bad_variant_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "benchmarks/llm_genai_int4.py", "--out", str(tmp_path), "--variants", "export,graphopt-int3"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2 and run.stderr.startswith("error: ") and run.stderr.strip().count("\n") == 0, run.stderr
    assert not (tmp_path / "work").exists()


def test_cosines_per_row() -> None:
    reference = np.array([[[1.0, 0.0], [0.0, 2.0]]])
    got = np.array([[[2.0, 0.0], [1.0, 1.0]]])
    np.testing.assert_allclose(cosines(got, reference), [1.0, np.sqrt(0.5)])
