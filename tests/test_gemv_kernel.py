"""graphopt::gemv_linear: the Triton kernel in Triton's interpreter (a child pytest, since
TRITON_INTERPRET must be set before triton is imported; cases in tests/gemv_interpreter_cases.py)."""

import os
import subprocess
import sys
from pathlib import Path

import triton  # noqa: F401  (the test extra installs it: a missing triton fails here, never skips)

REPO = Path(__file__).resolve().parent.parent


def test_gemv_kernel_cases_pass_in_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(REPO / "tests" / "gemv_interpreter_cases.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
