"""Random valid ONNX models for differential fuzzing, as hypothesis strategies.

Uniformly random ops almost never form the subgraphs graphopt's rules match, so
the generator builds models out of *motifs*: the shapes the rules look for
(Conv -> BatchNormalization, MatMul -> Add, the decomposed LayerNormalization,
attention's MatMul -> scale -> mask -> Softmax -> MatMul, Cast chains, Pad -> Conv,
GELU and SiLU written out, Shape/Gather/Concat -> Reshape, ...), each drawn with
random variations, some of which make the rule's preconditions false (a Pad that is
not zero, a Softmax over the wrong axis, a mask that grows the scores, a lossy Cast
chain, weights that are graph inputs). Motifs take their inputs from values earlier
motifs made (so they glue into one graph) or from new graph inputs, initializers or
Constant nodes. At the end, random interior values get extra users or become graph
outputs, so the single-use checks of the rules are exercised too.

Every draw goes through hypothesis (structure) or a numpy generator seeded by one
hypothesis draw (tensor contents), so failures shrink and replay.

    from fuzz.graphs import fuzz_cases
    @given(fuzz_cases())
    def test_something(case): case.model, case.feeds()

The generator computes every shape itself (it needs them to glue motifs);
`test_generated_shapes_match_onnx_shape_inference` in tests/test_fuzz_differential.py
checks those against onnx's strict shape inference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper, numpy_helper

__all__ = ["FuzzCase", "InputSpec", "GraphBuilder", "MOTIFS", "fuzz_cases", "OPSETS"]

#: Default-domain opsets the generator writes (13: Softmax over one axis, Split sizes as an input).
OPSETS = (13, 15, 17, 18, 20, 21, 23)

#: Added to some float inputs: a mean far from zero, where E[x^2] - E[x]^2 loses ~6 digits in float32.
OFFSET = 1000.0

F32, F64, F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
I32, I64, BOOL = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)
Shape = tuple[int, ...]


@dataclass(frozen=True)
class Val:
    """A value of the graph being built: name, element type, concrete shape, and where it comes from."""

    name: str
    dtype: np.dtype
    shape: Shape
    origin: str  # "input", "const" or "node"


@dataclass(frozen=True)
class InputSpec:
    """A graph input: its concrete shape and what kind of random values it gets."""

    name: str
    dtype: np.dtype
    shape: Shape
    #: "normal", "offset" (normal + OFFSET), "positive", "wide" (large magnitudes, for Cast chains),
    #: "mostly_true", "bool", "small_int".
    values: str = "normal"


@dataclass
class FuzzCase:
    """One generated model and how to feed it."""

    model: onnx.ModelProto
    inputs: list[InputSpec]
    motifs: list[str]
    seed: int

    def feeds(self, run: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, run])
        return {spec.name: _random_array(rng, spec) for spec in self.inputs}

    def input_magnitude(self) -> float:
        """How large the float inputs get: rounding errors of the original model grow with it."""
        return OFFSET if any(spec.values == "offset" for spec in self.inputs) else 1.0

    def input_shapes(self) -> dict[str, list[int]]:
        return {spec.name: list(spec.shape) for spec in self.inputs}

    def describe(self) -> str:
        """The model as text, for failure messages."""
        try:
            text = onnx.printer.to_text(self.model)
        except Exception:  # noqa: BLE001 - the printer rejects some odd models; fall back to protobuf text
            text = str(self.model.graph)
        return f"motifs: {', '.join(self.motifs)}; seed {self.seed}\n{text}"


def _random_array(rng: np.random.Generator, spec: InputSpec) -> np.ndarray:
    return np.asarray(_random_values(rng, spec))  # numpy gives a scalar, not an array, for shape ()


def _random_values(rng: np.random.Generator, spec: InputSpec) -> Any:
    shape, dtype = spec.shape, spec.dtype
    if dtype == BOOL:
        return rng.random(shape) < (0.9 if spec.values == "mostly_true" else 0.5)
    if dtype.kind in "iu":
        if spec.values == "wide":
            bound = 2**60 if dtype == I64 else 2**31 - 1
            return rng.integers(-bound, bound, shape, dtype=dtype)
        return rng.integers(0, 8, shape).astype(dtype)
    array = rng.standard_normal(shape)
    if spec.values == "positive":
        array = np.abs(array) + 0.5
    elif spec.values == "offset":  # activations with a large mean: what one-pass variances get wrong
        array = array + OFFSET
    elif spec.values == "wide":
        # Past float16's range and float32's integers, below int32's range (a float -> int Cast
        # of a value out of range is undefined, so no value is).
        array = array * rng.choice([1.0, 300.0, 1e5], size=shape) + rng.integers(-3, 4, shape)
    with np.errstate(over="ignore"):  # float16 overflows to infinity, as a model's Cast would
        return array.astype(dtype)


# ---------------------------------------------------------------------------- builder


class GraphBuilder:
    """Accumulates nodes, inputs and constants; every structural choice is a hypothesis draw."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any], opset: int, seed: int) -> None:
        self.draw = draw
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[InputSpec] = []
        self.values: dict[str, Val] = {}
        self.const_arrays: dict[str, np.ndarray] = {}
        self.uses: dict[str, int] = {}
        self.motifs: list[str] = []
        #: Set per motif: draw only the forms the rules match (about half the motifs), so that
        #: rules fire often; the other half also draws the variations that must not fuse.
        self.canonical = False
        self._counter = 0

    # -- drawing helpers: `chance` shrinks toward False, `choice` toward its first option

    def chance(self, percent: int) -> bool:
        return bool(self.draw(st.integers(0, 99)) >= 100 - percent)

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(list(options)))

    def coin(self, percent: float) -> bool:
        """A minor choice, drawn from the seeded numpy generator rather than hypothesis: a
        model makes hundreds of them, and that many hypothesis draws overrun its buffer."""
        return bool(self.rng.random() * 100 < percent)

    def vary(self, percent: int) -> bool:
        """A variation that may take the motif off the shape its rule matches; never in canonical mode."""
        return not self.canonical and self.chance(percent)

    def variant(self, options: Sequence[Any]) -> Any:
        """One of `options`; in canonical mode the first (the one the rule matches)."""
        return options[0] if self.canonical else self.choice(options)

    def dim(self, lo: int, hi: int) -> int:
        return int(self.draw(st.integers(lo, hi)))

    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}_{self._counter}"

    # -- values

    def _record(self, name: str, dtype: np.dtype, shape: Shape, origin: str) -> Val:
        value = Val(name, np.dtype(dtype), tuple(int(d) for d in shape), origin)
        self.values[name] = value
        self.uses.setdefault(name, 0)
        return value

    def new_input(self, dtype: np.dtype, shape: Shape, values: str = "normal") -> Val:
        name = self.fresh("in")
        self.inputs.append(InputSpec(name, np.dtype(dtype), tuple(shape), values))
        return self._record(name, dtype, shape, "input")

    def const(self, array: np.ndarray, node: bool | None = None) -> Val:
        """A constant: an initializer, or a Constant node; sometimes one that an earlier node
        already reads (exporters share weights and deduplicate constants: a rule that folds
        it must not change it for the other reader); sometimes an initializer that is also a
        graph input, which a caller may override, so no rule may treat it as constant."""
        array = np.asarray(array)
        same = [name for name, known in self.const_arrays.items() if known.dtype == array.dtype and known.shape == array.shape]
        identical = [name for name in same if np.array_equal(self.const_arrays[name], array)]
        if node is None and identical and self.coin(30):
            return self.values[identical[int(self.rng.integers(len(identical)))]]
        if node is None and array.dtype.kind == "f" and array.size > 1:
            positive = bool((array > 0).all())
            alike = [name for name in same if not positive or (self.const_arrays[name] > 0).all()]
            if alike and self.coin(8):
                return self.values[alike[int(self.rng.integers(len(alike)))]]
            if self.coin(4):
                name = self.fresh("overridable")
                self.initializers.append(numpy_helper.from_array(array, name))
                self.inputs.append(InputSpec(name, array.dtype, array.shape, "positive" if positive else "normal"))
                return self._record(name, array.dtype, array.shape, "input")
        as_node = self.coin(30) if node is None else node
        if as_node:
            name = self.fresh("cst")
            # Constant's other attribute forms: a float32 scalar, a 1-D int64 list.
            if array.dtype == F32 and array.shape == () and self.coin(30):
                attrs: dict[str, Any] = {"value_float": float(array)}
            elif array.dtype == I64 and array.ndim == 1 and self.coin(30):
                attrs = {"value_ints": [int(v) for v in array]}
            else:
                attrs = {"value": numpy_helper.from_array(array)}
            self.nodes.append(helper.make_node("Constant", [], [name], name=name, **attrs))
        else:
            name = self.fresh("init")
            self.initializers.append(numpy_helper.from_array(array, name))
        self.const_arrays[name] = array
        return self._record(name, array.dtype, array.shape, "const")

    def randn(self, shape: Shape, dtype: np.dtype = F32, positive: bool = False) -> np.ndarray:
        array = self.rng.standard_normal(shape)
        if positive:
            array = np.abs(array) + 0.5
        return array.astype(dtype)

    def tensor(self, dtype: np.dtype, shape: Shape, const_percent: int = 70, positive: bool = False) -> Val:
        """An operand that is a constant or a new graph input."""
        if self.chance(const_percent):
            return self.const(self.randn(shape, dtype, positive))
        return self.new_input(dtype, shape, "positive" if positive else "normal")

    def ints(self, values: Sequence[int]) -> Val:
        return self.const(np.array(values, dtype=np.int64))

    def scalar(self, value: float, dtype: np.dtype = F32, as_vector: bool = False) -> Val:
        return self.const(np.array([value] if as_vector else value, dtype=dtype))

    def pick(self, dtypes: Sequence[np.dtype], accept: Callable[[Shape], bool], make: Callable[[], Shape], values: str = "normal") -> Val:
        """An existing value that fits (often), else a new graph input of a made-up shape."""
        candidates = [v for v in self.values.values() if v.origin != "const" and v.dtype in dtypes and accept(v.shape)]
        if candidates and self.chance(60):
            return self.choice(candidates)
        dtype = dtypes[0] if len(dtypes) == 1 else self.choice(dtypes)
        return self.new_input(dtype, make(), values)

    def op(self, op_type: str, inputs: Sequence[Val | None], outputs: Sequence[tuple[np.dtype, Shape]], **attrs: Any) -> list[Val]:
        names = [self.fresh(op_type.lower()) for _ in outputs]
        for value in inputs:
            if value is not None:
                self.uses[value.name] += 1
        self.nodes.append(
            helper.make_node(op_type, ["" if v is None else v.name for v in inputs], names, name=self.fresh(f"n_{op_type}"), **attrs)
        )
        return [self._record(name, dtype, shape, "node") for name, (dtype, shape) in zip(names, outputs)]

    def op1(self, op_type: str, inputs: Sequence[Val | None], dtype: np.dtype, shape: Shape, **attrs: Any) -> Val:
        return self.op(op_type, inputs, [(dtype, shape)], **attrs)[0]

    def binary(self, op_type: str, a: Val, b: Val, swap: bool | None = None) -> Val:
        """Add/Sub/Mul/Div with numpy broadcasting; commutative ops get their operands in random order."""
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        if op_type in ("Add", "Mul") and (self.chance(40) if swap is None else swap):
            a, b = b, a
        return self.op1(op_type, [a, b], a.dtype, shape)

    def unary(self, op_type: str, x: Val, **attrs: Any) -> Val:
        return self.op1(op_type, [x], x.dtype, x.shape, **attrs)

    def maybe_identity(self, x: Val) -> Val:
        return self.unary("Identity", x) if self.coin(5) else x

    def reduce_mean(self, x: Val, axes: Sequence[int], keepdims: int = 1) -> Val:
        rank = len(x.shape)
        norm = {a % rank for a in axes}
        shape = tuple((1 if i in norm else d) for i, d in enumerate(x.shape) if keepdims or i not in norm)
        attrs: dict[str, Any] = {} if keepdims == 1 and self.chance(60) else {"keepdims": keepdims}
        if self.opset >= 18:
            return self.op1("ReduceMean", [x, self.ints(axes)], x.dtype, shape, **attrs)
        return self.op1("ReduceMean", [x], x.dtype, shape, axes=list(axes), **attrs)

    def reshape(self, x: Val, target: Sequence[int], shape: Shape) -> Val:
        return self.op1("Reshape", [x, self.ints(target)], x.dtype, shape)

    def transpose(self, x: Val, perm: Sequence[int]) -> Val:
        return self.op1("Transpose", [x], x.dtype, tuple(x.shape[p] for p in perm), perm=list(perm))

    def bias_shape(self, shape: Shape, allow_grow: bool = True) -> Shape:
        """A shape that broadcasts against `shape`: per feature (what bias fusions want) or not."""
        rank = len(shape)
        options: list[Shape] = [shape[-1:], shape[-1:], (1,) * (rank - 1) + shape[-1:], shape, (), (1,)]
        if rank >= 2:
            options.append(shape[:-1] + (1,))
        if allow_grow:
            options.append((2,) + shape)
        return self.choice(options)

    # -- finishing

    def finish(self) -> tuple[onnx.ModelProto, list[str]]:
        """Give random interior values extra users or make them outputs, then assemble the model."""
        interior = [v for v in self.values.values() if v.origin == "node" and self.uses[v.name] > 0]
        extra_outputs: list[Val] = []
        # Per model, how often an interior value is exposed: a rate per value would break
        # nearly every long motif (ten interior values), so half the models have none.
        rate = self.choice([0, 0, 4, 12])
        for value in interior:
            if rate and self.coin(rate):
                extra_outputs.append(value)
            elif rate and self.coin(rate):
                user = "Identity" if value.dtype not in (F32, F64) else ["Neg", "Identity", "Relu", "Abs"][int(self.rng.integers(4))]
                self.unary(user, value)
        outputs = [v for v in self.values.values() if v.origin == "node" and self.uses[v.name] == 0]
        outputs += [v for v in extra_outputs if v not in outputs]
        if not outputs:  # every value feeds something: the last one made is the output
            outputs = [list(self.values.values())[-1]]
        symbolic = self.chance(25)
        graph_inputs = [helper.make_tensor_value_info(s.name, helper.np_dtype_to_tensor_dtype(s.dtype), self._declared(s.shape, symbolic)) for s in self.inputs]
        graph_outputs = [
            helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(v.dtype), self._declared(v.shape, symbolic and self.chance(50)))
            for v in outputs
        ]
        if self.chance(15):  # exporters may leave nodes unnamed
            for node in self.nodes:
                node.name = ""
        graph = helper.make_graph(self.nodes, "fuzz", graph_inputs, graph_outputs, self.initializers)
        opsets = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=max(8, helper.find_min_ir_version_for(opsets)))
        if self.chance(25):  # some exporters write a type and shape for every value: graphopt then skips inference
            model = onnx.shape_inference.infer_shapes(model)
        return model, [v.name for v in outputs]

    def _declared(self, shape: Shape, symbolic: bool) -> list[int | str]:
        # Symbolic dims are named after their size, so dims that share a name are equal.
        return [f"d{d}" if symbolic and d > 1 else d for d in shape]


