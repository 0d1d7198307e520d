"""Ending the `graphopt` process without tearing the interpreter down.

Once a command is done, the interpreter's shutdown still tears down the ~500 modules the
command imported (numpy, onnx, onnx-ir, onnxruntime): some 0.02 s of a small model's
0.4 s, for nothing the user sees. `exit_process` does what matters of that shutdown
itself (the `atexit` functions, which also run the `weakref.finalize` callbacks that
remove temporary folders, and logging's flush; then stdout and stderr are flushed) and
ends the process with `os._exit`.

It falls back to the ordinary exit wherever that could differ: another Python thread is
still running (the ordinary exit waits for it), the exit code is not a number (Python
prints it), or flushing stdout or stderr fails (a closed pipe: Python reports it and
exits 120). graphopt's own files are closed and renamed before a command returns; the
command line's entry points (`graphopt`, `python -m graphopt`) use this, `graphopt.cli.main`
(which tests and embedders call) does not.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

__all__ = ["exit_process", "exit_code"]


def exit_code(error: SystemExit) -> int | None:
    """The process's exit status for this SystemExit, or None where Python would print the code."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int) and -(1 << 31) <= code < (1 << 31):  # the OS keeps the low byte
        return code & 0xFF
    return None


def exit_process(error: SystemExit) -> NoReturn:
    """End the process as `raise error` would, without the interpreter's teardown where that is safe."""
    code = exit_code(error)
    if code is None or threading.active_count() > 1:
        raise error
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        raise error from None  # Python's own exit reports the broken stream
    os._exit(code)
