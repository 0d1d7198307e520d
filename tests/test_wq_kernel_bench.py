"""benchmarks/wq_kernel_bench.py without a GPU: the table reports each form's best config and the
autotuner's pick, and the comparison new (decode GEMV) against old (tiled kernel) and fp16; bad
arguments are a usage error; a smoke run in Triton's interpreter times every config of the decode
GEMV, the old kernel's pick, and checks each one's output against the reference (a wrong config
would be an error row). (The timed run is the GPU's: `bash benchmarks/gpu_session.sh wq bench`.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import wq_kernel_bench  # noqa: E402


def _row(form: str, config: str, ms: float, fp16_ms: float = 0.010) -> dict[str, object]:
    return {"shape": "q/o", "N": 2048, "K": 2048, "M": 1, "form": form, "config": config, "ms": ms, "GB/s": 1000.0,
            "x fp16": fp16_ms / ms}


def test_summary_shows_the_best_config_the_autotuned_pick_and_errors() -> None:
    rows = [_row("fp16", "cuBLAS", 0.010), _row("int4", "auto", 0.006), _row("int4", "M1xN16xK512 w4 s3", 0.004),
            _row("int4", "M1xN8xK512 w4 s2", 0.005), _row("int4pack", "tinygemm", 0.005),
            {"shape": "q/o", "M": 1, "form": "int8", "config": "M16xN32xK128 w4 s3", "error": "ValueError: output differs"}]
    lines = wq_kernel_bench.summary(rows)
    int4 = next(line for line in lines if " int4 " in line)
    assert "M1xN16xK512 w4 s3" in int4 and "(auto: 6.0)" in int4 and "2.50" in int4 and "4.0" in int4
    assert "auto" not in next(line for line in lines if " int4pack " in line)
    assert any(line.startswith("error: q/o M=1 int8 M16xN32xK128") for line in lines)


def test_bad_shape_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "benchmarks/wq_kernel_bench.py", "--shapes", "2048by2048"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error:") and "NxK" in done.stderr


def test_interpreter_smoke_run_checks_every_config(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "benchmarks/wq_kernel_bench.py", "--device", "cpu", "--shapes", "24x160", "--rows", "1,3",
                           "--out", str(tmp_path / "bench.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert not [r for r in results if "error" in r]
    from graphopt.kernels.wq_gemv import configs_for

    timed = {(r["M"], r["form"], r["config"]) for r in results}
    for bits in (4, 8):
        assert (1, f"int{bits}", "auto") in timed and (3, f"int{bits}", "auto") in timed
        assert (1, f"int{bits}-old", "auto") in timed and (3, f"int{bits}-old", "auto") in timed
        # 24 columns: few tiles, so the split-K configs are offered too
        assert sum(m == 1 and form == f"int{bits}" for m, form, _ in timed) == len(configs_for(1, True)) + 1
        assert sum(m == 3 and form == f"int{bits}" for m, form, _ in timed) == len(configs_for(3, True)) + 1
    assert {(1, "fp16", "cuBLAS"), (3, "fp16", "cuBLAS")} <= timed


def test_comparison_puts_new_against_old_and_fp16() -> None:
    rows = [_row("fp16", "cuBLAS", 0.010), _row("int4", "auto", 0.005), _row("int4", "N64xKW64 split1 w4 s2", 0.004),
            _row("int4-old", "auto", 0.008), _row("int8", "auto", 0.006)]
    header, line = wq_kernel_bench.comparison(rows)
    assert header.split()[4:7] == ["int4", "int4-old", "int8"] and "int8-old" not in header
    assert line.startswith("q/o        1     10.0") and "4.0 (2.50x" in line and "8.0 (1.25x" in line
    assert line.split()[-2:] == ["2.00", "-"]  # int4 new/old: 8 us / 4 us; int8 has no old timing
