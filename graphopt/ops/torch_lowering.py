"""Lowering onto torch: canonical ops back to ATen calls, graphopt ops to torch.ops.graphopt.

The driver of the torch lowering. Two tables, one per kind of op a rule builds on an FX
graph (graphopt.ir.fx_view), each in its own module:

* `CANONICAL` (graphopt.ops.torch_canonical) -- a standard ONNX op (Conv, Gemm, Reshape,
  Cast, ...) becomes the ATen call(s) with that meaning, at once, when the rewrite is planned;
* `GRAPHOPT` (graphopt.ops.torch_fused) -- a graphopt op (graphopt.SkipLayerNorm, ...) first
  becomes a *neutral* node that later rules can still match (`neutral_node`), and after the
  rules ran (`lower_neutral_nodes`) the torch custom op or ATen ops it runs on.

`torch_target` turns the tables into a `graphopt.ops.targets.Target` the driver
checks every rewrite against, exactly as for the ONNX targets: a graphopt op whose
custom op is not registered has no lowering, and when gradients flow (training)
neither has one whose custom op has no registered backward.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from graphopt.ir.fx_values import InlineConst, is_neutral, neutral_op
from graphopt.ops import registry
from graphopt.ops import torch_aten_forms as torch_aten_forms  # attaches the ATen-only forms to GRAPHOPT
from graphopt.ops.fx_builder import ALL_DTYPES, FxBuilder, first_line
from graphopt.ops.targets import Lowering, Target
from graphopt.ops.torch_canonical import CANONICAL, emit_canonical
from graphopt.ops.torch_custom_ops import custom_op_problem, ensure_kernels
from graphopt.ops.torch_fused import GRAPHOPT, GraphoptLowering
from graphopt.pattern.native import RewriteDeclined

__all__ = [
    "FxBuilder",
    "CANONICAL",
    "GRAPHOPT",
    "GraphoptLowering",
    "emit_canonical",
    "neutral_node",
    "lower_neutral_nodes",
    "torch_target",
    "custom_op_problem",
    "ensure_kernels",
    "unavailable_graphopt_ops",
    "PREFERRED_OVER_INDUCTOR",
    "ATEN_FORM",
    "uses_aten_form",
]


def neutral_node(b: FxBuilder, op_type: str, args: list[Any], attrs: dict[str, Any], num_outputs: int) -> fx.Node:
    """A graphopt op as one FX node that rules can match; lowered by `lower_neutral_nodes`."""
    lowering = GRAPHOPT.get(op_type)
    if lowering is None:
        raise RewriteDeclined(f"target torch has no lowering for graphopt.{op_type}")
    attrs = registry.with_defaults(op_type, attrs)  # the declared defaults, as on every other target
    inputs = [b.tensor(a) if isinstance(a, InlineConst) else a for a in args]
    evaluating = FxBuilder(None, b.fake_mode, evaluate=True, inductor=b.inductor, autotune=b.autotune, site=b.site)
    fake_inputs = [b.meta(x) if x is not None else None for x in inputs]
    # Shapes only: the custom op's form where it is registered, else the ATen form (same outputs).
    fn = lowering.fn if lowering.problem(False) is None or lowering.aten is None else lowering.aten
    try:
        outs = fn(evaluating, fake_inputs, attrs, set(range(num_outputs)))
    except RewriteDeclined:
        raise
    except Exception as error:  # the custom op's shape checks refuse these inputs
        raise RewriteDeclined(f"graphopt.{op_type} does not take these inputs: {first_line(error)}") from None
    outs = outs[:num_outputs]
    if any(o is None for o in outs):
        raise RewriteDeclined(f"graphopt.{op_type} cannot produce all of its {num_outputs} outputs on torch")
    assert b.graph is not None
    node = b.graph.call_function(neutral_op(op_type), tuple(inputs), {})
    node.meta["val"] = tuple(outs) if num_outputs > 1 else outs[0]
    node.meta["graphopt_attrs"] = dict(attrs)
    if b.site:
        node.meta["graphopt_site"] = b.site
    b.created.append(node)
    return node


def lower_neutral_nodes(
    gm: fx.GraphModule,
    fake_mode: Any,
    constant: Callable[[torch.Tensor, str], Any],
    const_array: Callable[[Any], Any] | None = None,
    device: torch.device | str = "cpu",
    cuda_graphs: bool = False,
    target: Target | None = None,
    inductor: bool = False,
    autotune: bool = False,
) -> int:
    """Replace every neutral graphopt node by the torch ops it runs on; returns how many.
    `cuda_graphs`: the graph will replay as a CUDA graph (FxBuilder.cuda_graphs); `inductor`:
    inductor compiles it (FxBuilder.inductor). Where `target`
    lowers an op to its ATen-only form (`ATEN_FORM`), that form. `autotune`: inductor will autotune
    GEMMs (FxBuilder.autotune)."""
    graph = gm.graph
    lowered = 0
    for node in list(graph.nodes):
        if not is_neutral(node):
            continue
        op_type = node.target.op_type  # type: ignore[union-attr]
        multi = isinstance(node.meta.get("val"), tuple)
        projections = [u for u in node.users if u.target is operator.getitem] if multi else []
        wanted = {int(u.args[1]) for u in projections} if multi else {0}  # type: ignore[arg-type]
        with graph.inserting_before(node):
            b = FxBuilder(graph, fake_mode, constant=constant, const_array=const_array, device=device, cuda_graphs=cuda_graphs,
                          inductor=inductor, autotune=autotune, site=str(node.meta.get("graphopt_site", node.name)))
            lowering = GRAPHOPT[op_type]
            fn = lowering.aten if target is not None and uses_aten_form(target, op_type) else lowering.fn
            assert fn is not None
            outs = fn(b, list(node.args), dict(node.meta.get("graphopt_attrs", {})), wanted)
        if multi:
            for user in projections:
                user.replace_all_uses_with(outs[int(user.args[1])])  # type: ignore[arg-type]
                graph.erase_node(user)
        else:
            node.replace_all_uses_with(outs[0])
        graph.erase_node(node)
        lowered += 1
    return lowered


# --------------------------------------------------------------------------- the target


#: The target op name of a graphopt op lowered to its ATen-only form (graphopt.ops.torch_aten_forms).
ATEN_FORM = "aten::{}"


def uses_aten_form(target: Target, op_type: str) -> bool:
    """Whether `target` runs graphopt.<op_type> as its ATen-only form (no custom op)."""
    lowering, low = GRAPHOPT.get(op_type), target.lowerings.get(op_type)
    return lowering is not None and low is not None and bool(lowering.custom_ops) and low.op_type == ATEN_FORM.format(op_type)


#: graphopt ops whose custom kernels beat what inductor generates for the ops they replace,
#: measured on the GPU (the fact `torch_beats_inductor`, declared with the op in
#: graphopt/ops/fused_ops.py with its measurement): with inductor and kernels="auto" only
#: these are used, so that graphopt + inductor is never slower than inductor alone.
PREFERRED_OVER_INDUCTOR: frozenset[str] = registry.names_with("torch_beats_inductor", registry.GRAPHOPT_DOMAIN)


def torch_target(training: bool = False, kernels: str = "all") -> Target:
    """The capability table of the torch backend: every canonical op with an ATen form, and
    the graphopt ops whose custom ops are registered (and, for training, differentiable).

    `kernels`: "all" uses every registered custom op; "none" none of them (graphopt ops that
    lower to ATen only stay, and those with an ATen-only form run as it); "inductor" only
    those in PREFERRED_OVER_INDUCTOR (the others as "none")."""
    if kernels not in ("all", "none", "inductor"):
        raise ValueError(f"kernels must be 'all', 'none' or 'inductor', not {kernels!r}")
    kernel_table: dict[tuple[str, str], frozenset[str]] = {("", op): ALL_DTYPES for op in CANONICAL}
    lowerings: dict[str, Any] = {}
    for op_type, lowering in GRAPHOPT.items():
        no_kernel = kernels == "none" or (kernels == "inductor" and op_type not in PREFERRED_OVER_INDUCTOR)
        # A custom op that may not run, or cannot: the op's ATen-only form, where it has one.
        aten_only = bool(lowering.custom_ops) and (no_kernel or lowering.problem(training) is not None)
        if lowering.problem(training, aten_only) is not None:
            continue
        torch_op = lowering.custom_ops[0] if lowering.custom_ops and not aten_only else ATEN_FORM.format(op_type)
        lowerings[op_type] = Lowering("torch", torch_op)
        kernel_table[("torch", torch_op)] = lowering.dtypes
    name = "torch" + ("-train" if training else "") + {"all": "", "none": "-aten", "inductor": "+inductor"}[kernels]
    description = "torch.compile backend: ATen ops" + ("" if kernels == "none" else " and torch.ops.graphopt custom ops")
    if kernels == "inductor":
        description += " where they beat inductor's own code"
    if training:
        description += ", where gradients flow"
    return Target(name, description, kernel_table, lowerings, complete=True)


def unavailable_graphopt_ops(training: bool = False) -> dict[str, str]:
    """graphopt op -> why the torch target has no lowering for it (for reports and docs)."""
    return {op: reason for op, lowering in GRAPHOPT.items() if (reason := lowering.problem(training)) is not None}
