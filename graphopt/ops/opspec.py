"""The declaration types of the op registry (graphopt/ops/registry.py has the lookup).

An `OpSpec` says everything graphopt knows about one op: inputs, outputs, attributes with
types and defaults, a shape inference function, how each target lowers it, and facts
the passes read (`FACTS`). graphopt/ops/fused_ops.py declares graphopt's own ops with
these types, graphopt/ops/standard_ops.py the facts of the standard ops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphopt.pattern.ir import MISSING

__all__ = ["GRAPHOPT_DOMAIN", "MS_DOMAIN", "FACTS", "Input", "Output", "Attribute", "Lowering", "Contract", "UNKNOWN_SHAPE", "is_given", "known_shape", "unproven", "InferContext", "InferFn", "OpSpec", "facts"]

GRAPHOPT_DOMAIN = "graphopt"
MS_DOMAIN = "com.microsoft"

#: What a declaration may say about an op, and who reads it.
FACTS: Mapping[str, str] = {
    "commutative": "swapping its two inputs gives the same result bit for bit (CSE)",
    "broadcasting": "its output has the broadcast shape of its inputs (symbolic shapes, layout)",
    "same_shape": "its first output has its first input's shape (symbolic shapes)",
    "elementwise": "applies to each element alone: computes the same in any layout (layout; implies same_shape)",
    "reduce": "a Reduce* op: axes and keepdims (layout)",
    "moves_data": "copies, selects or rearranges its first input's elements: same dtype, same values (driver, --verify's inputs)",
    "nan_order_sensitive": "its result over a NaN depends on the implementation (constant folding)",
    "unbounded_output": "its output size cannot be bounded from its inputs' sizes (constant folding)",
    "never_folded": "constant folding leaves it as it is, constant inputs or not (constant folding)",
    "non_deterministic": "not a function of its inputs: never folded, never merged (folding, CSE)",
    "never_merged": "CSE leaves equal copies apart: each one belongs to a unit another tool matches (CSE)",
    "keep_fp32": "kept in float32 by --precision fp16/bf16 unless the user says otherwise (precision)",
    "attribute_typed": "an attribute sets its float output type (precision)",
    "follows_inputs": "stays float32 when its float inputs are float32 (precision)",
    "heavy": "its precision decides a fusion's worth (precision)",
    "recurrent": "a recurrent op over a sequence: its precision is the recurrent_precision decision (precision)",
    "nhwc_internal_pool": "onnxruntime's CUDA provider has an NHWC kernel in com.ms.internal.nhwc (layout)",
    "slower_on_ort_cpu": "onnxruntime's CPU kernel runs slower than the standard ops a rule would replace with it, measured: not emitted for ort-cpu (driver)",
    "torch_beats_inductor": "its torch custom kernel beats inductor's code for the ops it replaces, measured (torch backend)",
}


@dataclass(frozen=True)
class Input:
    name: str
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class Output:
    """`dtype`: the index of the input whose dtype it has, or a fixed dtype name ("f32")."""

    name: str
    optional: bool = False
    dtype: int | str = 0


@dataclass(frozen=True)
class Attribute:
    """`type` is onnx's attribute type name ("INT", "FLOAT", "STRING", "INTS", ...); `default`
    is MISSING for a required attribute; `choices` lists the values a kernel accepts, where limited."""

    name: str
    type: str
    default: Any = MISSING
    choices: tuple[Any, ...] = ()


# What a kernel accepts beyond its dtypes, where it is pickier than its schema:
# check(attributes, input shapes) -> None, or why not. `shapes` has one entry per input up
# to the last one given: None for an omitted optional input, UNKNOWN_SHAPE for an input
# that is given but whose shape is not known, else its dims (ints, names of symbolic dims,
# None for an unknown dim). A contract that needs a dim refuses when it is not known
# (`unproven`): an unknown shape proves nothing.
Contract = Callable[[Mapping[str, Any], Sequence[Any]], "str | None"]


class _UnknownShape:
    """The type of UNKNOWN_SHAPE (one instance)."""

    def __repr__(self) -> str:
        return "UNKNOWN_SHAPE"


#: In a contract's `shapes`: the input is given, its shape is not known.
UNKNOWN_SHAPE = _UnknownShape()


def is_given(shapes: Sequence[Any], index: int) -> bool:
    """Whether the input at `index` is given (its shape known or not)."""
    return index < len(shapes) and shapes[index] is not None


def known_shape(shapes: Sequence[Any], index: int) -> tuple[Any, ...] | None:
    """The input's dims, or None when it is omitted or its shape is unknown (is_given tells which)."""
    shape = shapes[index] if index < len(shapes) else None
    return None if shape is None or shape is UNKNOWN_SHAPE else tuple(shape)


