"""Lower graphopt's own fused ops onto the ops the target runs.

Rules emit neutral `graphopt.*` ops; this last step maps each onto the target's
op (for onnxruntime, its com.microsoft contrib kernels; for plain ONNX, standard
ops of recent opsets), moving inputs and renaming attributes as the target's
`Lowering` says. The driver already refused any rewrite whose op the target
cannot lower, so every graphopt op found here has a lowering.
"""

from __future__ import annotations

import onnx_ir as ir

from graphopt.ops.targets import GRAPHOPT_DOMAIN, Lowering, Target

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
            _apply(node, low)
            lowered += 1
            if low.domain and low.domain not in model.opset_imports:
                model.opset_imports[low.domain] = 1
    return lowered


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
    for name, targets in low.rename.items():
        attr = node.attributes.pop(name, None)
        if attr is None:
            continue
        for target_name in targets:
            node.attributes[target_name] = ir.Attr(target_name, attr.type, attr.value)
