"""Decode GEMMs offered to graphopt::gemv_linear (`options={"gemv": True}` where inductor replays CUDA graphs, issue 17).

A GEMM of few rows (decode: tokens x batch <= `MAX_ROWS`, known when the graph is compiled) with
a constant weight streams that weight from memory; graphopt.kernels.gemv is built for that. This
pass does not decide whether it is faster: it writes each such GEMM as the site op
``graphopt::tuned_gemv_linear(x, W, bias)``, which inductor lowers through its custom-op
autotuning (graphopt.inductor_choices): graphopt's kernel against inductor's own lowering of
the same linear (cuBLAS through its extern mm, or in max-autotune whatever its GEMM autotuner
picks), timed on the user's GPU when the graph is compiled. Where inductor's is faster its code
is inlined, as if the site had never been written (apart from the layout of a packed weight,
below); where graphopt's is faster the site calls it. The report's "kernel" decisions say which
won and both times.

Sites: ``aten.mm(x, B)``, ``aten.matmul(x, B)``, ``aten.addmm(bias, x, B)`` (beta = alpha = 1, a [N]
bias) and ``aten.linear(x, W, bias)`` with x [..., K] fp16 or bf16 on CUDA, its rows (the product of the
leading dims) a static int <= MAX_ROWS, and B [K, N] (linear: W [N, K]) a constant in x's dtype:

* ``t(W)`` of a constant W [N, K] contiguous (a frozen nn.Linear weight): W itself is the
  kernel's operand, nothing copied;
* a constant [K, N] (what projection packing writes: q|k|v, gate|up): transposed once at
  compile time into a new contiguous [N, K] constant (the kernel reads rows of W along K);
  the old constant dies with its GEMM. Inductor's side of the site then reads that [N, K]
  layout too (cuBLAS's "NT" GEMM where it had "NN"): the two sides are timed on one layout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from graphopt.passes.fx_passes import NewConstant, _constant_2d, _fake_call, _transposed_constant

__all__ = ["offer_gemv_sites", "MAX_ROWS", "DTYPES", "OFFER_OFF_CUDA"]

aten = torch.ops.aten

#: Up to this many rows a GEMM is offered (graphopt.kernels.gemv.SMALL_M).
MAX_ROWS = 16
DTYPES = (torch.float16, torch.bfloat16)
#: Offer sites off CUDA too (tests: inductor's autotuner then times both sides on the CPU).
OFFER_OFF_CUDA = False


def _rows(x_val: Any) -> int | None:
    """The rows of x [..., K] (tokens x batch), None where symbolic (the compiled code then serves any M)."""
    rows = 1
    for d in x_val.shape[:-1]:
        if not isinstance(d, int):
            return None
        rows *= d
    return rows


class _Transposed:
    """linear's W read as B = W^T (what _weight takes)."""

    def __init__(self, source: fx.Node) -> None:
        self.source = source


def _as_transposed(gm: fx.GraphModule, w_attr: Any) -> _Transposed | None:
    w = _constant_2d(gm, w_attr)
    return _Transposed(w_attr) if w is not None else None


def _weight(gm: fx.GraphModule, operand: Any) -> tuple[fx.Node | None, torch.Tensor] | None:
    """(a node holding W [N, K] contiguous, or None where it must be made; W [N, K]) for B = W^T."""
    if isinstance(operand, _Transposed):
        w = _constant_2d(gm, operand.source)
        assert w is not None
        return (operand.source, w) if w.is_contiguous() else (None, w)
    transposed = _transposed_constant(gm, operand)
    if transposed is not None:
        source, w = transposed
        return (source, w) if w.is_contiguous() else (None, w)
    matrix = _constant_2d(gm, operand)  # B [K, N] itself
    return (None, matrix.t()) if matrix is not None else None


def _site(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, Any, fx.Node | None, torch.Tensor] | None:
    """(x, W's node or None, the bias node or None, W [N, K]) for a GEMM this pass offers."""
    if node.op != "call_function" or node.kwargs:
        return None
    args: list[Any] = list(node.args)
    bias: Any = None
    operand: Any
    if node.target is aten.mm.default and len(args) == 2:
        (x, operand), max_dim = args, 2
    elif node.target is aten.matmul.default and len(args) == 2:  # x [..., K] @ B [K, N]
        (x, operand), max_dim = args, 8
    elif node.target is aten.addmm.default and len(args) == 3:
        (bias, x, operand), max_dim = args, 2
    elif node.target is aten.linear.default and len(args) in (2, 3):  # x [..., K], W [N, K]
        x, operand, max_dim = args[0], _as_transposed(gm, args[1]), 8
        bias = args[2] if len(args) == 3 else None
    else:
        return None
    if operand is None or not (bias is None or isinstance(bias, fx.Node)) or not isinstance(x, fx.Node):
        return None
    x_val = x.meta.get("val")
    if x_val is None or not 2 <= x_val.dim() <= max_dim or x_val.dtype not in DTYPES:
        return None
    if x_val.device.type != "cuda" and not OFFER_OFF_CUDA:
        return None
    rows = _rows(x_val)
    if rows is None or not 1 <= rows <= MAX_ROWS:
        return None
    found = _weight(gm, operand)
    if found is None:
        return None
    w_node, w = found
    if w.dtype != x_val.dtype or w.shape[1] != x_val.shape[-1] or w.device != x_val.device:
        return None
    if bias is not None:
        b_val = bias.meta.get("val")
        if b_val is None or tuple(b_val.shape) != (w.shape[0],) or b_val.dtype != x_val.dtype:
            return None
    return x, w_node, bias, w


def offer_gemv_sites(gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any) -> int:
    """Write every eligible GEMM as graphopt::tuned_gemv_linear; returns how many."""
    import graphopt.inductor_choices  # noqa: F401  (registers torch.ops.graphopt.tuned_gemv_linear)

    target = torch.ops.graphopt.tuned_gemv_linear.default
    graph = gm.graph
    no_bias: dict[tuple[Any, ...], fx.Node] = {}
    written = 0
    for node in list(graph.nodes):
        site = _site(gm, node)
        if site is None:
            continue
        x, w_node, bias, w = site
        if w_node is None:
            w_node = new_constant(w.contiguous(), f"{node.name}_weight_nk")
        if bias is None:
            key = (w.dtype, w.device)
            if key not in no_bias:
                no_bias[key] = new_constant(torch.zeros(0, dtype=w.dtype, device=w.device), "gemv_no_bias")
            bias = no_bias[key]
        args = (x, w_node, bias)
        with graph.inserting_before(node):
            replacement = graph.call_function(target, args)
        replacement.meta["val"] = _fake_call(fake_mode, target, tuple(a.meta["val"] for a in args))
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        written += 1
    return written
