"""benchmarks/ort_cpu_norms.py on the CPU: a one-point run records every form and the ops onnxruntime
ran, and --entries-from turns it into skip_norm entries the decision point reads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from graphopt.decisions import CostTable
from graphopt.decisions.shapes import norm_class
from graphopt.decisions.table import DEFAULT_TABLE_PATH

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/ort_cpu_norms.py", *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)


def test_one_point_run_and_its_entries(tmp_path: Path) -> None:
    results = tmp_path / "norms.json"
    run = _bench("--rows", "16", "--hidden", "64", "--variants", "ln", "ln_sum", "--threads", "1", "--rounds", "2", "--batch-s", "0.001",
                 "--out", str(results))
    assert run.returncode == 0, run.stderr
    doc = json.loads(results.read_text())
    assert doc["command"].startswith("python ") and doc["machine"]["provider"] == "CPUExecutionProvider" and doc["date"]
    rows = {r["variant"]: r for r in doc["results"]}
    assert set(rows["ln"]["us"]) == {"fused", "unfused", "unfused-2d"} and set(rows["ln_sum"]["us"]) == {"fused", "unfused"}
    # onnxruntime fuses plain Add + LayerNormalization itself; not the 2-D form, nor a sum read elsewhere.
    assert rows["ln"]["ran_ops"]["unfused"] == ["SkipLayerNormalization"]
    assert "SkipLayerNormalization" not in rows["ln"]["ran_ops"]["unfused-2d"]
    assert rows["ln_sum"]["ran_ops"]["unfused"] == ["Add", "LayerNormalization", "Add"]
    assert all(d < 1e-4 for r in rows.values() for d in r["max_abs_diff_vs_fused"].values())

    table = tmp_path / "cost_table.json"
    shutil.copy(DEFAULT_TABLE_PATH, table)
    merged = _bench("--entries-from", str(results), "--into", str(table))
    assert merged.returncode == 0, merged.stderr
    loaded = CostTable.load(table)
    entries = [e for e in loaded.entries if e.decision == "skip_norm"]
    assert len(entries) == 2  # the shipped skip_norm entries of this provider are replaced
    assert len(loaded.entries) - 2 == len([e for e in CostTable.load(DEFAULT_TABLE_PATH).entries if e.decision != "skip_norm"])
    unused = loaded.lookup("CPUExecutionProvider", "skip_norm", norm_class("SkipLayerNormalization", "f32", "r5-48", 64, bias=False, sum_used=False))
    assert unused is not None and unused.times_ms["fused"] == unused.times_ms["unfused"]  # one kernel: one time
    assert "ort_cpu_norms.py" in unused.source and unused.device.startswith("cpu-")


def test_a_missing_provider_is_one_error_line() -> None:
    import onnxruntime as ort
    import pytest

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("the CUDA provider is present here: nothing is missing")
    run = _bench("--provider", "cuda", "--rows", "1", "--hidden", "64")
    assert run.returncode == 2 and run.stderr.strip().splitlines() == ["error: CUDAExecutionProvider is not available in this onnxruntime"]