# ---------------------------------------------------------------------------- motifs
#
# Each motif adds one rule-shaped subgraph and returns nothing: what it made is in
# the builder, where later motifs may use it.


def _float_dtype(b: GraphBuilder, f64_percent: int = 15) -> np.dtype:
    return F64 if b.chance(f64_percent) else F32


def _norm_input_values(b: GraphBuilder) -> str:
    """A normalization's input: sometimes with a large mean, where a one-pass variance fails."""
    return "offset" if b.chance(15) else "normal"


def _any_shape(b: GraphBuilder, min_rank: int = 1, max_rank: int = 4, last: tuple[int, int] = (1, 6)) -> Shape:
    rank = b.dim(min_rank, max_rank)
    return tuple(b.dim(1, 4) for _ in range(rank - 1)) + (b.dim(*last),)


def motif_conv(b: GraphBuilder) -> None:
    """[Pad] -> Conv | ConvTranspose -> [BatchNormalization] -> [Add residual] -> [activation]."""
    rank = 3 if b.vary(15) else 4
    x = b.pick([F32], lambda s: len(s) == rank and s[1] <= 6 and min(s[2:]) >= 2, lambda: (b.dim(1, 2), b.dim(1, 4), *[b.dim(2, 6) for _ in range(rank - 2)]))
    x = b.maybe_identity(x)
    spatial = rank - 2
    if b.chance(35):
        x = _pad(b, x)
    channels = x.shape[1]
    groups = b.choice([g for g in range(1, channels + 1) if channels % g == 0]) if b.chance(25) else 1
    out_channels = groups * b.dim(1, 2 if groups > 1 else 4)
    transpose = b.vary(10)
    kernel = [b.dim(1, min(3, d)) for d in x.shape[2:]]
    strides = [b.dim(1, 2) for _ in range(spatial)] if b.chance(25) else [1] * spatial
    dilations = [2 if b.vary(15) and (k - 1) * 2 + 1 <= d else 1 for k, d in zip(kernel, x.shape[2:])] if not transpose else [1] * spatial
    attrs: dict[str, Any] = {}
    if groups > 1:
        attrs["group"] = groups
    if strides != [1] * spatial:
        attrs["strides"] = strides
    if dilations != [1] * spatial:
        attrs["dilations"] = dilations
    if b.chance(40):
        attrs["kernel_shape"] = kernel
    if transpose:
        w_shape: Shape = (channels, out_channels // groups, *kernel)
        out_spatial = [(d - 1) * s + k for d, s, k in zip(x.shape[2:], strides, kernel)]
    else:
        w_shape = (out_channels, channels // groups, *kernel)
        # onnxruntime's Conv takes no dilations with SAME padding.
        auto_pad = b.variant(["NOTSET"] * 6 + ["VALID"] + (["SAME_UPPER", "SAME_LOWER"] if dilations == [1] * spatial else []))
        effective = [(k - 1) * dl + 1 for k, dl in zip(kernel, dilations)]
        if auto_pad == "NOTSET":
            pads = [b.dim(0, 1) for _ in range(2 * spatial)] if b.chance(50) else [0] * (2 * spatial)
            if any(pads):
                attrs["pads"] = pads
            out_spatial = [(d + pads[i] + pads[i + spatial] - e) // s + 1 for i, (d, e, s) in enumerate(zip(x.shape[2:], effective, strides))]
        else:
            attrs["auto_pad"] = auto_pad
            if auto_pad == "VALID":
                out_spatial = [(d - e) // s + 1 for d, e, s in zip(x.shape[2:], effective, strides)]
            else:
                out_spatial = [math.ceil(d / s) for d, s in zip(x.shape[2:], strides)]
        if min(out_spatial) < 1:
            return
    w = b.new_input(F32, w_shape) if b.vary(15) else b.const(b.randn(w_shape))
    bias = None if b.chance(40) else (b.new_input(F32, (out_channels,)) if b.vary(15) else b.const(b.randn((out_channels,))))
    y = b.op1("ConvTranspose" if transpose else "Conv", [x, w, bias] if bias else [x, w], F32, (x.shape[0], out_channels, *out_spatial), **attrs)
    if b.chance(45):
        y = _batch_norm(b, y)
    if b.chance(25):
        z_shape = y.shape if not b.vary(25) else b.choice([(1, out_channels) + (1,) * spatial, (out_channels,) + (1,) * spatial, y.shape[1:]])
        z = b.pick([F32], lambda s: s == z_shape, lambda: z_shape)
        y = b.binary("Add", y, z)
    if b.chance(55):
        _activation(b, y)


def _pad(b: GraphBuilder, x: Val) -> Val:
    """A Pad before a Conv: mostly zero constant pads on the spatial axes (what folds), else not."""
    rank = len(x.shape)
    mode = b.variant(["constant"] * 6 + ["reflect", "edge"])
    spatial_only = not b.vary(25)
    pads = []
    for _ in range(2):
        for axis, d in enumerate(x.shape):
            if axis < 2 and spatial_only:
                pads.append(0)
            elif mode == "constant" and d > 2 and b.vary(10):
                pads.append(-1)
            else:
                pads.append(b.dim(0, min(2, d - 1) if mode == "reflect" else 2))
    shape = tuple(d + pads[i] + pads[i + rank] for i, d in enumerate(x.shape))
    inputs: list[Val | None] = [x]
    axes_form = b.opset >= 18 and b.chance(20)
    if axes_form:  # only the spatial axes, given explicitly (sometimes as negative numbers)
        axes = [a - rank if b.chance(50) else a for a in range(2, rank)]
        inputs.append(b.ints([pads[a] for a in range(2, rank)] + [pads[a + rank] for a in range(2, rank)]))
        if any(pads[a] or pads[a + rank] for a in range(2)):
            return x  # the drawn pads touch N or C, which the axes leave out: no Pad this time
    else:
        inputs.append(b.ints(pads))
    if mode == "constant" and b.chance(50):
        inputs.append(b.scalar(b.variant([0.0, 0.0, 1.5, -0.0])))
    elif axes_form:
        inputs.append(None)
    if axes_form:
        inputs.append(b.ints(axes))
    attrs = {} if mode == "constant" and b.chance(50) else {"mode": mode}
    return b.op1("Pad", inputs, x.dtype, shape, **attrs)


def _batch_norm(b: GraphBuilder, y: Val) -> Val:
    """Inference BatchNormalization over axis 1; parameters mostly constant, variance positive."""
    channels = y.shape[1]
    params = [
        b.new_input(y.dtype, (channels,)) if b.vary(8) else b.const(b.randn((channels,), y.dtype)),
        b.const(b.randn((channels,), y.dtype)),
        b.const(b.randn((channels,), y.dtype)),
        b.const(b.randn((channels,), y.dtype, positive=True)),
    ]
    attrs: dict[str, Any] = {}
    if b.chance(50):
        attrs["epsilon"] = b.choice([1e-5, 1e-3, 0.1])
    if b.opset >= 14 and b.chance(20):
        attrs["training_mode"] = 0
    return b.op1("BatchNormalization", [y, *params], y.dtype, y.shape, **attrs)


def _activation(b: GraphBuilder, y: Val) -> Val:
    kind = b.choice(["Relu", "Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid"])
    if kind == "LeakyRelu":
        return b.unary(kind, y, **({"alpha": b.choice([0.1, 0.3])} if b.chance(60) else {}))
    if kind == "HardSigmoid":
        return b.unary(kind, y, alpha=b.choice([0.2, 0.5]), beta=b.choice([0.5, 0.1]))
    if kind == "Clip":
        lo = b.scalar(b.choice([0.0, -1.0]), y.dtype, as_vector=b.chance(15)) if b.chance(80) else None
        hi = b.scalar(b.choice([6.0, 1.0]), y.dtype) if b.chance(70) else None
        inputs = [y, lo, hi] if hi is not None else ([y, lo] if lo is not None else [y])
        return b.op1("Clip", inputs, y.dtype, y.shape)
    return b.unary(kind, y)


def motif_matmul(b: GraphBuilder) -> None:
    """MatMul -> [Add bias | BatchNormalization], or Gemm(alpha, beta, transA, transB) -> [Add | BatchNormalization]."""
    dtype = _float_dtype(b, 20)
    if b.chance(55):
        a = b.pick([dtype], lambda s: 1 <= len(s) <= 3 and s[-1] <= 6, lambda: _any_shape(b, 1, 3))
        k = a.shape[-1]
        n = b.dim(1, 5)
        b_rank = b.variant([2, 2, 2, 1, 3])
        b_shape: Shape = {1: (k,), 2: (k, n), 3: (a.shape[0] if len(a.shape) == 3 and b.chance(50) else 1, k, n)}[b_rank]
        w = b.new_input(dtype, b_shape) if b.vary(20) else b.const(b.randn(b_shape, dtype))
        out_shape = np.matmul(np.zeros(a.shape), np.zeros(b_shape)).shape
        y = b.op1("MatMul", [a, w], dtype, out_shape)
        if b.chance(15) and len(out_shape) == 2:
            _batch_norm(b, y)
        elif b.chance(75) and out_shape:
            c = b.tensor(dtype, b.bias_shape(out_shape), const_percent=75)
            b.binary("Add", y, c)
        return
    m, k, n = b.dim(1, 5), b.dim(1, 5), b.dim(1, 5)
    trans_a, trans_b = b.chance(25), b.chance(35)
    a = b.pick([dtype], lambda s: s == ((k, m) if trans_a else (m, k)), lambda: (k, m) if trans_a else (m, k))
    w = b.tensor(dtype, (n, k) if trans_b else (k, n), const_percent=85)
    attrs: dict[str, Any] = {}
    if trans_a or b.chance(10):
        attrs["transA"] = int(trans_a)
    if trans_b or b.chance(10):
        attrs["transB"] = int(trans_b)
    if b.chance(30):
        attrs["alpha"] = b.choice([1.0, 0.5, -2.0])
    inputs = [a, w]
    if b.chance(55):
        inputs.append(b.tensor(dtype, b.choice([(n,), (1, n), (m, n), (m, 1), (), (1,)]), const_percent=80))
        if b.chance(30):
            attrs["beta"] = b.choice([1.0, 0.5, 0.0])
    y = b.op1("Gemm", inputs, dtype, (m, n), **attrs)
    if b.chance(30):
        _batch_norm(b, y)
    elif b.chance(50):
        b.binary("Add", y, b.tensor(dtype, b.bias_shape((m, n)), const_percent=75))


def motif_layernorm_decomposed(b: GraphBuilder) -> None:
    """mean / Sub / Pow 2 (or Mul d d) / mean / Add eps / Sqrt / Div / Mul gamma / Add beta, with variations."""
    dtype = _float_dtype(b)
    x = b.maybe_identity(b.pick([dtype], lambda s: len(s) >= 1 and s[-1] >= 2, lambda: _any_shape(b, 1, 4, (2, 8)), _norm_input_values(b)))
    rank = len(x.shape)
    axes = b.variant([[-1], [-1], [-1], [rank - 1], [-2], [-2, -1]] if rank >= 2 else [[-1], [0]])
    mean = b.reduce_mean(x, axes)
    d = b.binary("Sub", x, mean)
    form = b.variant(["pow", "pow", "mul", "pow3", "pow_vector"])
    if form == "mul":
        sq = b.op1("Mul", [d, d], dtype, d.shape)
    else:
        exponent = b.scalar({"pow": 2.0, "pow3": 3.0, "pow_vector": 2.0}[form], dtype, as_vector=form == "pow_vector")
        sq = b.op1("Pow", [d, exponent], dtype, d.shape)
    var = b.reduce_mean(sq, [0] if b.vary(10) else axes)
    eps = b.new_input(dtype, (), "positive") if b.vary(10) else b.scalar(b.choice([1e-5, 1e-6, 1e-3]), dtype, as_vector=b.vary(15))
    std = b.unary("Sqrt", b.binary("Add", var, eps))
    norm = b.binary("Div", x if b.vary(5) else d, std)
    if not b.vary(15):
        gamma = b.tensor(dtype, b.variant([x.shape[-1:]]) if b.canonical else b.bias_shape(x.shape, allow_grow=False), const_percent=100 if b.canonical else 85)
        scaled = b.binary("Mul", norm, gamma)
        if not b.vary(15):
            beta = b.tensor(dtype, x.shape[-1:] if b.canonical else b.bias_shape(x.shape, allow_grow=False), const_percent=100 if b.canonical else 85)
            b.binary("Add", scaled, beta)


def motif_layernorm(b: GraphBuilder) -> None:
    """[Add bias] -> Add residual -> LayerNormalization (opset >= 17): the SkipLayerNorm shapes."""
    if b.opset < 17:
        return motif_layernorm_decomposed(b)
    dtype = _float_dtype(b, 10)
    shape = _any_shape(b, 1, 4, (2, 8)) if b.vary(15) else (b.dim(1, 2), b.dim(1, 4), b.dim(2, 8))
    hidden = shape[-1]
    a = b.pick([dtype], lambda s: s == shape, lambda: shape, _norm_input_values(b))
    if b.chance(30):
        a = b.binary("Add", a, b.tensor(dtype, (hidden,) if b.chance(80) else shape, const_percent=85))
    if b.chance(80):
        other = b.choice([(hidden,), shape[1:]]) if b.vary(15) else shape
        x = b.binary("Add", a, b.pick([dtype], lambda s: s == other, lambda: other))
    else:
        x = a
    rank = len(x.shape)
    axis = b.variant([-1, -1, -1, rank - 1, 0] + ([-2] if rank >= 2 else []))
    normalized = x.shape[axis % rank :]
    gamma = b.tensor(dtype, normalized[-1:] if b.vary(15) else normalized, const_percent=85)
    inputs = [x, gamma] + ([b.tensor(dtype, normalized, const_percent=85)] if b.chance(75) else [])
    attrs: dict[str, Any] = {"axis": axis} if axis != -1 or b.chance(50) else {}
    if b.chance(40):
        attrs["epsilon"] = b.choice([1e-5, 1e-12, 1e-3])
    stats = (x.shape[: axis % rank]) + (1,) * (rank - axis % rank)
    extra = b.variant([0, 0, 0, 0, 1, 2]) if dtype == F32 else 0  # Mean and InvStdDev (float32 by stash_type)
    outs: list[tuple[np.dtype, Shape]] = [(dtype, x.shape)] + [(F32, stats)] * extra
    b.op("LayerNormalization", inputs, outs, **attrs)


def motif_rmsnorm(b: GraphBuilder) -> None:
    """[Add residual] -> Pow 2 / ReduceMean / Add eps / Sqrt / reciprocal or Div / Mul x / Mul weight."""
    dtype = _float_dtype(b)
    shape = _any_shape(b, 1, 4, (2, 8)) if b.vary(20) else (b.dim(1, 2), b.dim(1, 4), b.dim(2, 8))
    x = b.pick([dtype], lambda s: s == shape, lambda: shape, _norm_input_values(b))
    if b.chance(40):
        x = b.binary("Add", x, b.pick([dtype], lambda s: s == shape, lambda: shape))
    sq = b.op1("Pow", [x, b.scalar(b.variant([2.0, 2.0, 2.0, 3.0]), dtype)], dtype, x.shape)
    var = b.reduce_mean(sq, b.variant([[-1], [-1], [len(shape) - 1], [0]]))
    std = b.unary("Sqrt", b.binary("Add", var, b.scalar(b.choice([1e-6, 1e-5]), dtype)))
    form = b.choice(["recip", "div1", "div"])
    if form == "recip":
        norm = b.binary("Mul", x, b.unary("Reciprocal", std))
    elif form == "div1":
        norm = b.binary("Mul", x, b.binary("Div", b.scalar(b.variant([1.0, 1.0, 2.0]), dtype), std))
    else:
        norm = b.binary("Div", x, std)
    weight = b.tensor(dtype, b.bias_shape(shape, allow_grow=False) if b.vary(15) else (shape[-1],), const_percent=85)
    b.binary("Mul", norm, weight)


def motif_attention(b: GraphBuilder) -> None:
    """[projections] -> q k^T -> [scale] -> [mask] -> Softmax -> [IsNaN guard] -> MatMul v -> [merge heads]."""
    batch, heads, sq, sk, head = b.dim(1, 2), b.dim(1, 3), b.dim(1, 4), b.dim(1, 4), b.dim(1, 4)
    value_head = b.dim(1, 4) if b.vary(20) else head
    if sk != sq and b.chance(40):
        sk = sq
    if b.chance(35):  # self-attention from one hidden state, projected and split into heads
        sk = sq
        hidden = heads * head
        x = b.pick([F32], lambda s: s == (batch, sq, hidden), lambda: (batch, sq, hidden))

        def project(width: int, last: list[int]) -> Val:
            y = b.op1("MatMul", [x, b.const(b.randn((hidden, heads * width)))], F32, (batch, sq, heads * width))
            y = b.binary("Add", y, b.const(b.randn((heads * width,))))
            y = b.reshape(y, [batch if b.chance(50) else 0, sq if b.chance(70) else -1, heads, width], (batch, sq, heads, width))
            return b.transpose(y, last)

        q = project(head, [0, 2, 1, 3])
        kt = project(head, [0, 2, 3, 1])
        v = project(value_head, [0, 2, 1, 3])
    else:
        q = b.pick([F32], lambda s: s == (batch, heads, sq, head), lambda: (batch, heads, sq, head))
        if b.chance(60):
            k = b.pick([F32], lambda s: s == (batch, heads, sk, head), lambda: (batch, heads, sk, head))
            kt = b.transpose(k, [0, 1, 3, 2])
        else:
            kt = b.pick([F32], lambda s: s == (batch, heads, head, sk), lambda: (batch, heads, head, sk))
        v = b.new_input(F32, (1 if b.vary(10) else batch, heads, sk, value_head))

    def scaled(x: Val) -> Val:
        kind = b.choice(["none", "mul", "div"])
        if kind == "none":
            return x
        factor = b.choice([head**-0.5, 0.125, 2.0]) if kind == "mul" else b.choice([head**0.5, 8.0])
        return b.op1("Mul" if kind == "mul" else "Div", [x, b.scalar(factor, as_vector=b.vary(10))], F32, x.shape)

    scores = b.op1("MatMul", [scaled(q), scaled(kt)], F32, (batch, heads, sq, sk))
    scores = scaled(scores)
    mask_shapes = [(batch, 1, 1, sk), (1, 1, sq, sk), (batch, heads, sq, sk), (sk,), (sq, sk), (batch, 1, sq, sk), (2, batch, heads, sq, sk)]
    masking = b.choice(["add", "add", "none", "keep", "drop", "add2"])
    if masking in ("add", "add2"):
        for _ in range(1 if masking == "add" else 2):
            mask_shape = b.variant(mask_shapes)
            if b.chance(50):
                mask = b.const(np.where(b.rng.random(mask_shape) < 0.8, 0.0, -10000.0).astype(np.float32))
            else:
                mask = b.new_input(F32, mask_shape)
            scores = b.binary("Add", scores, mask)
    elif masking in ("keep", "drop"):
        keep = b.new_input(BOOL, b.variant(mask_shapes[:-1]), "mostly_true")
        fill = b.scalar(b.choice([float(np.finfo(np.float32).min), -10000.0, -1e9, float("-inf")]), as_vector=b.vary(10))
        inputs = [keep, scores, fill] if masking == "keep" else [keep, fill, scores]
        scores = b.op1("Where", inputs, F32, tuple(np.broadcast_shapes(keep.shape, scores.shape)))
    rank = len(scores.shape)
    axis = b.variant([-1, -1, rank - 1, -2])
    probs = b.op1("Softmax", [scores], F32, scores.shape, **({"axis": axis} if axis != -1 or b.chance(50) else {}))
    if b.chance(15):
        probs = b.op1("Where", [b.op1("IsNaN", [probs], BOOL, probs.shape), b.scalar(0.0), probs], F32, probs.shape)
    out_shape = np.matmul(np.zeros(probs.shape), np.zeros(v.shape)).shape
    out = b.op1("MatMul", [probs, v], F32, out_shape)
    if b.chance(50) and len(out_shape) == 4:
        merged = b.transpose(out, [0, 2, 1, 3])
        b.reshape(merged, [0, 0, -1], (out_shape[0], out_shape[2], out_shape[1] * out_shape[3]))


CAST_TYPES = [F32, F16, F64, I32, I64, BOOL]


def motif_cast_chain(b: GraphBuilder) -> None:
    """One to three Casts (lossless and lossy), sometimes a CastLike, from any value or a wide-ranged input."""
    source = b.choice(CAST_TYPES)
    x = b.pick([source], lambda s: True, lambda: _any_shape(b, 0, 3), values="wide")
    for _ in range(b.dim(1, 3)):
        to = b.choice(CAST_TYPES)
        if b.opset >= 15 and b.chance(15):
            like = b.const(np.zeros((1,), dtype=to))
            x = b.op1("CastLike", [x, like], to, x.shape)
        else:
            x = b.op1("Cast", [x], to, x.shape, to=helper.np_dtype_to_tensor_dtype(to))
    if x.dtype in (F32, F64) and b.chance(40):
        b.binary(b.choice(["Add", "Mul"]), x, b.const(b.randn((), x.dtype)))


def motif_gelu(b: GraphBuilder) -> None:
    """[Add bias] -> GELU written out with Erf or with Tanh, constants right (mostly) or not."""
    x = b.pick([F32], lambda s: len(s) >= 1, lambda: _any_shape(b, 1, 3, (2, 6)))
    if b.chance(35):
        x = b.binary("Add", x, b.const(b.randn(x.shape[-1:])), swap=False if b.chance(70) else None)
    half = b.scalar(b.variant([0.5, 0.5, 0.5, 0.6]))
    one = b.scalar(b.variant([1.0, 1.0, 1.0, 2.0]))
    if b.chance(65):  # x * 0.5 * (1 + Erf(x / sqrt(2)))
        kind = b.choice(["div", "mul"])
        exact = math.sqrt(2.0) if kind == "div" else 1 / math.sqrt(2.0)
        scale = b.scalar(1.5 if b.vary(15) else exact, as_vector=b.vary(10))
        inner = b.op1("Erf", [b.op1("Div" if kind == "div" else "Mul", [x, scale], F32, x.shape)], F32, x.shape)
    else:  # 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        cube = b.op1("Pow", [x, b.scalar(3.0)], F32, x.shape) if b.chance(60) else b.binary("Mul", x, b.binary("Mul", x, x))
        k = b.scalar(0.1 if b.vary(15) else 0.044715)
        s = b.scalar(1.0 if b.vary(15) else math.sqrt(2 / math.pi))
        inner = b.unary("Tanh", b.binary("Mul", b.binary("Add", x, b.binary("Mul", cube, k)), s))
    e = b.binary("Add", inner, one)
    if b.chance(50):  # 0.5 after: (x * e) * 0.5
        b.binary("Mul", b.binary("Mul", x, e), half)
    else:
        b.binary("Mul", b.binary("Mul", x, half), e)


def motif_silu(b: GraphBuilder) -> None:
    """x * Sigmoid(x), x * Sigmoid(1.702 x), and SwiGLU's silu(gate) * up."""
    gate = b.pick([F32, F64], lambda s: len(s) >= 1, lambda: _any_shape(b, 1, 3))
    if b.chance(30):
        alpha = b.scalar(b.variant([1.702, 1.702, 1.0, 2.0]), gate.dtype)
        act = b.binary("Mul", gate, b.unary("Sigmoid", b.binary("Mul", gate, alpha)))
    else:
        other = gate if not b.vary(10) else b.pick([gate.dtype], lambda s: s == gate.shape, lambda: gate.shape)
        act = b.binary("Mul", gate, b.unary("Sigmoid", other))
    if b.chance(40):
        up_shape = gate.shape[-1:] if b.vary(20) else gate.shape
        b.binary("Mul", act, b.pick([gate.dtype], lambda s: s == up_shape, lambda: up_shape))


def motif_geglu(b: GraphBuilder) -> None:
    """[Add bias] -> halves of the last axis (Split or two Slices) -> h * Gelu(g)."""
    half = b.dim(1, 4)
    shape = (b.dim(1, 2), b.dim(1, 3), 2 * half)
    x = b.pick([F32], lambda s: s == shape, lambda: shape)
    if b.chance(50):
        x = b.binary("Add", x, b.const(b.randn((2 * half,))), swap=False)
    axis = b.variant([-1, -1, 2, 1])
    size = x.shape[axis]
    first = max(1, size // 2 - 1) if b.vary(15) else size // 2
    if size < 2:
        return
    sizes = [first, size - first]
    parts_shape = [tuple(s if i == axis % 3 else d for i, d in enumerate(x.shape)) for s in sizes]
    if b.chance(60):
        if b.opset >= 18 and sizes[0] == sizes[1] and b.chance(60):
            h, g = b.op("Split", [x], [(F32, parts_shape[0]), (F32, parts_shape[1])], axis=axis, num_outputs=2)
        else:
            h, g = b.op("Split", [x, b.ints(sizes)], [(F32, parts_shape[0]), (F32, parts_shape[1])], axis=axis)
    else:
        h = b.op1("Slice", [x, b.ints([0]), b.ints([first]), b.ints([axis])], F32, parts_shape[0])
        g = b.op1("Slice", [x, b.ints([first]), b.ints([size if b.chance(60) else 2**62]), b.ints([axis])], F32, parts_shape[1])
    if b.opset >= 20 and b.chance(60):
        gelu = b.unary("Gelu", g)
    else:
        e = b.binary("Add", b.unary("Erf", b.binary("Mul", g, b.scalar(1 / math.sqrt(2.0)))), b.scalar(1.0))
        gelu = b.binary("Mul", b.binary("Mul", g, b.scalar(0.5)), e)
    if h.shape == gelu.shape:  # an uneven split leaves both halves as outputs
        b.binary("Mul", h, gelu)


def motif_group_norm(b: GraphBuilder) -> None:
    """Reshape [N, G, -1] -> InstanceNormalization(1, 0) -> Reshape back -> Mul gamma -> Add beta."""
    groups = b.dim(1, 3)
    shape = (b.dim(1, 2), groups * b.dim(1, 2), b.dim(1, 3), b.dim(1, 3))
    x = b.pick([F32], lambda s: s == shape, lambda: shape, _norm_input_values(b))
    grouped = b.reshape(x, [0 if b.chance(50) else shape[0], groups, -1], (shape[0], groups, shape[1] // groups * shape[2] * shape[3]))
    ones = b.randn((groups,)) if b.vary(15) else np.ones(groups, np.float32)
    norm = b.op1("InstanceNormalization", [grouped, b.const(ones), b.const(np.zeros(groups, np.float32))], F32, grouped.shape, epsilon=b.choice([1e-5, 1e-6]))
    if b.chance(50):
        back = b.op1("Reshape", [norm, b.op1("Shape", [x], I64, (4,))], F32, shape)
    else:
        back = b.reshape(norm, list(shape), shape)
    per_channel = (shape[1], 1, 1)
    b.binary("Add", b.binary("Mul", back, b.const(b.randn(per_channel))), b.const(b.randn(per_channel)))


def motif_shape_arithmetic(b: GraphBuilder) -> None:
    """Shape / Gather / Slice / Concat / Size computing a Reshape target (or left as an integer output)."""
    x = b.pick([F32, F64, I64], lambda s: 1 <= len(s) <= 4, lambda: _any_shape(b, 1, 4))
    rank = len(x.shape)
    if b.opset >= 15 and b.chance(25):
        start = b.dim(0, rank - 1)
        shape = b.op1("Shape", [x], I64, (rank - start,), start=start)
        kept = x.shape[start:]
    else:
        shape = b.op1("Shape", [x], I64, (rank,))
        kept = x.shape
    kind = b.choice(["gather", "slice", "size"])
    if kind == "size":
        size = b.op1("Size", [x], I64, ())
        b.binary("Mul", size, b.const(np.array(2, np.int64)))
        return
    if kind == "gather":
        index = b.dim(0, len(kept) - 1)
        picked = b.op1("Gather", [shape, b.ints([index])], I64, (1,), axis=0)
        prefix = (kept[index],)
    else:
        end = b.dim(1, len(kept)) if b.chance(80) else 2**62  # past the end: all of it
        prefix = kept[:end]
        picked = b.op1("Slice", [shape, b.ints([0]), b.ints([end])], I64, (len(prefix),))
    total = int(np.prod(x.shape))
    if total % int(np.prod(prefix)) == 0 and b.chance(80):
        target = b.op1("Concat", [picked, b.ints([-1])], I64, (len(prefix) + 1,), axis=0)
        b.op1("Reshape", [x, target], x.dtype, prefix + (total // int(np.prod(prefix)),))
    else:
        b.binary("Add", picked, b.ints([1] * len(prefix)))


def motif_layout_chain(b: GraphBuilder) -> None:
    """Transpose and Reshape chains: composed, identity, reshape of a reshape, batched last-two swaps."""
    x = b.pick([F32, F64], lambda s: 2 <= len(s) <= 4, lambda: _any_shape(b, 2, 4))
    for _ in range(b.dim(1, 3)):
        rank = len(x.shape)
        kind = b.choice(["transpose", "reshape", "unflatten"])
        if kind == "transpose":
            perm = list(range(rank)) if b.chance(15) else list(b.draw(st.permutations(range(rank))))
            x = b.transpose(x, perm)
        elif kind == "reshape":
            total = int(np.prod(x.shape))
            choices: list[tuple[list[int], Shape]] = [([-1], (total,)), ([0, -1], (x.shape[0], total // x.shape[0])), (list(x.shape), x.shape)]
            if rank >= 2:
                choices.append(([0] * (rank - 1) + [-1], x.shape))
                choices.append(([-1, x.shape[-1]], (total // x.shape[-1], x.shape[-1])))
            target, shape = b.choice(choices)
            if rank == 1 and target[0] == 0:
                continue
            x = b.reshape(x, target, shape)
        elif rank >= 3:
            lead = int(np.prod(x.shape[:-2]))
            a, c = x.shape[-2], x.shape[-1]
            flat = b.reshape(x, [-1, a, c], (lead, a, c))
            swapped = b.transpose(flat, [0, 2, 1])
            x = b.reshape(swapped, list(x.shape[:-2]) + [c, a], x.shape[:-2] + (c, a))


def motif_elementwise(b: GraphBuilder) -> None:
    """Glue: broadcasting arithmetic, Where, activations between existing values."""
    x = b.pick([F32, F64], lambda s: True, lambda: _any_shape(b, 0, 3))
    kind = b.choice(["Add", "Sub", "Mul", "Div", "Where", "Relu", "Tanh", "Sigmoid"])
    if kind in ("Relu", "Tanh", "Sigmoid"):
        b.unary(kind, x)
    elif kind == "Where":
        cond = b.new_input(BOOL, b.bias_shape(x.shape, allow_grow=False) if x.shape else ())
        other = b.tensor(x.dtype, b.bias_shape(x.shape, allow_grow=False) if x.shape else (), const_percent=60)
        b.op1("Where", [cond, x, other], x.dtype, tuple(np.broadcast_shapes(cond.shape, x.shape, other.shape)))
    else:
        other_shape = b.bias_shape(x.shape) if x.shape else ()
        other = b.pick([x.dtype], lambda s: s == other_shape, lambda: other_shape) if b.chance(40) else b.tensor(x.dtype, other_shape, positive=kind == "Div")
        if kind == "Div" and other.origin == "node":
            other = b.unary("Abs", other)
            other = b.binary("Add", other, b.scalar(0.5, x.dtype))
        b.binary(kind, x, other)


MOTIFS: dict[str, Callable[[GraphBuilder], None]] = {
    "conv": motif_conv,
    "matmul": motif_matmul,
    "layernorm_decomposed": motif_layernorm_decomposed,
    "layernorm": motif_layernorm,
    "rmsnorm": motif_rmsnorm,
    "attention": motif_attention,
    "cast_chain": motif_cast_chain,
    "gelu": motif_gelu,
    "silu": motif_silu,
    "geglu": motif_geglu,
    "group_norm": motif_group_norm,
    "shape_arithmetic": motif_shape_arithmetic,
    "layout_chain": motif_layout_chain,
    "elementwise": motif_elementwise,
}


@st.composite
def fuzz_cases(draw: Callable[[st.SearchStrategy[Any]], Any], motifs: Sequence[str] | None = None, max_motifs: int = 4) -> FuzzCase:
    """A random model made of 1..max_motifs motifs (all of MOTIFS unless named)."""
    names = list(motifs or MOTIFS)
    opset = draw(st.sampled_from(OPSETS[2:] + OPSETS))  # favour the opsets most rules need (17+)
    seed = draw(st.integers(0, 2**32 - 1))
    builder = GraphBuilder(draw, opset, seed)
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=max_motifs))
    for name in chosen:
        builder.canonical = not builder.chance(50)
        MOTIFS[name](builder)
        builder.motifs.append(name)
    model, _ = builder.finish()
    return FuzzCase(model, builder.inputs, builder.motifs, seed)
