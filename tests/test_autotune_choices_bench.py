"""benchmarks/autotune_choices.py (the GPU check of issue 15 item 1) run on the CPU with the sites' times fixed:
where inductor's side wins every site, the script must find graphopt's generated code equal to inductor's
alone; where graphopt's wins, not."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from graphopt import inductor_sites

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("graphopt_wins", [False, True])
def test_the_check_reports_the_winner_and_same_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, graphopt_wins: bool) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import autotune_choices

    def benchmark(side: str, fn: Any, inputs: Any, replay: bool) -> float:
        return (1.0 if graphopt_wins else 3.0) if side == "graphopt" else 2.0

    monkeypatch.setattr(inductor_sites, "benchmark", benchmark)
    out = tmp_path / "autotune.json"
    assert autotune_choices.main(["--device", "cpu", "--tokens", "4", "--hidden", "16", "--inner", "32", "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    winner = "graphopt" if graphopt_wins else "inductor"
    assert [s["chosen"] for s in result["sites"]] == [winner, winner]
    assert all(s["graphopt_ms"] == (1.0 if graphopt_wins else 3.0) and s["inductor_best_ms"] == 2.0 for s in result["sites"])
    assert result["code_identical_to_inductor"] is (not graphopt_wins)
    assert result["max_abs_error"] < 1e-4
    sys.modules.pop("autotune_choices", None)
