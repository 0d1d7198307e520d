"""The op registry: every op graphopt knows, declared once, and how to look it up.

* graphopt's own fused ops (domain ``graphopt``) are declared in graphopt/ops/fused_ops.py:
  inputs, outputs, attributes with types and defaults, shape inference, and how each
  target lowers them (with the kernel's contract). Their torch lowerings register here
  from graphopt/ops/torch_fused.py (`register_torch_lowering`).
* standard ops graphopt reasons about are in graphopt/ops/standard_ops.py: their facts
  (`FACTS`). Their inputs and attributes are onnx's schemas, read here from `onnx.defs`.

The declaration types are in graphopt/ops/opspec.py. Readers: the matcher and the torch
lowering (attribute defaults), the targets (lowerings, contracts), symbolic shapes
(inference), CSE, constant folding, the driver, the precision and layout passes (facts),
the torch backend, and `graphopt ops`.

    spec("graphopt", "SkipLayerNorm").default("epsilon")   -> 1e-12
    has_fact("", "Add", "commutative")                     -> True
    names_with("keep_fp32")                                -> frozenset({"ReduceMean", ...})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache, lru_cache
from typing import Any

import onnx

from graphopt.ops.fused_ops import FUSED_OPS
from graphopt.ops.opspec import (
    FACTS,
    GRAPHOPT_DOMAIN,
    MS_DOMAIN,
    Attribute,
    Contract,
    InferContext,
    InferFn,
    Input,
    Lowering,
    OpSpec,
    Output,
)
from graphopt.ops.standard_ops import STANDARD_OPS
from graphopt.pattern.ir import MISSING

__all__ = [
    "GRAPHOPT_DOMAIN",
    "MS_DOMAIN",
    "FACTS",
    "Input",
    "Output",
    "Attribute",
    "Lowering",
    "Contract",
    "InferContext",
    "InferFn",
    "OpSpec",
    "spec",
    "graphopt_ops",
    "declared_ops",
    "has_fact",
    "names_with",
    "ops_with",
    "fp32_outputs",
    "fp32_inputs",
    "attribute_default",
    "standard_attribute_default",
    "with_defaults",
    "lowerings_for",
    "contracts_for",
    "register_torch_lowering",
    "torch_lowerings",
]


def _index(specs: Iterable[OpSpec]) -> dict[tuple[str, str], OpSpec]:
    table: dict[tuple[str, str], OpSpec] = {}
    for op in specs:
        key = (op.domain, op.name)
        if key in table:
            raise ValueError(f"{op.qualified} is declared twice")
        table[key] = op
    return table


_DECLARED = _index((*FUSED_OPS, *STANDARD_OPS))
_TORCH: dict[str, Any] = {}


def _norm(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def spec(domain: str, op_type: str) -> OpSpec | None:
    """What graphopt knows of (domain, op_type); a standard ONNX op comes with onnx's
    signature (newest version) and the facts standard_ops.py states. None when unknown."""
    domain = _norm(domain)
    if domain == "":
        return _standard(op_type)
    return _DECLARED.get((domain, op_type))


def graphopt_ops() -> list[OpSpec]:
    """graphopt's own ops, by name."""
    return sorted((s for (d, _), s in _DECLARED.items() if d == GRAPHOPT_DOMAIN), key=lambda s: s.name)


def declared_ops() -> list[OpSpec]:
    """Every declaration (graphopt's ops, and the standard ops graphopt states facts about)."""
    return list(_DECLARED.values())


def has_fact(domain: str, op_type: str, fact: str) -> bool:
    return (_norm(domain), op_type) in _with(fact)


def ops_with(fact: str) -> frozenset[tuple[str, str]]:
    """The (domain, op) keys of the ops that have `fact` (one of FACTS)."""
    return _with(fact)


def names_with(fact: str, domain: str = "") -> frozenset[str]:
    """The names of the ops of `domain` that have `fact` (one of FACTS)."""
    return frozenset(op for d, op in _with(fact) if d == domain)


@cache
def _with(fact: str) -> frozenset[tuple[str, str]]:
    if fact not in FACTS:
        raise KeyError(f"unknown fact {fact!r} (known: {', '.join(FACTS)})")
    return frozenset(key for key, s in _DECLARED.items() if fact in s.facts)


