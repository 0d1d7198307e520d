"""`--tune`: time a decision's candidates on the target's execution provider, and remember.

A candidate is an ONNX model (a subgraph cut around the decision's site, or the whole
model in each form) with its inputs. `OrtTimer` runs it in onnxruntime as users do
(ORT_ENABLE_ALL) and returns the median of its timed runs. Results are cached by
decision, site signature, candidate, provider, device and onnxruntime version in a JSON
file under the user's cache folder (`GRAPHOPT_CACHE_DIR`, else `$XDG_CACHE_HOME/graphopt`,
else `~/.cache/graphopt`), so a second run of the same model times nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Timer", "OrtTimer", "TuneCache", "default_cache_path", "device_name", "provider_present", "EP_OF_TARGET"]

#: The execution provider each target is built for (targets without one make no decisions).
EP_OF_TARGET: dict[str, str] = {"ort-cuda": "CUDAExecutionProvider", "ort-cpu": "CPUExecutionProvider"}

#: A timer: (model bytes, feeds, provider) -> median milliseconds per run.
Timer = Callable[[bytes, Mapping[str, np.ndarray], str], float]


class OrtTimer:
    """Median wall time of session.run calls after `warmup`, with onnxruntime's own graph
    optimizations on (ORT_ENABLE_ALL), as the model will run in the field: at least `runs`
    calls and at least `min_time_s` of them (small ops need many runs for a stable median)."""

    def __init__(self, warmup: int = 3, runs: int = 15, min_time_s: float = 0.2, max_runs: int = 2000) -> None:
        self.warmup = warmup
        self.runs = runs
        self.min_time_s = min_time_s
        self.max_runs = max_runs

    def __call__(self, model: bytes, feeds: Mapping[str, np.ndarray], provider: str) -> float:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 4
        providers: list[Any] = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
        session = ort.InferenceSession(model, options, providers=providers)
        for _ in range(self.warmup):
            session.run(None, dict(feeds))
        times: list[float] = []
        while len(times) < self.runs or (sum(times) < self.min_time_s * 1e3 and len(times) < self.max_runs):
            t0 = time.perf_counter()
            session.run(None, dict(feeds))
            times.append((time.perf_counter() - t0) * 1e3)
        import statistics  # only --tune times anything: its import (decimal, fractions) stays off the start-up

        return float(statistics.median(times))


def provider_present(ep: str) -> bool:
    import onnxruntime as ort

    return ep in ort.get_available_providers()


@lru_cache(maxsize=4)
def device_name(ep: str) -> str:
    """The device a timing belongs to: the GPU's name for CUDA, the CPU's model otherwise."""
    if ep == "CUDAExecutionProvider":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
            name = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
        except (OSError, subprocess.SubprocessError):
            name = ""
        return name or "cuda"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def default_cache_path() -> Path:
    base = os.environ.get("GRAPHOPT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "graphopt"
    )
    return Path(base) / "tune-cache.json"


class TuneCache:
    """Measured milliseconds by key, in one JSON file (written atomically; a damaged file is ignored)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self._data: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            try:
                data = json.loads(self.path.read_text())
                self._data = data if isinstance(data, dict) and isinstance(data.get("times_ms"), dict) else {"times_ms": {}}
            except (OSError, ValueError):
                self._data = {"times_ms": {}}
        return self._data

    def get(self, key: str) -> float | None:
        value = self._load()["times_ms"].get(key)
        return float(value) if isinstance(value, (int, float)) else None

    def put(self, key: str, ms: float) -> None:
        data = self._load()
        data["times_ms"][key] = ms
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tune-cache-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache that cannot be written only costs time on the next run
