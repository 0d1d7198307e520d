"""onnxruntime's load check (graphopt.ir.runtime_check) in a helper process started early.

A small model's `graphopt optimize` spends ~0.03 s of its ~0.35 s on the load check
before writing: importing onnxruntime (~25 ms, most of it loading its library) and one
session (~5 ms). Neither can overlap graphopt's work inside one process (the import
holds the interpreter's lock), but a helper process can import onnxruntime on another
core while graphopt loads and optimizes the model; at the save, the check is one
request to it. The command line starts the helper (`started_in_background`) when asked
to (GRAPHOPT_BACKGROUND_CHECK=1; `worth_starting` says why not by default) for a run that
would not import onnxruntime itself anyway.

The check is the same one: the same skeleton bytes (built in this process), the same
session options, made by the same function (graphopt.ir.ort_graph_load) in an
onnxruntime the helper imported from this process's `sys.path` and whose file it names
(the check uses the helper only where that is the file this process would import).
Wherever the helper is not there or not usable (it could not start or import
onnxruntime, it named another onnxruntime, it died or answered nonsense), the check runs
in this process exactly as it does without a helper.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["RuntimeCheckWorker", "started_in_background", "background_ready", "background_load_error", "worth_starting", "NOT_ANSWERED"]

#: What `RuntimeCheckWorker.check` returns when the helper cannot answer (the caller checks in its own process).
NOT_ANSWERED = "\0not answered"

_SCRIPT = Path(__file__).with_name("ort_graph_load.py")


class RuntimeCheckWorker:
    """A helper process importing onnxruntime, then making load checks on request."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process: subprocess.Popen[bytes] | None = process
        self._ready: bool | None = None  # None: its first line not read yet

    @classmethod
    def start(cls) -> RuntimeCheckWorker | None:
        """Start the helper (it imports onnxruntime while the caller goes on), or None where it cannot start."""
        if getattr(sys, "frozen", False) or not sys.executable:
            return None  # no Python interpreter to run the script with
        # -I -S: no site, no user site, no PYTHON* variables; the helper takes this process's sys.path.
        # (Only str entries: the import system skips the others too.)
        command = [sys.executable, "-I", "-S", str(_SCRIPT), json.dumps([entry for entry in sys.path if isinstance(entry, str)])]
        # Its numpy (imported by onnxruntime) does no linear algebra: no BLAS threads to start.
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        except (OSError, ValueError):
            return None
        return cls(process)

    def check(self, model: bytes | str) -> str | None:
        """onnxruntime's refusal of the model (bytes or a path), None if it loads, or
        NOT_ANSWERED where the helper could not answer (it is then closed)."""
        process = self._process
        if process is None or not self.is_ready():
            return NOT_ANSWERED
        assert process.stdin is not None and process.stdout is not None
        try:
            if isinstance(model, str):
                process.stdin.write(json.dumps({"path": model}).encode() + b"\n")
            else:
                process.stdin.write(json.dumps({"bytes": len(model)}).encode() + b"\n")
                process.stdin.write(model)
            process.stdin.flush()
            answer = _read_message(process.stdout)
        except (OSError, ValueError):
            answer = None
        if answer is None or "error" not in answer or not isinstance(answer["error"], (str, type(None))):
            self.close()
            return NOT_ANSWERED
        return answer["error"]

    def is_ready(self) -> bool:
        """The helper imported the onnxruntime this process would import (waits for its import)."""
        if self._ready is None:
            process = self._process
            if process is None or process.stdout is None:
                return False
            hello = _read_message(process.stdout)
            self._ready = hello is not None and hello.get("onnxruntime") is not None and hello["onnxruntime"] == _own_onnxruntime_file()
            if not self._ready:
                self.close()
        return self._ready

    def close(self) -> None:
        """End the helper (it holds nothing to clean up: no files, a session only while it answers)."""
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        process.kill()
        process.wait()


def _read_message(stream: IO[bytes]) -> dict[str, object] | None:
    try:
        line = stream.readline()
        message = json.loads(line) if line else None
    except (OSError, ValueError):
        return None
    return message if isinstance(message, dict) else None


def _own_onnxruntime_file() -> str | None:
    """The onnxruntime this process imports (or has imported): its __init__'s path."""
    module = sys.modules.get("onnxruntime")
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def worth_starting() -> bool:
    """Only when asked for (GRAPHOPT_BACKGROUND_CHECK=1), with at least two CPUs for this
    process, and onnxruntime installed but not imported yet (else the check here costs a
    session only).

    Off by default: on the project's 2-core machine the helper (~0.1 s of CPU: an interpreter,
    numpy, onnxruntime) made the run slower in median at every load measured, 0.39 against
    0.35 s at load ~1 and 0.65 against 0.50 s at load 2.5 (benchmarks/RESULTS.md, 2026-11-28),
    although it takes ~0.03 s off this process's own CPU time and its best runs were the
    fastest: it pays only where a core is really free."""
    if os.environ.get("GRAPHOPT_BACKGROUND_CHECK") != "1":
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus >= 2 and "onnxruntime" not in sys.modules and _own_onnxruntime_file() is not None


_active: RuntimeCheckWorker | None = None


@contextmanager
def started_in_background(enabled: bool = True) -> Iterator[RuntimeCheckWorker | None]:
    """While inside, load checks go to a helper process (started here, if `enabled` and
    `worth_starting()`); it is ended on the way out."""
    global _active
    worker = RuntimeCheckWorker.start() if enabled and _active is None and worth_starting() else None
    if worker is None:
        yield None
        return
    _active = worker
    try:
        yield worker
    finally:
        _active = None
        worker.close()


def background_ready() -> bool:
    """Whether a helper runs and imported this process's onnxruntime (waits for its import)."""
    return _active is not None and _active.is_ready()


def background_load_error(model: bytes | str) -> str | None:
    """The helper's answer for the model, or NOT_ANSWERED where there is no usable helper."""
    return _active.check(model) if _active is not None else NOT_ANSWERED
