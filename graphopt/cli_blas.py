"""numpy for the command line, imported with one BLAS thread.

numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins for a
while waiting for work that graphopt never gives it (the command line's numpy work is
constant folding and weight packing, elementwise or small). On a small model that is
~0.07 s of CPU on the other cores; where those cores are busy (a shared machine, a CI
runner, parallel jobs) the spinning threads take turns with graphopt's own thread and the
run's wall time grows with them (0.365 s against 0.505 s, median of 11, on a 2-core
machine at load 4; benchmarks/RESULTS.md, 2026-11-28). One thread also makes a folded
MatMul's bits independent of the machine's core count.

The thread count is read once, when OpenBLAS loads: it is set for numpy's import only,
and the environment is put back at once, so processes the command starts see the
user's. A user's own OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS is kept.
"""

from __future__ import annotations

import os
import sys

__all__ = ["import_numpy_single_threaded", "BLAS_THREAD_VARIABLES"]

#: What OpenBLAS reads for its thread count (the first set wins); any of them set: the user's choice.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def import_numpy_single_threaded() -> None:
    """Import numpy with one OpenBLAS thread, unless it is imported already or the user chose a count."""
    if "numpy" in sys.modules or any(name in os.environ for name in BLAS_THREAD_VARIABLES):
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)