def unproven(name: str, what: str) -> str:
    """A contract's refusal where the dims it needs are not known."""
    return f"shape of input {name} unknown: cannot prove {what}"


@dataclass(frozen=True)
class Lowering:
    """How one graphopt op becomes a target's op.

    ``inputs`` lists, for each input slot of the target op, the graphopt op's
    input index or None for an omitted optional input (None: same inputs in the
    same order). ``rename`` maps a graphopt attribute to the target's names for
    it (an empty tuple drops it); other attributes keep their names. ``explicit``
    names attributes written with the graphopt op's default where the node omits
    them (the target's op has another default). ``contract`` checks what the
    target's kernel accepts beyond its dtypes.
    """

    domain: str
    op_type: str
    inputs: tuple[int | None, ...] | None = None
    rename: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    explicit: tuple[str, ...] = ()
    contract: Contract | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)


class InferContext:
    """What an inference function sees of a node: its inputs' shapes (lists of dims:
    ints, sympy expressions or None, as the caller has them; None when unknown), and its
    attributes with the declared defaults filled in."""

    def __init__(self, op: OpSpec, shapes: Callable[[int], Sequence[Any] | None], attrs: Callable[[str], Any], num_inputs: int) -> None:
        self.op, self._shapes, self._attrs, self.num_inputs = op, shapes, attrs, num_inputs

    def shape(self, index: int) -> list[Any] | None:
        if index >= self.num_inputs:
            return None
        found = self._shapes(index)
        return None if found is None else list(found)

    def attr(self, name: str) -> Any:
        """The attribute's value, else its declared default, else None."""
        value = self._attrs(name)
        if value is MISSING or value is None:
            value = self.op.default(name)
        return None if value is MISSING else value


#: infer(context) -> one shape per output (None where unknown).
InferFn = Callable[[InferContext], list[list[Any] | None]]


@dataclass(frozen=True)
class OpSpec:
    domain: str
    name: str
    doc: str = ""
    inputs: tuple[Input, ...] = ()
    outputs: tuple[Output, ...] = ()
    attributes: tuple[Attribute, ...] = ()
    infer: InferFn | None = field(default=None, compare=False)
    #: target name ("onnx", "ort-cpu", "ort-cuda") -> how that target runs it.
    lowerings: Mapping[str, Lowering] = field(default_factory=dict)
    facts: frozenset[str] = frozenset()
    #: outputs that stay float32 whatever the input type (statistics in the stash type).
    fp32_outputs: tuple[int, ...] = ()
    #: inputs the kernel reads as float32 whatever the type of the others (a float16 model keeps them float32).
    fp32_inputs: tuple[int, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.domain}.{self.name}" if self.domain else self.name

    def attribute(self, name: str) -> Attribute | None:
        return next((a for a in self.attributes if a.name == name), None)

    def default(self, name: str) -> Any:
        """The attribute's declared default, MISSING when it has none (or is not declared)."""
        attr = self.attribute(name)
        return MISSING if attr is None else attr.default


def facts(*names: str) -> frozenset[str]:
    """A declaration's facts, each checked against FACTS."""
    unknown = set(names) - set(FACTS)
    if unknown:
        raise ValueError(f"unknown facts {sorted(unknown)} (known: {', '.join(FACTS)})")
    return frozenset(names)
