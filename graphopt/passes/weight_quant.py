"""Weight-only int8/int4 quantization of MatMul and Gemm (`graphopt optimize --weights int4|int8`).

A layer is a MatMul whose B input, or a Gemm (transA=0) whose B input, is a constant 2-D
initializer (K, N) (Gemm's transB, alpha and beta are folded into the weight and the bias). Its weight
is quantized round-to-nearest per output column and block of K (graphopt.quant.blockwise) and the
layer is written in the target's form (graphopt.passes.weight_quant_forms): com.microsoft.MatMulNBits
where the target's kernel table has it for the activation's type, else standard ops
(DequantizeLinear at opset >= 21, Cast/Mul before it, int8 only).

What stays in the original precision, each named in the report (`WeightQuantSummary.layers`):

* the default block list: the LM head, the widest layer with N > K (a vocabulary) whose output
  reaches a graph output through no other matmul (its errors land on every logit). Embeddings are
  Gathers, never touched. `keep=["none"]` clears the default list;
* `keep` entries (fnmatch globs) matching the node's name, its weight's name, its output's name or
  its op type;
* a layer whose output SNR is under the budget (`min_snr_db`; defaults int8 35 dB, int4 20 dB).

The SNR of a layer is 10·log10(|x·W|² / |x·W − x·Ŵ|²) for x standard normal [rows, K]: a proxy for
calibration activations. For independent unit inputs it equals the weight-space SNR in expectation;
real activations with outlier channels weigh some rows of W more, so it is an estimate, not a bound.

This runs after `--precision` (graphopt.api), so a weight already in float16 gets float16 scales,
matching its MatMul's activation type.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.errors import GraphoptError
from graphopt.passes._common import detach_and_remove, record
from graphopt.passes.weight_quant_forms import MS_DOMAIN, emit, emit_again, stored_bytes
from graphopt.quant.blockwise import BlockQuantized, dequantize, quantize, snr_db
from graphopt.report.sections import WeightLayer, WeightQuantSummary

__all__ = ["WeightQuantPlan", "quantize_weights", "DEFAULT_MIN_SNR_DB", "BLOCK_SIZES", "NO_DEFAULT_KEEP"]

WEIGHT_BITS = {"int4": 4, "int8": 8}
BLOCK_SIZES = (16, 32, 64, 128, 256)
#: The per-layer output SNR under which a layer keeps its weights (issue 18's defaults).
DEFAULT_MIN_SNR_DB = {"int8": 35.0, "int4": 20.0}
#: A `keep` entry that clears the default block list (the LM head).
NO_DEFAULT_KEEP = "none"
#: MatMulNBits' accuracy_level per target: the lowest type the kernel may compute in. On the CPU, 4
#: (int8: activations quantized per block) runs onnxruntime's integer kernels; it is also what
#: onnxruntime's own optimizer picks when it fuses a DequantizeLinear -> MatMul (its
#: session.qdq_matmulnbits_accuracy_level defaults to 4). The CUDA kernel computes in the activation's
#: type whatever the level: 0 (unset).
ACCURACY_LEVEL = {"ort-cpu": 4, "ort-cuda": 0}
#: Rows of the random activations the SNR is measured on.
SNR_ROWS = 32
_SNR_CAP_DB = 200.0  # an exactly representable weight has infinite SNR; JSON has no infinity
_FLOAT_TYPES = {ir.DataType.FLOAT: "f32", ir.DataType.FLOAT16: "f16", ir.DataType.BFLOAT16: "bf16"}


@dataclass(frozen=True)
class WeightQuantPlan:
    """The checked `--weights` options."""

    weights: str  # "int4" or "int8"
    block_size: int = 32
    keep: tuple[str, ...] = ()
    #: None: asymmetric (zero points) for int4, where they gain about 1 dB; symmetric for int8.
    symmetric: bool | None = None
    min_snr_db: float | None = None
    #: MatMulNBits' accuracy_level (None: the target's, ACCURACY_LEVEL).
    accuracy_level: int | None = None

    @classmethod
    def make(cls, weights: str | None, block_size: int = 32, keep: Sequence[str] = (), symmetric: bool | None = None,
             min_snr_db: float | None = None, accuracy_level: int | None = None) -> WeightQuantPlan | None:
        """The plan, or None for no weight quantization; a GraphoptError for a bad option."""
        if weights is None or str(weights).lower() in ("", "none", "fp32", "float"):
            return None
        weights = str(weights).lower()
        if weights not in WEIGHT_BITS:
            raise GraphoptError(f"--weights {weights}: expected int4 or int8")
        if block_size not in BLOCK_SIZES:
            raise GraphoptError(f"--block-size {block_size}: expected one of {', '.join(map(str, BLOCK_SIZES))}")
        if accuracy_level is not None and accuracy_level not in (0, 1, 2, 3, 4):
            raise GraphoptError(f"weights accuracy_level {accuracy_level}: expected 0 to 4")
        return cls(weights, block_size, tuple(keep), symmetric, min_snr_db, accuracy_level)

    @property
    def bits(self) -> int:
        return WEIGHT_BITS[self.weights]

    @property
    def is_symmetric(self) -> bool:
        return self.symmetric if self.symmetric is not None else self.bits == 8

    @property
    def budget_db(self) -> float:
        return self.min_snr_db if self.min_snr_db is not None else DEFAULT_MIN_SNR_DB[self.weights]


@dataclass
class _Layer:
    node: ir.Node
    weight: np.ndarray  # [K, N], alpha folded in
    bias: ir.Value | np.ndarray | None  # Gemm's C (beta folded in when constant)
    weight_value: ir.Value
    keep_reason: str = ""
    snr: float | None = None
    weight_snr: float | None = None
    quantized: BlockQuantized | None = None

    @property
    def k(self) -> int:
        return int(self.weight.shape[0])

    @property
    def n(self) -> int:
        return int(self.weight.shape[1])


@dataclass
class _Names:
    used: set[str] = field(default_factory=set)

    def __call__(self, hint: str) -> str:
        name, i = hint, 0
        while name in self.used:
            i += 1
            name = f"{hint}_{i}"
        self.used.add(name)
        return name


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None or value.is_graph_input():
        return None
    return value.const_value.numpy()


def _label(node: ir.Node) -> str:
    return node.name or (node.outputs[0].name if node.outputs and node.outputs[0].name else node.op_type)


def _layer_of(node: ir.Node) -> _Layer | None:
    """The node as a weight layer, or None when it is not one graphopt quantizes."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    weight_value = node.inputs[1]
    weight = _const(weight_value)
    if weight is None or weight.ndim != 2 or weight_value is None or weight_value.dtype not in _FLOAT_TYPES:
        return None
    a = node.inputs[0]
    if a is None or (a.shape is not None and len(a.shape) < 2):  # a vector times a matrix: MatMulNBits wants rows
        return None
    if node.op_type == "MatMul":
        return _Layer(node, weight, None, weight_value)
    attrs = node.attributes
    if attrs.get_int("transA", 0):
        return None
    alpha, beta = attrs.get_float("alpha", 1.0), attrs.get_float("beta", 1.0)
    if attrs.get_int("transB", 0):
        weight = weight.T
    if alpha != 1.0:
        weight = (weight.astype(np.float32) * alpha).astype(weight.dtype)
    bias: ir.Value | np.ndarray | None = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and beta != 1.0:
        constant = _const(bias)  # type: ignore[arg-type]
        if constant is None:
            return None  # a computed bias times beta: left as the Gemm it is
        bias = (constant.astype(np.float32) * beta).astype(constant.dtype)
    return _Layer(node, np.ascontiguousarray(weight), bias, weight_value)


