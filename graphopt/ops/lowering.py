"""Lower graphopt's own fused ops onto the ops the target runs.

Rules emit neutral `graphopt.*` ops; this last step maps each onto the target's
op (for onnxruntime, its com.microsoft contrib kernels; for plain ONNX, standard
ops of recent opsets), moving inputs and renaming attributes as the target's
`Lowering` says. The driver already refused any rewrite whose op the target
cannot lower, so every graphopt op found here has a lowering.
"""

from __future__ import annotations

import onnx_ir as ir

from graphopt.ops.registry import GRAPHOPT_DOMAIN, Lowering, attribute_default
from graphopt.ops.targets import Target
from graphopt.pattern.ir import MISSING

__all__ = ["lower_fused_ops"]


def lower_fused_ops(model: ir.Model, target: Target) -> int:
    lowered = 0
    graphs = [*model.graphs(), *model.functions.values()]
    for graph in graphs:
        for node in graph:
            if node.domain != GRAPHOPT_DOMAIN:
                continue
            low = target.lowering(node.op_type)
            if low is None:
                raise AssertionError(f"target {target.name} has no lowering for graphopt.{node.op_type}")
            _write_explicit_defaults(node, low)
            _apply(node, low)
            lowered += 1
            if low.domain and low.domain not in model.opset_imports:
                model.opset_imports[low.domain] = 1
    return lowered


def _write_explicit_defaults(node: ir.Node, low: Lowering) -> None:
    """Attributes whose default differs on the target's op get graphopt's default written out
    (QuickGelu's alpha is 1.702; opset 24 Swish's defaults to 1.0)."""
    for name in low.explicit:
        default = attribute_default(GRAPHOPT_DOMAIN, node.op_type, name)
        if name not in node.attributes and default is not MISSING:
            node.attributes[name] = ir.convenience.convert_attribute(name, default)


def _apply(node: ir.Node, low: Lowering) -> None:
    node.domain, node.op_type = low.domain, low.op_type
    # Optional outputs nobody reads are left unnamed ("" = not produced), so the
    # kernel need not compute them (e.g. SkipLayerNormalization's mean/inv_std).
    for output in node.outputs[1:]:
        if not output.uses() and not output.is_graph_output():
            output.name = ""
    if low.inputs is not None:
        old = list(node.inputs)
        new = [old[i] if i is not None and i < len(old) else None for i in low.inputs]
        while new and new[-1] is None:  # trailing omitted inputs are left out
            new.pop()
        node.resize_inputs(max(len(old), len(new)))
        for index, value in enumerate(new):
            node.replace_input_with(index, value)
        node.resize_inputs(len(new))
    # Trailing omitted inputs are dropped: an onnxruntime build whose schema of the op has fewer
    # inputs (GroupQueryAttention grew to 17) refuses a node that lists more, even empty ones.
    count = len(node.inputs)
    while count and node.inputs[count - 1] is None:
        count -= 1
    if count < len(node.inputs):
        node.resize_inputs(count)
    for name, targets in low.rename.items():
        attr = node.attributes.pop(name, None)
        if attr is None:
            continue
        for target_name in targets:
            node.attributes[target_name] = ir.Attr(target_name, attr.type, attr.value)
