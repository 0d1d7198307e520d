"""benchmarks/decisions_bench.py on the CPU: a tiny run writes a cost table that the decision
point reads, and --merge puts it into a table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from graphopt.decisions import CostTable, OpClass

ROOT = Path(__file__).resolve().parent.parent


def test_tiny_cpu_run_writes_a_readable_table_and_merges(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "benchmarks/decisions_bench.py", "--provider", "cpu", "--channels", "16", "--batches", "1",
         "--kinds", "dense3", "--runs", "3", "--warmup", "1", "--size", "8", "--depth", "2", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "device:" in run.stdout and "0 errors" in run.stdout
    table = CostTable.load(out / "cost_table.json")
    [entry] = table.entries
    assert entry.ep == "CPUExecutionProvider" and entry.decision == "fused_conv" and entry.per == 2
    assert set(entry.times_ms) == {"FusedConv", "Conv+activation"} and all(t > 0 for t in entry.times_ms.values())
    cls = OpClass("Conv", "f32", (("kind", "dense"), ("kernel", "k3"), ("channels", "c1-32"), ("batch", "b1")))
    assert table.lookup("CPUExecutionProvider", "fused_conv", cls) == entry
    rows = json.loads((out / "decisions_bench-cpu.json").read_text())["rows"]
    assert {r["candidate"] for r in rows} == {"FusedConv", "Conv+activation"} and all(r["max_rel_diff"] == 0.0 for r in rows)
    # Each candidate is timed in its own form (the fused_conv decision would split an unmeasured FusedConv).
    ops = {r["candidate"]: r["ops"] for r in rows}
    assert "FusedConv" in ops["FusedConv"] and "FusedConv" not in ops["Conv+activation"] and "Relu" in ops["Conv+activation"]
    shipped = tmp_path / "shipped.json"
    shipped.write_text((ROOT / "graphopt" / "decisions" / "cost_table.json").read_text())
    before = len(CostTable.load(shipped).entries)
    for _ in range(2):  # merging twice replaces, never duplicates
        merged = subprocess.run(
            [sys.executable, "benchmarks/decisions_bench.py", "--merge", str(out / "cost_table.json"), "--into", str(shipped)],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
        )
        assert merged.returncode == 0, merged.stderr
        assert len(CostTable.load(shipped).entries) == before + 1
    assert json.loads(shipped.read_text())["notes"]  # the table's own notes survive
