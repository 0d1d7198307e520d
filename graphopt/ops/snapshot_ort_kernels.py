"""Write the table of onnxruntime kernels for one execution provider, from the
installed onnxruntime build itself (its registered kernel definitions).

    python -m graphopt.ops.snapshot_ort_kernels CPUExecutionProvider graphopt/ops/data/ort_cpu_kernels.json

The CPU table is made with the CPU build; the CUDA table needs onnxruntime-gpu
(run it on the GPU machine). For each (domain, op) it records the element types
of the type constraint of the op's first input ("T" when unsure), for the newest
opset range of that op.
"""

from __future__ import annotations

import json
import sys

__all__ = ["snapshot"]

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
    for kernel in C.get_all_opkernel_def():
        if kernel.provider != provider:
            continue
        domain = "" if kernel.domain == "ai.onnx" else kernel.domain
        key = f"{domain}::{kernel.op_name}"
        constraint = first_input_constraint.get((kernel.domain, kernel.op_name), "T")
        types: list[str] = kernel.type_constraints.get(constraint) or kernel.type_constraints.get("T") or next(iter(kernel.type_constraints.values()), [])
        if (kernel.domain, kernel.op_name) in schema_allows and constraint in kernel.type_constraints:
            types = [t for t in types if t in schema_allows[(kernel.domain, kernel.op_name)][1]]
        since = kernel.version_range[0]
        if since > newest.get(key, -1):  # keep only the newest opset range
            newest[key], table[key] = since, set()
        if since == newest[key]:
            table[key].update(_DTYPES.get(t, t) for t in types)
    return {
        "onnxruntime": onnxruntime.__version__,
        "provider": provider,
        "kernels": {k: sorted(v) for k, v in sorted(table.items())},
    }


if __name__ == "__main__":
    provider, path = sys.argv[1], sys.argv[2]
    with open(path, "w") as f:
        json.dump(snapshot(provider), f, indent=0, sort_keys=True)
        f.write("\n")
