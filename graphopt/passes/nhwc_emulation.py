"""NHWC-only ops back in standard ops, so a layout-converted model runs on onnxruntime's CPU provider.

onnxruntime's CPU provider has no com.microsoft.NhwcConv, no channels-last GroupNorm and
no internal NHWC pools: `emulate_nhwc_ops` rewrites each into Transpose + its NCHW
standard-op equivalent + Transpose, for the layout pass's tests and for `--verify` of an
ort-cuda model on a machine without the CUDA provider.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphopt.ops.targets import MS_DOMAIN
from graphopt.passes.nhwc_graph import NHWC_DOMAIN, TO_NCHW, TO_NHWC, _attr, _Builder, _const, _detach_and_remove, _x

__all__ = ["emulate_nhwc_ops"]


def _emulate_group_norm(b: _Builder, node: ir.Node, x_nchw: ir.Value, made: list[ir.Node]) -> ir.Value:
    """com.microsoft.GroupNorm on NCHW data in standard ops: Reshape [N, G, -1] /
    InstanceNormalization / Reshape / Mul gamma / Add beta (/ SiLU)."""
    groups = int(_attr(node, "groups"))
    eps = float(_attr(node, "epsilon", 1e-5))
    gamma, beta = _const(node.inputs[1]), _const(node.inputs[2])
    # X's type (gamma and beta may be float32 under float16 X: the CUDA kernel reads them so).
    x = node.inputs[0]
    typed = x if x is not None and x.type is not None else x_nchw
    dtype = ir.DataType(typed.type.dtype).numpy() if typed.type is not None else np.float32
    shape1 = b.constant(np.array([0, groups, -1], np.int64), "gn_shape")
    r1 = b.node("", "Reshape", [x_nchw, shape1], hint="gn_group")
    ones = b.constant(np.ones(groups, dtype), "gn_one")
    zeros = b.constant(np.zeros(groups, dtype), "gn_zero")
    norm = b.node("", "InstanceNormalization", [r1.outputs[0], ones, zeros], {"epsilon": eps}, hint="gn_norm")
    shape = b.node("", "Shape", [x_nchw], hint="gn_shape_of")
    r2 = b.node("", "Reshape", [norm.outputs[0], shape.outputs[0]], hint="gn_back")
    g = b.constant(np.asarray(gamma, dtype).reshape(-1, 1, 1), "gn_gamma")
    bb = b.constant(np.asarray(beta, dtype).reshape(-1, 1, 1), "gn_beta")
    mul = b.node("", "Mul", [r2.outputs[0], g], hint="gn_scale")
    add = b.node("", "Add", [mul.outputs[0], bb], hint="gn_shift")
    made += [r1, norm, shape, r2, mul, add]
    y = add.outputs[0]
    if _attr(node, "activation", 0) == 1:
        sig = b.node("", "Sigmoid", [y], hint="gn_sigmoid")
        silu = b.node("", "Mul", [y, sig.outputs[0]], hint="gn_silu")
        made += [sig, silu]
        y = silu.outputs[0]
    return y


def emulate_nhwc_ops(model: ir.Model) -> int:
    """Replace NhwcConv, channels-last GroupNorm and internal-domain NHWC pools with
    Transpose + their NCHW standard-op equivalent + Transpose, so onnxruntime's CPU
    provider can run the model (for tests of the layout pass); returns how many."""
    b = _Builder(model)
    graph = model.graph
    replaced = 0
    for node in list(graph):
        is_conv = node.domain == MS_DOMAIN and node.op_type == "NhwcConv"
        is_gn = node.domain == MS_DOMAIN and node.op_type == "GroupNorm"
        is_pool = node.domain == NHWC_DOMAIN
        if not (is_conv or is_gn or is_pool):
            continue
        made: list[ir.Node] = []
        x = _x(node)
        channels_last = not is_gn or _attr(node, "channels_last", 1) == 1
        if channels_last:
            t_in = b.node("", "Transpose", [x], {"perm": list(TO_NCHW)}, hint="emu_to_nchw")
            made.append(t_in)
            x = t_in.outputs[0]
        if is_conv:  # NhwcConv's weights are [M, kH, kW, C/group]: back to Conv's [M, C/group, kH, kW]
            w_t = b.node("", "Transpose", [node.inputs[1]], {"perm": [0, 3, 1, 2]}, hint="emu_w")
            made.append(w_t)
            core = b.node("", "Conv", [x, w_t.outputs[0], *node.inputs[2:]], dict(node.attributes), hint="emu_conv")
            made.append(core)
            y = core.outputs[0]
        elif is_gn:
            y = _emulate_group_norm(b, node, x, made)
        else:
            core = b.node("", node.op_type, [x], dict(node.attributes), hint="emu_pool")
            made.append(core)
            y = core.outputs[0]
        if channels_last:
            t_out = b.node("", "Transpose", [y], {"perm": list(TO_NHWC)}, hint="emu_to_nhwc")
            made.append(t_out)
            y = t_out.outputs[0]
        old = node.outputs[0]
        y.type, y.shape = old.type, old.shape
        graph.insert_before(node, made)
        name = old.name
        old.name = b.fresh(name or "old")
        old.replace_all_uses_with(y, replace_graph_outputs=True)
        y.name = name
        _detach_and_remove(graph, [node])
        replaced += 1
    if NHWC_DOMAIN in model.opset_imports and not any(n.domain == NHWC_DOMAIN for n in graph):
        del model.opset_imports[NHWC_DOMAIN]
    return replaced