def _reaches_output(node: ir.Node, hops: int = 8) -> bool:
    """Whether the node's output reaches a graph output through no other matmul."""
    frontier, seen = list(node.outputs), set()
    for _ in range(hops):
        following: list[ir.Value] = []
        for value in frontier:
            if value.is_graph_output():
                return True
            for user, _index in value.uses():
                if id(user) in seen or user.op_type in ("MatMul", "Gemm", "MatMulNBits", "FusedMatMul"):
                    continue
                seen.add(id(user))
                following.extend(user.outputs)
        frontier = following
    return False


def _lm_heads(layers: list[_Layer]) -> set[int]:
    """The LM head: of the layers that widen (N > K) and whose output reaches a graph output through no
    other matmul, the widest (a vocabulary: an MLP's up projection is followed by its down projection)."""
    heads = [layer for layer in layers if layer.n > layer.k and _reaches_output(layer.node)]
    if not heads:
        return set()
    widest = max(layer.n for layer in heads)
    return {id(layer) for layer in heads if layer.n == widest}


def _matches(layer: _Layer, pattern: str) -> bool:
    names = [layer.node.name, layer.weight_value.name, layer.node.outputs[0].name, layer.node.op_type]
    return any(name and fnmatch.fnmatchcase(name, pattern) for name in names)


