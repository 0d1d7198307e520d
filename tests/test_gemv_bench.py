"""benchmarks/gemv_bench.py without a GPU: the table shows cuBLAS, the autotuner's pick and the best config per
(shape, M, dtype); bad arguments are a usage error; a smoke run in Triton's interpreter times every config of a regime
and checks each one's output against fp32 linear (a wrong config would be an error row). (The timed run is the GPU's:
`bash benchmarks/gpu_session.sh gemv`.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gemv_bench  # noqa: E402


def _row(form: str, config: str, ms: float, do_bench_ms: float | None = None) -> dict[str, object]:
    return {"shape": "o_proj", "N": 2048, "K": 2048, "M": 1, "dtype": "float16", "form": form, "config": config, "ms": ms,
            "GB/s": 8.4e6 / (ms * 1e-3) / 1e9, "do_bench_ms": do_bench_ms, "x cuBLAS": 0.010 / ms}


def test_summary_shows_cublas_the_pick_the_best_config_and_errors() -> None:
    rows = [_row("cublas", "F.linear", 0.010, 0.012), _row("triton", "auto", 0.004, 0.005), _row("triton", "sum N4xK512 w4 s3", 0.0035),
            _row("triton", "dot N16xK256 w4 s3", 0.006),
            {"shape": "o_proj", "M": 1, "dtype": "float16", "form": "triton", "config": "sum N1xK1024 w4 s3", "error": "ValueError: differs"}]
    lines = gemv_bench.summary(rows)
    (line,) = [x for x in lines[1:] if not x.startswith("error")]
    fields = line.split()
    assert fields[:5] == ["o_proj", "2048", "2048", "1", "float16"]
    assert fields[5] == "10.00" and fields[7] == "4.00" and fields[9] == "2.50"  # cuBLAS us, auto us, auto x cuBLAS
    assert fields[10] == "3.50" and "sum N4xK512 w4 s3" in line and "[12.0 / 5.0]" in line
    assert lines[-1].startswith("error: o_proj M=1 float16 sum N1xK1024")


def test_bad_arguments_are_a_usage_error() -> None:
    for args in (["--shapes", "2048by2048"], ["--splits", "0"], ["--rows", "0"]):
        done = subprocess.run([sys.executable, "benchmarks/gemv_bench.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.startswith("error:"), (args, done.stderr)


def test_interpreter_smoke_run_checks_every_config(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "gemv.json"
    done = subprocess.run([sys.executable, "benchmarks/gemv_bench.py", "--device", "cpu", "--shapes", "40x300", "--rows", "3",
                           "--bf16-rows", "", "--calls", "2", "--splits", "1,2", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["results"]
    assert data["device"].startswith("cpu") and not [r for r in rows if "error" in r]
    configs = {r["config"] for r in rows if r["form"] == "triton"}
    from graphopt.kernels.gemv import CONFIGS

    assert len(configs) == 1 + 2 * len(CONFIGS["small"])  # auto, and every config at splits 1 and 2
    assert {r["form"] for r in rows} == {"cublas", "triton"} and all(r["M"] == 3 for r in rows)
