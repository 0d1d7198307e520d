"""The fp16 range check: measure a model's float32 values and keep in float32 what float16 cannot hold.

`range_checked_plan` runs the float32 model on calibration inputs (onnxruntime, CPU) and
extends a `PrecisionPlan` with the nodes whose values overflow float16 or sit wholly in its
subnormals; then it converts a copy, runs it with float16 rounding emulated after every
node (`emulate_low_precision`, also used by `--verify`), and keeps the nodes that turned a
finite value non-finite, until the outputs are finite wherever the float32 model's are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.errors import GraphoptError
from graphopt.ops.targets import Target
from graphopt.passes._common import ONNX_DOMAINS
from graphopt.passes.precision import _Converter, _node_key, _op_name, convert_precision
from graphopt.passes.precision_plan import PrecisionPlan

__all__ = ["FP16_SAFE_MAX", "FP16_SMALLEST_NORMAL", "range_checked_plan", "emulate_low_precision"]

_FLOAT = ir.DataType.FLOAT


#: A value whose magnitude exceeds this (half of float16's largest, 65504) keeps the nodes
#: that read or write it in float32: headroom for inputs larger than the calibration's.
FP16_SAFE_MAX = 0.5 * 65504.0
#: A tensor whose every non-zero value is below float16's smallest normal number would be
#: held in subnormals (a few bits of precision) or flushed to zero.
FP16_SMALLEST_NORMAL = 2.0**-14
#: The range check runs the model (twice, on copies) on the CPU: not for models with more weights than this.
RANGE_CHECK_MAX_BYTES = 4 << 30
#: Rounds of "convert, run, keep the nodes that made a finite value non-finite".
MAX_RANGE_ROUNDS = 6


def _copy_with_origins(model: ir.Model) -> tuple[ir.Model, dict[int, ir.Node]]:
    """A deep copy of `model`, and for each main-graph node of the copy the original node."""
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    return copy, {id(c): o for c, o in zip(copy.graph, model.graph)}


def _run_exposed(model: ir.Model, feeds: dict[str, np.ndarray], dtypes: frozenset[ir.DataType]) -> dict[str, np.ndarray]:
    """Run `model` on onnxruntime's CPU provider with every main-graph node output of one of
    `dtypes` exposed as a graph output; returns every value by name."""
    import onnxruntime as ort

    outputs = list(model.graph.outputs)
    names = {v.name for v in outputs}
    for node in model.graph:
        for value in node.outputs:
            if value.name and value.name not in names and value.dtype in dtypes:
                model.graph.outputs.append(value)
                names.add(value.name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    session = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    arrays = session.run(None, {k: v for k, v in feeds.items() if k in wanted})
    result = dict(zip([o.name for o in session.get_outputs()], arrays))
    result.update({k: v for k, v in feeds.items()})
    return result


def _calibration_feeds(model: ir.Model, path: Any) -> tuple[dict[str, np.ndarray], str]:
    from graphopt.inputs import _inputs, _resolve_shapes, make_inputs

    if path is None:
        return make_inputs(model, _resolve_shapes(model.graph, {}), seed=0), "random inputs from the input specs"
    try:
        with np.load(path, allow_pickle=False) as data:
            feeds = {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError) as error:
        raise GraphoptError(f"--calibration-data {path}: cannot read it as an .npz of input arrays: {error}") from None
    expected = {name for name, _ in _inputs(model.graph)}
    if set(feeds) != expected:
        raise GraphoptError(
            f"--calibration-data {path}: it holds {', '.join(sorted(feeds)) or 'no arrays'}; the model's inputs are {', '.join(sorted(expected))}"
        )
    return feeds, f"calibration inputs from {path}"


#: Values this large stand for infinity (an attention mask filled with float32's lowest,
#: -3.4e38): not a range the computation reaches. In float16 they become +-65504 (a constant
#: is clamped) or +-inf, which a softmax or a Max treats the same; the float16 run checks it.
MASK_FILL = 1e30


def _max_abs(array: np.ndarray) -> float:
    """The largest finite magnitude below MASK_FILL."""
    magnitude = np.abs(np.asarray(array, dtype=np.float64))
    return float(magnitude[np.isfinite(magnitude) & (magnitude < MASK_FILL)].max(initial=0.0))


def range_checked_plan(
    model: ir.Model, target: Target, plan: PrecisionPlan, calibration: Any = None, *, say: Callable[[str], None] | None = None
) -> tuple[PrecisionPlan, list[Any], str]:
    """The plan with `range_keep` set: the nodes whose float32 values, measured on the
    calibration inputs, do not fit float16 (above `FP16_SAFE_MAX`, or wholly below its
    smallest normal number), and then, converting a copy and running it, every node that
    turned a finite value non-finite, until the model's outputs are finite wherever the
    float32 model's are. Returns (plan, the kept nodes as RangeKeep records, a note on the
    inputs used, or why the check could not run)."""
    from graphopt.ops.lowering import lower_fused_ops
    from graphopt.report.sections import RangeKeep

    say = say or (lambda message: None)
    weights = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    if weights > RANGE_CHECK_MAX_BYTES:
        return plan, [], f"range check skipped: the model's {weights / 2**30:.1f} GiB of weights are more than it runs on the CPU ({RANGE_CHECK_MAX_BYTES / 2**30:.0f} GiB)"
    say("precision: range check (float32 run)")
    try:
        feeds, note = _calibration_feeds(model, calibration)
    except GraphoptError:
        raise
    except Exception as error:  # noqa: BLE001 - e.g. an input whose shape cannot be resolved
        return plan, [], f"range check skipped: no inputs to run the model on ({str(error).splitlines()[0][:200]})"
    reference, _ = _copy_with_origins(model)
    lower_fused_ops(reference, target)
    try:
        values = _run_exposed(reference, feeds, frozenset({_FLOAT}))
    except Exception as error:  # noqa: BLE001 - onnxruntime raises its own types
        return plan, [], f"range check skipped: the float32 model does not run on onnxruntime's CPU provider ({str(error).splitlines()[0][:200]})"
    peak = {name: _max_abs(a) for name, a in values.items() if np.asarray(a).dtype.kind == "f"}
    kept: dict[str, RangeKeep] = {}
    for node in model.graph:
        floats = [v for v in (*node.inputs, *node.outputs) if v is not None and v.name in peak and not _Converter.is_const(v)]
        if not floats:
            continue
        biggest = max(peak[v.name or ""] for v in floats)
        tiny = [v for v in node.outputs if v.name in peak and 0.0 < peak[v.name or ""] < FP16_SMALLEST_NORMAL]
        if biggest > FP16_SAFE_MAX:
            kept[_node_key(node)] = RangeKeep(_node_key(node), _op_name(node), "overflow", biggest)
        elif tiny:
            kept[_node_key(node)] = RangeKeep(_node_key(node), _op_name(node), "underflow", max(peak[v.name or ""] for v in tiny))
    outputs_finite = {v.name: np.isfinite(values[v.name or ""]) for v in model.graph.outputs if v.name in values}
    for round_ in range(MAX_RANGE_ROUNDS):
        say(f"precision: range check ({plan.precision} run {round_ + 1})")
        trial_plan = dataclasses.replace(plan, range_keep=frozenset(kept))
        copy, origin = _copy_with_origins(model)
        convert_precision(copy, target, trial_plan)
        lower_fused_ops(copy, target)
        _emulate_low(copy, plan.low_type, origin)
        try:
            low_values = _run_exposed(copy, feeds, frozenset({_FLOAT}))
        except Exception as error:  # noqa: BLE001
            return trial_plan, list(kept.values()), f"{note}; the {plan.precision} check did not run on onnxruntime's CPU provider ({str(error).splitlines()[0][:200]})"
        broken = [
            name for name, finite in outputs_finite.items()
            if name in low_values and bool(np.any(finite & ~np.isfinite(np.asarray(low_values[name or ""], dtype=np.float64))))
        ]
        if not broken:
            return trial_plan, list(kept.values()), note
        culprits = _culprits(copy, origin, low_values, values)
        new = [n for n in culprits if _node_key(n) not in kept]
        if not new:
            return trial_plan, list(kept.values()), f"{note}; outputs {', '.join(map(str, broken))} are still not finite in {plan.precision} (no node left to keep)"
        for node in new:
            read = [_max_abs(values[v.name]) for v in node.inputs if v is not None and v.name in values and np.asarray(values[v.name]).dtype.kind == "f"]
            kept[_node_key(node)] = RangeKeep(_node_key(node), _op_name(node), "non_finite", max(read, default=None))
    return dataclasses.replace(plan, range_keep=frozenset(kept)), list(kept.values()), f"{note}; gave up after {MAX_RANGE_ROUNDS} rounds"


def _emulate_low(model: ir.Model, low: ir.DataType, origin: dict[int, ir.Node]) -> None:
    """Make the converted model run its low-type arithmetic on onnxruntime's CPU provider
    faithfully: every node computes in float32 and each value it writes in the low type is
    rounded through Cast(low) -> Cast(float) (the CPU provider would otherwise run whole
    regions in float32 without rounding in between, hiding overflows). The rounded value
    keeps the name; `origin` maps the rounding Casts to the node they round for."""
    graph = model.graph
    made = 0
    for value in list(graph.initializers.values()):
        if value.dtype == low and value.const_value is not None:
            value.const_value = ir.tensor(value.const_value.numpy().astype(np.float32), name=value.name)
            value.type = ir.TensorType(_FLOAT)
    for value in graph.inputs:
        if value.dtype == low:
            return  # a model whose inputs are low-type already: nothing to emulate against
    for node in list(graph):
        if node.op_type == "Constant" and "value" in node.attributes:
            tensor = node.attributes["value"].value
            if isinstance(tensor, ir.TensorProtocol) and tensor.dtype == low:
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(tensor.numpy().astype(np.float32)))
        if node.op_type == "Cast" and node.domain in ONNX_DOMAINS and node.attributes.get_int("to") == int(low):
            node.attributes["to"] = ir.AttrInt64("to", int(_FLOAT))
        for out in node.outputs:
            if out.dtype != low or not out.name:  # an unnamed output is not produced
                continue
            out.type = ir.TensorType(_FLOAT)
            made += 1  # node names must be unique: a node may write several low-type outputs
            down = ir.Node("", "Cast", [out], [ir.AttrInt64("to", int(low))], name=f"__graphopt_round_low{made}")
            up = ir.Node("", "Cast", [down.outputs[0]], [ir.AttrInt64("to", int(_FLOAT))], name=f"__graphopt_round_up{made}")
            down.outputs[0].type = ir.TensorType(low)
            up.outputs[0].type = ir.TensorType(_FLOAT)
            name = out.name
            out.name = f"{name}__unrounded"
            out.replace_all_uses_with(up.outputs[0], replace_graph_outputs=True)
            down.replace_input_with(0, out)
            up.outputs[0].name = name
            down.outputs[0].name = f"{name}__low"
            graph.insert_after(node, [down, up])
            if id(node) in origin:
                origin[id(down)] = origin[id(up)] = origin[id(node)]


def emulate_low_precision(model: ir.Model, low: ir.DataType = ir.DataType.FLOAT16) -> ir.Model:
    """A copy of a converted model that onnxruntime's CPU provider runs with the low type's
    rounding and range after every node (see `_emulate_low`): what a GPU computing in the
    low type would store. The CPU provider's own float16 support computes regions of ops
    in float32 without rounding in between, so it does not show float16 overflow."""
    copy, _ = _copy_with_origins(model)
    if any(v.dtype is None for n in copy.graph for v in n.outputs):
        from graphopt.passes.shapes import infer_shapes

        try:
            infer_shapes(copy)  # only values of a known type can be rounded
        except Exception:  # noqa: BLE001, S110 - what stays untyped is run as it is
            pass
    _emulate_low(copy, low, {})
    return copy


def _culprits(copy: ir.Model, origin: dict[int, ir.Node], low: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> list[ir.Node]:
    """Original nodes where a value became non-finite in the low type though its float32
    value is finite and the node's own float inputs are finite. A Cast the conversion
    made (a value too large for the low type) points at the nodes reading it."""

    def finite(value: ir.Value | None) -> bool:
        return value is None or value.name not in low or bool(np.isfinite(np.asarray(low[value.name or ""], dtype=np.float64)).all())

    def readers(value: ir.Value) -> list[ir.Node]:
        """The first nodes with an origin downstream of `value`, through nodes that have none."""
        found, stack, seen = [], [value], set()
        while stack:
            for use in stack.pop().uses():
                if id(use.node) in seen:
                    continue
                seen.add(id(use.node))
                if id(use.node) in origin:
                    found.append(origin[id(use.node)])
                else:
                    stack.extend(use.node.outputs)
        return found

    found: list[ir.Node] = []
    for node in copy.graph:
        turned = [
            v for v in node.outputs
            if v.name in low and not finite(v) and (v.name not in reference or np.isfinite(np.asarray(reference[v.name or ""], dtype=np.float64)).all())
        ]
        if not turned or not all(finite(v) for v in node.inputs):
            continue
        candidates = [origin[id(node)]] if id(node) in origin else [r for v in turned for r in readers(v)]
        found.extend(c for c in candidates if c not in found)
    return found