def fp32_outputs(domain: str, op_type: str) -> frozenset[int]:
    """Outputs of the op that stay float32 whatever its input type."""
    found = _DECLARED.get((_norm(domain), op_type))
    return frozenset(found.fp32_outputs) if found is not None else frozenset()


def fp32_inputs(domain: str, op_type: str) -> frozenset[int]:
    """Inputs of the op its kernel reads as float32 whatever the other inputs' type."""
    found = _DECLARED.get((_norm(domain), op_type))
    return frozenset(found.fp32_inputs) if found is not None else frozenset()


def attribute_default(domain: str, op_type: str, name: str) -> Any:
    """The declared default of a graphopt op's attribute, else MISSING (a standard op's:
    `standard_attribute_default`)."""
    found = _DECLARED.get((domain, op_type)) if domain == GRAPHOPT_DOMAIN else None
    return MISSING if found is None else found.default(name)


@lru_cache(maxsize=4096)
def standard_attribute_default(op_type: str, name: str, opset: int, domain: str = "") -> Any:
    """The default of an ONNX op's attribute at `opset`, from onnx's schema (the standard
    domain, or another one onnx defines); else MISSING."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, _norm(domain))
    except onnx.defs.SchemaError:
        return MISSING
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.name:
        return MISSING
    value = onnx.helper.get_attribute_value(attr.default_value)
    return value.decode() if isinstance(value, bytes) else value


def with_defaults(op_type: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A graphopt op's attributes with the declared defaults filled in where omitted."""
    found = _DECLARED.get((GRAPHOPT_DOMAIN, op_type))
    filled = {a.name: a.default for a in (found.attributes if found else ()) if a.default is not MISSING}
    filled.update(attrs)
    return filled


def lowerings_for(target: str) -> dict[str, Lowering]:
    """graphopt op name -> its lowering on `target` ("onnx", "ort-cpu", "ort-cuda")."""
    return {s.name: s.lowerings[target] for s in graphopt_ops() if target in s.lowerings}


def contracts_for(target: str) -> dict[tuple[str, str], Contract]:
    """Lowered (domain, op) -> the contract of its kernel on `target`."""
    return {low.key: low.contract for low in lowerings_for(target).values() if low.contract is not None}


def register_torch_lowering(name: str, lowering: Any) -> None:
    """Called by graphopt.ops.torch_fused for each graphopt op it lowers onto torch."""
    if (GRAPHOPT_DOMAIN, name) not in _DECLARED:
        raise ValueError(f"a torch lowering for graphopt.{name}, which graphopt/ops/fused_ops.py does not declare")
    _TORCH[name] = lowering


def torch_lowerings() -> Mapping[str, Any]:
    """graphopt op name -> its torch lowering (GraphoptLowering), filled when
    graphopt.ops.torch_lowering is imported."""
    return _TORCH


# --------------------------------------------------------------------------- standard ops from onnx

@lru_cache(maxsize=1024)
def _standard(op_type: str) -> OpSpec | None:
    declared = _DECLARED.get(("", op_type))
    try:
        schema = onnx.defs.get_schema(op_type, onnx.defs.onnx_opset_version(), "")
    except onnx.defs.SchemaError:
        return declared  # onnxruntime's own default-domain ops (SimplifiedLayerNormalization)
    return onnx_signature(schema, declared)


def onnx_signature(schema: onnx.defs.OpSchema, base: OpSpec | None = None) -> OpSpec:
    """A spec with the inputs, outputs and attributes of an onnx OpSchema, and `base`'s facts."""
    option = onnx.defs.OpSchema.FormalParameterOption
    attributes = []
    for attr in schema.attributes.values():
        default = onnx.helper.get_attribute_value(attr.default_value) if attr.default_value.name else MISSING
        if isinstance(default, bytes):
            default = default.decode()
        type_name = str(attr.type.name)  # type: ignore[attr-defined]  # a pybind enum: its stubs lack .name
        attributes.append(Attribute(attr.name, type_name, default))
    return OpSpec(
        domain="",
        name=schema.name,
        doc=base.doc if base is not None else "",
        inputs=tuple(Input(p.name, p.option == option.Optional, p.option == option.Variadic) for p in schema.inputs),
        outputs=tuple(Output(p.name, p.option == option.Optional) for p in schema.outputs),
        attributes=tuple(attributes),
        facts=base.facts if base is not None else frozenset(),
        fp32_outputs=base.fp32_outputs if base is not None else (),
        fp32_inputs=base.fp32_inputs if base is not None else (),
    )
