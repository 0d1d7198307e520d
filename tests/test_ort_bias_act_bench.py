"""benchmarks/ort_bias_act.py on the CPU: a one-point run records both forms and the ops onnxruntime ran;
--entries-from turns results of several machines and providers into bias_act entries, each entry under
its own provider, per class the figures least favourable to the fused form."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

from graphopt.decisions import CostTable
from graphopt.decisions.shapes import bias_act_class
from graphopt.decisions.table import DEFAULT_TABLE_PATH

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/ort_bias_act.py", *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)


def test_one_point_and_entries_per_provider(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu.json"
    run = _bench("--rows", "16", "--n", "64", "--variants", "gelu", "--threads", "1", "2", "--rounds", "2", "--batch-s", "0.001", "--out", str(cpu))
    assert run.returncode == 0, run.stderr
    doc = json.loads(cpu.read_text())
    rows = doc["results"]
    assert [(r["threads"], r["rows"], r["n"], r["k"]) for r in rows] == [(1, 16, 64, 16), (2, 16, 64, 16)]
    assert all(r["ran_ops"]["fused"] == ["MatMul", "BiasGelu"] and "Gemm" in r["ran_ops"]["unfused"] for r in rows)
    assert all(r["max_abs_diff"] < 1e-4 for r in rows)
    # A CUDA provider's file (the same figures, relabelled, the fused form 10x faster there) merged in one call.
    cuda_doc = copy.deepcopy(doc)
    cuda_doc["machine"].update(provider="CUDAExecutionProvider", device="NVIDIA test GPU")
    for r in cuda_doc["results"]:
        r["us"]["fused"] = r["us"]["unfused"] / 10
        r["fused_over_unfused"] = 0.1
    cuda = tmp_path / "cuda.json"
    cuda.write_text(json.dumps(cuda_doc))
    table = tmp_path / "cost_table.json"
    shutil.copy(DEFAULT_TABLE_PATH, table)
    merged = _bench("--entries-from", str(cpu), str(cuda), "--into", str(table))
    assert merged.returncode == 0, merged.stderr
    loaded = CostTable.load(table)
    cls = bias_act_class("BiasGelu", "f32", "r5-48", 64)
    on_cpu = loaded.lookup("CPUExecutionProvider", "bias_act", cls)
    on_cuda = loaded.lookup("CUDAExecutionProvider", "bias_act", cls)
    assert on_cpu is not None and on_cuda is not None
    assert on_cuda.device == "NVIDIA test GPU" and on_cuda.times_ms["fused"] < on_cuda.times_ms["unfused"] / 5
    assert on_cpu.device.startswith("cpu-") and "NVIDIA" not in on_cpu.source
    worst = max(rows, key=lambda r: r["fused_over_unfused"])  # the thread count least favourable to the fused form
    assert f"the {worst['threads']}-thread figures" in on_cpu.source
    same = rows[0]["ran_ops"]["fused"] == rows[0]["ran_ops"]["unfused"]
    if not same:
        assert on_cpu.times_ms["fused"] == round(worst["us"]["fused"] / 1e3, 5)
    # Only the bias_act entries of those providers were replaced: the other decisions' entries stay.
    before = json.loads(DEFAULT_TABLE_PATH.read_text())["entries"]
    after = json.loads(table.read_text())["entries"]
    assert [e for e in after if e["decision"] != "bias_act"] == [e for e in before if e["decision"] != "bias_act"]
