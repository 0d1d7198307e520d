"""Write the table of onnxruntime kernels for one execution provider, from the
installed onnxruntime build itself (its registered kernel definitions).

    python -m graphopt.ops.snapshot_ort_kernels CPUExecutionProvider graphopt/ops/data/ort_cpu_kernels.json

The CPU table is made with the CPU build; the CUDA table needs onnxruntime-gpu, whose
registry benchmarks/snapshot_ort_cuda_kernels.sh reads on a machine without a GPU (with
stand-ins for the CUDA driver and TensorRT, whose absence otherwise crashes the listing). For each (domain, op) it records the element types
of the type constraint of the op's first input ("T" when unsure), for the newest
opset range of that op, and (under "ranges") every opset range the op has a kernel
for. graphopt.ops.targets reads the same table from the installed onnxruntime at run
time (`installed_kernels`, cached per onnxruntime build); the shipped file is what it
falls back to where the registry cannot be read.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["snapshot", "installed_kernels", "registry_providers"]

_DTYPES = {
    "tensor(float)": "f32", "tensor(float16)": "f16", "tensor(bfloat16)": "bf16", "tensor(double)": "f64",
    "tensor(int64)": "i64", "tensor(int32)": "i32", "tensor(int16)": "i16", "tensor(int8)": "i8",
    "tensor(uint64)": "u64", "tensor(uint32)": "u32", "tensor(uint16)": "u16", "tensor(uint8)": "u8",
    "tensor(bool)": "bool", "tensor(string)": "str",
}


def snapshot(provider: str) -> dict[str, object]:
    import onnxruntime
    import onnxruntime.capi._pybind_state as C

    first_input_constraint: dict[tuple[str, str], str] = {}
    # The types the op's schema allows for that constraint: a kernel may be registered for more
    # (SkipLayerNormalization's CPU kernel has double, its schema does not), and onnxruntime
    # refuses a model whose types the schema does not allow before it looks for a kernel.
    schema_allows: dict[tuple[str, str], tuple[int, set[str]]] = {}
    for schema in C.get_all_operator_schema():
        if schema.inputs:
            op = (schema.domain, schema.name)
            first_input_constraint[op] = schema.inputs[0].typeStr
            allowed = {t for c in schema.type_constraints if c.type_param_str == schema.inputs[0].typeStr for t in c.allowed_type_strs}
            if allowed and schema.since_version >= schema_allows.get(op, (-1, set()))[0]:
                schema_allows[op] = (schema.since_version, allowed)
    newest: dict[str, int] = {}  # (domain::op) -> first opset of its newest kernel range
    table: dict[str, set[str]] = {}
    ranges: dict[str, set[tuple[int, int]]] = {}
    # (domain::op) -> "lo-hi" -> element types of that opset range's kernels (an old range
    # may take fewer types than the newest: the CUDA provider's Clip-11 is float only)
    range_types: dict[str, dict[str, set[str]]] = {}
    for kernel in C.get_all_opkernel_def():
        if kernel.provider != provider:
            continue
        domain = "" if kernel.domain == "ai.onnx" else kernel.domain
        key = f"{domain}::{kernel.op_name}"
        ranges.setdefault(key, set()).add((int(kernel.version_range[0]), int(kernel.version_range[1])))
        constraint = first_input_constraint.get((kernel.domain, kernel.op_name), "T")
        types: list[str] = kernel.type_constraints.get(constraint) or kernel.type_constraints.get("T") or next(iter(kernel.type_constraints.values()), [])
        if (kernel.domain, kernel.op_name) in schema_allows and constraint in kernel.type_constraints:
            types = [t for t in types if t in schema_allows[(kernel.domain, kernel.op_name)][1]]
        span = f"{int(kernel.version_range[0])}-{int(kernel.version_range[1])}"
        range_types.setdefault(key, {}).setdefault(span, set()).update(_DTYPES.get(t, t) for t in types)
        since = kernel.version_range[0]
        if since > newest.get(key, -1):  # keep only the newest opset range
            newest[key], table[key] = since, set()
        if since == newest[key]:
            table[key].update(_DTYPES.get(t, t) for t in types)
    return {
        "onnxruntime": onnxruntime.__version__,
        "provider": provider,
        "kernels": {k: sorted(v) for k, v in sorted(table.items())},
        "ranges": {k: sorted(map(list, v)) for k, v in sorted(ranges.items())},
        "range_types": {k: {s: sorted(ts) for s, ts in sorted(v.items())} for k, v in sorted(range_types.items())},
    }


def registry_providers() -> frozenset[str]:
    """The providers whose kernels the installed onnxruntime build registers (and so lists)."""
    import onnxruntime.capi._pybind_state as C

    return frozenset(kernel.provider for kernel in C.get_all_opkernel_def())


def _cache_file(provider: str) -> Path | None:
    """Where the table of this onnxruntime build is cached: keyed by its version and the
    identity (path, size, mtime) of its native library, so an upgrade is never served old data."""
    try:
        import onnxruntime
        import onnxruntime.capi._pybind_state as C

        native = Path(C.__file__)
        stat = native.stat()
    except (ImportError, OSError, AttributeError):
        return None
    key = hashlib.sha256(f"{onnxruntime.__version__}|{native}|{stat.st_size}|{stat.st_mtime_ns}|{provider}|{_FORMAT}".encode()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "graphopt" / f"ort-kernels-{onnxruntime.__version__}-{provider}-{key}.json"


#: Bumped when the table's layout changes (cached files of another layout are not read).
_FORMAT = 2


def installed_kernels(provider: str) -> dict[str, Any] | None:
    """The kernel table (as `snapshot` makes it) of the installed onnxruntime for `provider`,
    or None where this build does not register that provider (the CUDA provider's
    kernels cannot be read from a CPU-only build) or onnxruntime cannot be imported.
    Reading the registry takes ~0.3 s; the result is cached on disk per build."""
    cache = _cache_file(provider)
    if cache is not None:
        try:
            cached = dict(json.loads(cache.read_text()))
            return None if cached.get("absent") else cached
        except (OSError, ValueError):
            pass
    try:
        table = _read_registry(provider)
    except ImportError:
        return None
    if table is None:
        return None
    if cache is not None:
        try:  # written whole, then renamed: a concurrent reader never sees half a file
            cache.parent.mkdir(parents=True, exist_ok=True)
            fd, staged = tempfile.mkstemp(dir=cache.parent, prefix=".ort-kernels-", suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                json.dump(table, handle)
            os.replace(staged, cache)
        except OSError:
            pass  # a read-only home: read the registry again next time
    return None if table.get("absent") else table


def _read_registry(provider: str) -> dict[str, Any] | None:
    """The table, read in this process for a CPU-only build. A build with other providers
    loads every provider library while it lists its kernels, and one whose dependencies are
    missing (TensorRT's on a machine without it) can crash the process: such a build is read
    in a child process, and a crash there means the shipped table is used (None)."""
    import onnxruntime

    if set(onnxruntime.get_available_providers()) <= {"CPUExecutionProvider"}:
        return snapshot(provider) if provider in registry_providers() else {"absent": True}
    code = (
        "import json, sys; from graphopt.ops.snapshot_ort_kernels import registry_providers, snapshot; "
        "p = sys.argv[1]; print(json.dumps(snapshot(p) if p in registry_providers() else {'absent': True}))"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code, provider], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return None


if __name__ == "__main__":
    provider, path = sys.argv[1], sys.argv[2]
    with open(path, "w") as f:
        json.dump(snapshot(provider), f, indent=0, sort_keys=True)
        f.write("\n")
