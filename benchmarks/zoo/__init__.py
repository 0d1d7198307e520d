"""The model zoo of issue 14: models graphopt was not developed against, from five exporters.

``python -m benchmarks.zoo`` (from the repository root) builds every model from code and
configs with seeded random weights (no model hub), checks each export in onnxruntime and
caches it under ``benchmarks/.zoo/<name>/``:

* ``model.onnx``   the exported model, one file (no external data)
* ``inputs.npz``   the inputs it was checked with (what the benchmark feeds it)
* ``meta.json``    exporter, opset, node count, sizes, the export check

The torch exporters run in this interpreter; tf2onnx, paddle2onnx and jax2onnx each run in
their own virtual environment (see ``zoo-requirements.txt``) as a subprocess, so that none
of them becomes a dependency of graphopt. ``benchmarks/ZOO.md`` is the table of the zoo,
written by the build.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ZooEntry", "CACHE_DIR", "cached_models", "load_inputs"]

#: where the built models live (ignored by git); ``GRAPHOPT_ZOO_DIR`` moves it.
CACHE_DIR = Path(os.environ.get("GRAPHOPT_ZOO_DIR", Path(__file__).resolve().parent.parent / ".zoo"))


@dataclass(frozen=True)
class ZooEntry:
    """One built model of the zoo, as the cache holds it."""

    name: str
    path: Path          # model.onnx
    meta: dict[str, Any]

    @property
    def inputs_path(self) -> Path:
        return self.path.with_name("inputs.npz")


def cached_models(cache_dir: Path | None = None, names: list[str] | None = None) -> list[ZooEntry]:
    """The models built into ``cache_dir`` (sorted by name), optionally only ``names``."""
    root = Path(cache_dir or CACHE_DIR)
    entries = []
    for meta_path in sorted(root.glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        if meta.get("status") != "ok" or (names and meta["name"] not in names):
            continue
        entries.append(ZooEntry(meta["name"], meta_path.with_name("model.onnx"), meta))
    return entries


def load_inputs(entry: ZooEntry) -> dict[str, Any]:
    """The feeds the model was checked with, by input name."""
    import numpy as np

    with np.load(entry.inputs_path) as data:
        return {k: data[k] for k in data.files}
