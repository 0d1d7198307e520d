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


def test_tiny_cpu_run_of_the_precision_entries(tmp_path: Path) -> None:
    # On the CPU only the NCHW forms run: a check of the script (the figures are for the CUDA provider).
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "benchmarks/decisions_bench.py", "--provider", "cpu", "--decisions", "precision", "--channels", "16",
         "--batches", "1", "--kinds", "dense3,grouped3", "--runs", "3", "--warmup", "1", "--size", "8", "--depth", "2", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "0 errors" in run.stdout
    table = CostTable.load(out / "cost_table.json")
    assert [(e.decision, e.dtype, dict(e.match)["kind"]) for e in table.entries] == [("precision", "f32", ("dense",)), ("precision", "f32", ("grouped",))]
    assert all(set(e.times_ms) == {"fp32", "fp16"} and "Casts" in e.source for e in table.entries)
    rows = json.loads((out / "decisions_bench-cpu.json").read_text())["rows"]
    ops = {(r["config"], r["candidate"]): r["ops"] for r in rows}
    assert all("Cast" in o for (_, c), o in ops.items() if c == "fp16") and all("Cast" not in o for (_, c), o in ops.items() if c == "fp32")
    assert all(0 < r["max_rel_diff"] < 3e-2 for r in rows if r["candidate"] == "fp16")


def test_the_precision_forms_for_the_cuda_provider() -> None:
    # Built here, timed on the GPU: each form is what its name says.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import decisions_bench
    from onnx import TensorProto

    model = decisions_bench.conv_block("grouped", 3, 64, 1, 8, 6, "f32")
    assert [a.i for n in model.graph.node for a in n.attribute if a.name == "group"] == [8] * 6
    forms = decisions_bench.candidates(model, "cuda", "f32", ("precision",))["precision"]
    assert set(forms) == {"fp32", "fp16", "fp32-nhwc-add", "fp32-nhwc-kernel", "fp16-nhwc-add", "fp16-nhwc-kernel"}

    def conv_weight_types(form) -> set[str]:
        inits = {t.name: t.data_type for t in form.graph.initializer}
        return {TensorProto.DataType.Name(inits[n.input[1]]) for n in form.graph.node if n.op_type in ("Conv", "NhwcConv")}

    for name, form in forms.items():
        node_ops = {n.op_type for n in form.graph.node}
        assert conv_weight_types(form) == {"FLOAT16" if name.startswith("fp16") else "FLOAT"}, name
        assert ("Cast" in node_ops) == name.startswith("fp16"), name
        assert ("NhwcConv" in node_ops) == ("nhwc" in name), name
    assert decisions_bench.entry_times("precision", {"fp32": 1.0, "fp16": 2.0, "fp16-nhwc-add": 0.7, "fp16-nhwc-kernel": 0.5}) == {
        "fp32": 1.0, "fp16": 2.0, "fp16-nhwc": 0.5}
    assert decisions_bench.entry_times("precision", {"fp16": 2.0}) is None


def test_tiny_cpu_run_of_the_recurrent_entries_reads_back_and_merges(tmp_path: Path) -> None:
    # On the CPU a check of the script (onnxruntime runs the fp16 op through Casts of its own): the figures are for CUDA.
    from graphopt.decisions.shapes import recurrent_class

    out = tmp_path / "out"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "benchmarks/decisions_bench.py", "--provider", "cpu", "--decisions", "recurrent_precision", "--rnn-ops", "lstm,gru",
         "--directions", "bidirectional", "--hidden", "16", "--sequences", "60", "--batches", "1", "--runs", "3", "--warmup", "1", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "0 errors" in run.stdout and "2 entries" in run.stdout
    table = CostTable.load(out / "cost_table.json")
    assert [(e.decision, e.op, e.per) for e in table.entries] == [("recurrent_precision", "LSTM", 1), ("recurrent_precision", "GRU", 1)]
    assert all(set(e.times_ms) == {"fp32", "fp16"} and "Casts" in e.source for e in table.entries)
    # The decision finds them under the class graphopt/passes/precision_recurrent.py gives such an op.
    cls = recurrent_class("LSTM", "f32", 16, "bidirectional", "s51+", "b1")
    assert table.lookup("CPUExecutionProvider", "recurrent_precision", cls) == table.entries[0]
    rows = json.loads((out / "decisions_bench-cpu.json").read_text())["rows"]
    assert {(r["candidate"], "Cast" in r["ops"]) for r in rows} == {("fp32", False), ("fp16", True)}
    assert all(0 < r["max_rel_diff"] < 3e-2 for r in rows if r["candidate"] == "fp16")
    shipped = tmp_path / "shipped.json"
    shipped.write_text((ROOT / "graphopt" / "decisions" / "cost_table.json").read_text())
    before = len(CostTable.load(shipped).entries)
    for _ in range(2):  # merging twice replaces, never duplicates
        merged = subprocess.run(
            [sys.executable, "benchmarks/decisions_bench.py", "--merge", str(out / "cost_table.json"), "--into", str(shipped)],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
        )
        assert merged.returncode == 0, merged.stderr
        assert len(CostTable.load(shipped).entries) == before + 2


def test_the_recurrent_forms() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import decisions_recurrent
    from onnx import TensorProto

    model = decisions_recurrent.recurrent_block("GRU", "bidirectional", 32, 25, 1)
    forms = decisions_recurrent.recurrent_forms(model)
    for name, form in forms.items():
        inits = {t.name: t.data_type for t in form.graph.initializer}
        [node] = [n for n in form.graph.node if n.op_type == "GRU"]
        assert TensorProto.DataType.Name(inits[node.input[1]]) == ("FLOAT16" if name == "fp16" else "FLOAT"), name
        assert [n.op_type for n in form.graph.node].count("Cast") == (2 if name == "fp16" else 0), name
        assert form.graph.input[0].type.tensor_type.elem_type == form.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