def _measure(layer: _Layer, quantized: BlockQuantized, rng: np.random.Generator) -> tuple[float, float]:
    """(output SNR on random activations, weight SNR), in dB, capped for JSON."""
    original = layer.weight.astype(np.float32)
    approx = dequantize(quantized).astype(np.float32)
    x = rng.standard_normal((SNR_ROWS, layer.k)).astype(np.float32)
    output = snr_db(x @ original, x @ approx)
    weight = snr_db(original, approx)
    return float(min(output, _SNR_CAP_DB)), float(min(weight, _SNR_CAP_DB))


def _form(model: ir.Model, target: Any, dtype: ir.DataType | None, plan: WeightQuantPlan) -> str | None:
    """The form a layer of this activation type is written in on `target` (None: the target cannot run one)."""
    opset = model.opset_imports.get("", None)
    if target.name != "onnx":
        has_kernel = dtype in _FLOAT_TYPES and target.why_not(MS_DOMAIN, "MatMulNBits", _FLOAT_TYPES[dtype], None) is None
        return "MatMulNBits" if has_kernel else None
    if opset is not None and opset >= 21:
        return "DequantizeLinear"
    return "Cast-Mul" if plan.bits == 8 else None


def _check_standard_form(model: ir.Model, target: Any, plan: WeightQuantPlan) -> None:
    opset = model.opset_imports.get("", None)
    if target.name != "onnx" or (opset is not None and opset >= 21):
        return
    if plan.bits == 4:
        raise GraphoptError(
            f"--weights int4 --target onnx needs opset 21 or later (blocked int4 DequantizeLinear); the model's is {opset}: "
            "use --target ort-cpu or ort-cuda (com.microsoft.MatMulNBits), --weights int8, or convert the model to opset 21"
        )
    if opset is not None and opset < 10:
        raise GraphoptError(f"--weights int8 --target onnx needs opset 10 or later (Slice with inputs); the model's is {opset}")


