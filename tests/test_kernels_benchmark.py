"""benchmarks/triton_kernels.py on CPU: the dry run (reference path), the dry run through
Triton's interpreter (the launchers the CUDA run times), and its exit on bad input."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "triton_kernels.py"


def _benchmark_module() -> ModuleType:
    """The script, imported by file path (benchmarks/ is not a package)."""
    name = "graphopt_triton_kernels_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: its dataclasses look themselves up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_dry_run_covers_every_kernel_and_agrees_with_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "kernels.json"
    assert _benchmark_module().main(["--dry-run", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    results = data["results"]
    assert {r["kernel"] for r in results} == {"attention", "linear_act", "layer_norm", "rms_norm", "swiglu", "geglu", "rotary"}
    assert len(results) == 24
    for r in results:
        assert r["ok"], r
        assert r["graphopt"]["eager"]["runs"] == 3 and r["graphopt"]["eager"]["median_ms"] > 0
        assert r["numerics"]["rel_err_vs_torch"] <= r["numerics"]["tolerance"]
    assert data["settings"]["path"] == "torch.ops.graphopt"
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(f"wrote {out}")  # the table, then where the JSON went
    assert "rotary/llama-q-1x32x512x128/fp16" in printed


def test_unknown_case_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _benchmark_module().main(["--dry-run", "--only", "nothing-like-this", "--out", str(tmp_path / "x.json")]) == 2
    assert "matches no case" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_dry_run_in_the_interpreter_times_the_triton_launchers(tmp_path: Path) -> None:
    # a child process: TRITON_INTERPRET must be set before triton is imported
    out = tmp_path / "kernels.json"
    only = "attention/bert-b8-s128-padmask,linear_act/1024x768x3072/gelu_tanh,rms_norm/4096x768,rotary"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--only", only, "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["settings"]["path"] == "triton launcher" and data["environment"]["triton_interpret"]
    ran = [r for r in data["results"] if "skipped" not in r]
    skipped = [r for r in data["results"] if "skipped" in r]
    assert len(ran) == 4 and all(r["ok"] for r in ran), ran
    assert [r["name"] for r in skipped] == ["attention/bert-b8-s128-padmask/bf16"]
    assert all(r["best_config"] for r in ran if r["kernel"] in ("attention", "linear_act"))
