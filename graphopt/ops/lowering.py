"""Lower graphopt's own fused ops onto the ops the target runs.

Rules emit neutral `graphopt.*` ops; this last step maps each onto the target's
op (for onnxruntime, its com.microsoft contrib kernels). The driver already
refused any rewrite whose op the target cannot lower, so every graphopt op
found here has a lowering.
"""

from __future__ import annotations

import onnx_ir as ir

from graphopt.ops.targets import GRAPHOPT_DOMAIN, Target

__all__ = ["lower_fused_ops"]


def lower_fused_ops(model: ir.Model, target: Target) -> int:
    lowered = 0
    graphs = [*model.graphs(), *model.functions.values()]
    for graph in graphs:
        for node in graph:
            if node.domain != GRAPHOPT_DOMAIN:
                continue
            domain, op_type = target.lowered(node.domain, node.op_type)
            if domain == GRAPHOPT_DOMAIN:
                raise AssertionError(f"target {target.name} has no lowering for graphopt.{node.op_type}")
            node.domain, node.op_type = domain, op_type
            lowered += 1
            if domain and domain not in model.opset_imports:
                model.opset_imports[domain] = 1
    return lowered
