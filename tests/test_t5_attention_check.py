"""benchmarks/t5_attention_check.py without a GPU: a case that fails with a CUDA error, or kills its
process as a device fault does, is one FAILED line (re-run once with CUDA_LAUNCH_BLOCKING=1) and the
cases after it still run; the table's ratios; bad arguments are a usage error. (The GPU run:
`bash benchmarks/gpu_session.sh t5-attention`.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import t5_attention_check  # noqa: E402

RAISES = "probe packed q/k/v, dense mask, default"
ABORTS = "probe separate q/k/v, dense mask, default"
LAST = "probe packed q/k/v, strided mask, default"


def test_a_cuda_failure_is_one_line_and_the_cases_after_it_run(tmp_path: Path) -> None:
    env = dict(os.environ, T5_CHECK_FAULTS=f"{RAISES}=raise;{ABORTS}=abort", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "benchmarks/t5_attention_check.py", "--device", "cpu", "--tiny", "--only", "probes",
                           "--budget-s", "300", "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    raised = next(i for i, line in enumerate(lines) if line.startswith(f"FAILED {RAISES}"))
    assert "error: RuntimeError: CUDA error: misaligned address" in lines[raised]
    assert lines[raised + 1].strip() == "with CUDA_LAUNCH_BLOCKING=1: error: RuntimeError: CUDA error: misaligned address (launch blocking)"
    aborted = next(line for line in lines if line.startswith(f"FAILED {ABORTS}"))
    assert "crashed (child exit" in aborted and "illegal memory access" in aborted
    assert any(line.startswith(LAST) and " ok " in line for line in lines)  # after both failures, in a fresh process
    report = json.loads((tmp_path / "t5_attention_check.json").read_text())
    statuses = {case["name"]: case["status"] for case in report["cases"]}
    assert len(statuses) == 9 and statuses[LAST] == "ok"


def test_the_table_gives_each_compile_against_inductor() -> None:
    common = {"kind": "compile", "model": "t5-2", "p10_ms": 1.0, "p90_ms": 3.0, "max_abs_diff": 1e-3, "sdpa_ops": [], "bmm_calls": 0}
    report = {"device": "GPU", "torch": "2.11", "date": "now", "elapsed_s": 1.0, "cases": [
        {**common, "name": "t5-2 inductor", "variant": "inductor", "median_ms": 2.0, "status": "ok",
         "sdpa_ops": ["_scaled_dot_product_efficient_attention"], "attention_kernels": ["fmha_cutlassF_f16_aligned_64x64_rf_sm80"]},
        {**common, "name": "t5-2 graphopt-aligned", "variant": "graphopt-aligned", "median_ms": 1.5, "status": "ok",
         "masks": [{"mask": "constant", "dtype": "torch.float16", "stride": [196608, 16384, 128, 1], "ptr_mod16": 0}]},
        {"kind": "compile", "model": "t5-2", "name": "t5-2 graphopt-copy", "variant": "graphopt-copy",
         "status": "crashed (child exit -6): CUDA error: misaligned address", "launch_blocking": "error: RuntimeError: CUDA error: x"},
    ]}
    lines = t5_attention_check.render(report).splitlines()
    assert "1.00x inductor" in lines[1] and "_scaled_dot_product_efficient_attention" in lines[1] and "fmha_cutlassF" in lines[1]
    assert "0.75x inductor" in lines[2] and "constant float16 stride [196608, 16384, 128, 1] ptr%16=0" in lines[2]
    assert lines[3].startswith("FAILED t5-2 graphopt-copy") and "misaligned address" in lines[3]
    assert lines[4] == "    with CUDA_LAUNCH_BLOCKING=1: error: RuntimeError: CUDA error: x"


def test_the_plan_runs_both_models_through_inductor_and_every_handling() -> None:
    names = [case["name"] for case in t5_attention_check.plan(tiny=False, only="compiles")]
    assert names[0] == "t5-2 inductor" and "t5-2 graphopt-aligned-unpacked" in names
    assert {f"t5-base graphopt-{h}" for h in ("keep", "aligned", "copy", "decompose")} | {"t5-base inductor"} <= set(names)


def test_bad_arguments_are_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "benchmarks/t5_attention_check.py", "--device", "cpu", "--budget-s", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error:")