def quantize_weights(model: ir.Model, target: Any, plan: WeightQuantPlan, stats: Any = None, seed: int = 0,
                     decider: Any = None) -> WeightQuantSummary:
    """Quantize the weights of the main graph's MatMul/Gemm layers in place; returns what it did.
    With `decider` (graphopt.decisions.DecisionPoint), whether to quantize at all is a decision
    (graphopt.passes.weight_quant_decision): where the cost table predicts the quantized form no
    faster, every layer stays as it is (`speed_decision`)."""
    started = time.perf_counter()
    _check_standard_form(model, target, plan)
    graph = model.graph
    layers = [layer for node in list(graph) if (layer := _layer_of(node)) is not None]
    keep = [entry for entry in plan.keep if entry.lower() != NO_DEFAULT_KEEP]
    defaults = not any(entry.lower() == NO_DEFAULT_KEEP for entry in plan.keep)
    heads = _lm_heads(layers) if defaults else set()
    level = plan.accuracy_level if plan.accuracy_level is not None else ACCURACY_LEVEL.get(target.name, 0)
    forms = sorted(form for layer in layers if (form := _form(model, target, layer.weight_value.dtype, plan)) is not None)
    summary = WeightQuantSummary(
        plan.weights, plan.block_size, plan.is_symmetric, form=forms[0] if forms else ("MatMulNBits" if target.name != "onnx" else "DequantizeLinear"),
        accuracy_level=level if target.name != "onnx" else None, min_snr_db=plan.budget_db,
    )
    summary._unmatched_keep = [entry for entry in keep if not any(_matches(layer, entry) for layer in layers)]
    names = _Names({v.name for v in graph.initializers.values() if v.name} | {n.name for n in graph if n.name}
                   | {v.name for n in graph for v in n.outputs if v.name} | {v.name for v in graph.inputs if v.name})
    rng = np.random.default_rng(seed)
    cache: dict[int, tuple[BlockQuantized, float, float]] = {}  # a weight two MatMuls share is quantized once
    emitted: dict[tuple[int, str], list[ir.Node]] = {}  # per shared weight: the nodes its first layer got
    changed = 0
    slower = False
    if decider is not None:
        from graphopt.passes.weight_quant_decision import BASELINE, decide_weight_quantization

        candidates = [layer.node.inputs[0] for layer in layers if id(layer) not in heads and layer.node.inputs[0] is not None
                      and _form(model, target, layer.weight_value.dtype, plan) is not None and not any(_matches(layer, e) for e in keep)]
        decision = decide_weight_quantization(candidates, plan.weights, plan.bits, decider)
        slower = decision is not None and decision.chosen == BASELINE
    for layer in layers:
        node = layer.node
        form = _form(model, target, layer.weight_value.dtype, plan)
        if any(_matches(layer, entry) for entry in keep):
            layer.keep_reason = "keep_list"
        elif id(layer) in heads:
            layer.keep_reason = "lm_head"
        elif form is None:
            layer.keep_reason = "no_kernel"
        elif slower:
            layer.keep_reason = "speed_decision"
        if not layer.keep_reason:
            cached = cache.get(id(layer.weight_value)) if node.op_type == "MatMul" else None  # a Gemm's may carry alpha, transB
            if cached is None:
                quantized = quantize(layer.weight, plan.bits, plan.block_size, plan.is_symmetric)
                cached = (quantized, *_measure(layer, quantized, rng))
                if node.op_type == "MatMul":
                    cache[id(layer.weight_value)] = cached
            layer.quantized, layer.snr, layer.weight_snr = cached
            if layer.snr < plan.budget_db:
                layer.keep_reason = "budget"
        summary.layers.append(WeightLayer(_label(node), node.op_type, layer.k, layer.n, not layer.keep_reason, layer.keep_reason,
                                          None if layer.snr is None else round(layer.snr, 2),
                                          None if layer.weight_snr is None else round(layer.weight_snr, 2)))
        if layer.keep_reason or layer.quantized is None or form is None:
            summary.kept += 1
            continue
        share = id(layer.weight_value) if node.op_type == "MatMul" else None
        first = emitted.get((share, form)) if share is not None else None
        made = _rewrite(model, layer, layer.quantized, form, names, level, first)
        if share is not None and first is None:
            emitted[(share, form)] = made
        summary.quantized += 1
        if first is None:  # a shared weight is stored once
            summary.bytes_before += layer.weight.nbytes
            summary.bytes_after += stored_bytes(layer.quantized)
        changed += 1
    if any(n.domain == MS_DOMAIN for n in graph) and MS_DOMAIN not in model.opset_imports:
        model.opset_imports[MS_DOMAIN] = 1
    record(stats, changed, started)
    return summary


def _rewrite(model: ir.Model, layer: _Layer, quantized: BlockQuantized, form: str, names: _Names, level: int,
             first: list[ir.Node] | None) -> list[ir.Node]:
    """Replace the layer's node; returns the nodes that compute its matmul (for `emit_again`)."""
    graph, node = model.graph, layer.node
    base = _label(node)
    fresh = lambda hint: names(f"{base}_{hint}")  # noqa: E731
    a = node.inputs[0]
    assert a is not None
    made = emit_again(a, first, fresh) if first is not None else emit(form, graph, a, quantized, fresh, level)
    matmul = list(made)
    result = made[-1].outputs[0]
    if layer.bias is not None:
        bias = layer.bias
        if isinstance(bias, np.ndarray):
            name = names(f"{base}_bias")
            bias = ir.Value(name=name, const_value=ir.Tensor(bias, name=name), type=ir.TensorType(ir.DataType.from_numpy(bias.dtype)),
                            shape=ir.Shape(bias.shape))
            graph.register_initializer(bias)
        add = ir.Node("", "Add", [result, bias], name=names(f"{base}_add_bias"))
        made.append(add)
        result = add.outputs[0]
    old = node.outputs[0]
    result.type, result.shape = old.type, old.shape
    graph.insert_before(node, made)
    old_name = old.name
    old.replace_all_uses_with(result, replace_graph_outputs=True)
    detach_and_remove(model, node)
    if old_name:
        result.name = old_name  # readers and graph outputs keep the model's value names
    return matmul
