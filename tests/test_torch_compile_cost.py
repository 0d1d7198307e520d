"""benchmarks/torch_compile_cost.py: graphopt's passes against inductor's compile time (issue 15),
a dry run on the smallest model, and bad input refused with one `error:` line and exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # what the script sets; undone after the test
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("torch_compile_cost", REPO / "benchmarks" / "torch_compile_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_reports_the_ratio_per_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bench = _bench(monkeypatch)
    assert bench.main(["--tiny", "--device", "cpu", "--models", "resnet50", "--out", f"{tmp_path}/"]) == 0
    data = json.loads((tmp_path / "torch_compile_cost-resnet50-tiny.json").read_text())
    (result,) = data["results"]
    assert result["graphs"] == 1 and result["graphopt_s"] > 0 and result["inductor_s"] > 0
    # the times are rounded in the JSON: their ratio agrees to about a percent, not to the third decimal
    assert result["ratio"] == pytest.approx(result["graphopt_s"] / result["inductor_s"], rel=0.02)
    assert result["runs"]["graphopt"][0]["rewrites"]["FoldConvBatchNorm"] > 0  # graphopt did its work on the graph timed
    assert data["environment"]["device"] == "cpu" and "command" in data["environment"]


@pytest.mark.parametrize("argv, message", [(["--models", "nope"], "unknown model nope"), (["--options", "{x"], "--options is not JSON"),
                                           (["--repeats", "0"], "--repeats must be >= 1")])
def test_bad_input_is_one_error_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], message: str) -> None:
    assert _bench(monkeypatch).main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
