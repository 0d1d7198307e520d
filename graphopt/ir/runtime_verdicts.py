"""Graphs onnxruntime has loaded, remembered: the save's load check made once per graph.

The check (graphopt.ir.runtime_check) imports onnxruntime (~0.022 s) and makes one session
(~0.005 s) for every model written: ~0.03 s of a small model's ~0.25 s `graphopt optimize`
(benchmarks/RESULTS.md, 2026-11-28, session 8). Its verdict depends only on the graph it is
given (the skeleton's bytes), on how it makes the session (graphopt/ir/ort_graph_load.py)
and on the onnxruntime build that judges it. So a graph found loadable is remembered under
a digest of those three (onnxruntime's binaries by path, size and modification time, found
without importing it), and the next check of the same bytes by the same onnxruntime is
answered without importing onnxruntime. Only "it loads" is remembered: a refusal is checked
anew every time, with the input model's excuse as before.

The verdicts are empty files named by the digest beside the other caches ($XDG_CACHE_HOME
or ~/.cache, graphopt/ort-loads/); GRAPHOPT_NO_CACHE=1 turns this off, as it does the others.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path

from graphopt._digest import sha256

__all__ = ["known_to_load", "remember_loads", "onnxruntime_identity"]

#: Bumped when what a verdict means changes (the check's code is in the key too).
_FORMAT = b"graphopt ort load verdict 1"
#: The binaries of onnxruntime's Python package (its capi folder) that decide what it loads.
_BINARY_SUFFIXES = (".so", ".pyd", ".dll", ".dylib")


def onnxruntime_identity() -> bytes | None:
    """onnxruntime's binaries as this process would import them (paths, sizes, modification
    times), without importing it; None where it is not installed or not laid out as expected."""
    module = sys.modules.get("onnxruntime")
    try:
        imported: str | None = getattr(module, "__file__", None) if module is not None else None
        if imported:
            folder = os.path.dirname(imported)
        else:
            spec = importlib.util.find_spec("onnxruntime")
            if spec is None or not spec.submodule_search_locations:
                return None
            folder = str(list(spec.submodule_search_locations)[0])
        capi = os.path.join(folder, "capi")
        entries = sorted(
            (entry.name, entry.stat().st_size, entry.stat().st_mtime_ns)
            for entry in os.scandir(capi)
            if entry.is_file() and any(suffix in entry.name for suffix in _BINARY_SUFFIXES)
        )
    except (ImportError, ValueError, OSError):
        return None
    if not any(name.startswith("onnxruntime_pybind11_state") for name, _, _ in entries):
        return None
    return repr((os.path.realpath(capi), entries)).encode()


@lru_cache(maxsize=1)
def _check_code() -> bytes | None:
    """The source of the session the check makes (its options decide the verdict)."""
    try:
        return Path(__file__).with_name("ort_graph_load.py").read_bytes()
    except OSError:
        return None  # installed without its sources: no key to trust


def _marker(skeleton: bytes) -> Path | None:
    if os.environ.get("GRAPHOPT_NO_CACHE") == "1":
        return None
    runtime, check = onnxruntime_identity(), _check_code()
    if runtime is None or check is None:
        return None
    key = sha256()
    for part in (_FORMAT, check, runtime, skeleton):
        key.update(len(part).to_bytes(8, "little"))
        key.update(part)
    try:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "graphopt" / "ort-loads"
    except (RuntimeError, KeyError):  # no home folder to be found: nothing remembered
        return None
    return root / key.hexdigest()[:40]


def known_to_load(skeleton: bytes) -> bool:
    """Whether this onnxruntime loaded these exact graph bytes before (as the check makes its session)."""
    marker = _marker(skeleton)
    return marker is not None and marker.is_file()


def remember_loads(skeleton: bytes) -> None:
    """Remember that onnxruntime loaded these graph bytes (quietly not, where the cache cannot be written)."""
    marker = _marker(skeleton)
    if marker is None:
        return
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass  # a read-only home: the check is made again next time
