"""Passes over FX graphs of ATen ops that are not single patterns (the torch backend's
counterparts of graphopt/passes/ for ONNX): constant folding, common-subexpression
elimination, the channels-last layout around convolutions, and small normalizations
that let the canonical rules see what ONNX graphs show (``rsqrt`` as
``Reciprocal(Sqrt)``, ``log1p`` as ``Log(Add(x, 1))``), undone after the rules ran
where nothing used them.

Every pass edits the graph in place, keeps ``node.meta["val"]`` (fake tensors) on the
nodes it makes, and returns how many changes it made.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.fx as fx

from graphopt.ir.fx_view import is_neutral

__all__ = [
    "fold_constants",
    "split_rsqrt",
    "merge_rsqrt",
    "split_log1p",
    "merge_log1p",
    "drop_clones",
    "views_to_reshapes",
    "to_channels_last",
    "pad_unaligned_gemms",
    "remove_dead_code",
    "eliminate_common_subexpressions",
    "attr_tensor",
]

aten = torch.ops.aten

# Never folded: uninitialized memory, and ops whose result is not a function of their inputs.
_NEVER_FOLD_NAMES = ("empty", "new_empty", "rand", "normal", "bernoulli", "dropout", "native_dropout", "uniform", "multinomial")

NewConstant = Callable[[torch.Tensor, str], fx.Node]


def attr_tensor(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _foldable(node: fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or is_neutral(node) or not isinstance(target, torch._ops.OpOverload):
        return False
    if node.is_impure() or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    name = target._schema.name.split("::")[-1]
    return not name.startswith(_NEVER_FOLD_NAMES)


def _bytes(val: Any) -> int | None:
    if not isinstance(val, torch.Tensor):
        return None
    numel = 1
    for d in val.shape:
        if not isinstance(d, int):
            return None  # symbolic: not a constant size
        numel *= d
    return numel * val.element_size()


def fold_constants(gm: fx.GraphModule, new_constant: NewConstant, size_limit_bytes: int = 1 << 20) -> int:
    """Evaluate nodes whose inputs are all constants (get_attr tensors) into new constants.

    A fold may make a constant of at most `size_limit_bytes`, unless it is no larger than
    the constants that die with it (a Cast or transpose of a weight read once)."""
    graph = gm.graph
    values: dict[fx.Node, torch.Tensor] = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            tensor = attr_tensor(gm, str(node.target))
            if isinstance(tensor, torch.Tensor):
                values[node] = tensor
    folded = 0
    for node in list(graph.nodes):
        if not _foldable(node) or not all(n in values for n in node.all_input_nodes):
            continue
        out_bytes = _bytes(node.meta.get("val"))
        if out_bytes is None:
            continue
        dying = sum(_bytes(n.meta.get("val")) or 0 for n in node.all_input_nodes if len(n.users) == 1)
        if out_bytes > size_limit_bytes and out_bytes > dying:
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
        try:
            with torch.no_grad():
                result = node.target(*args, **kwargs)  # type: ignore[operator]
        except Exception:  # an op that cannot run on these constants stays in the graph
            continue
        if not isinstance(result, torch.Tensor):
            continue
        with graph.inserting_before(node):
            constant = new_constant(result, node.name)
        sources = {n.meta.get("graphopt_source") for n in node.all_input_nodes} - {None, ""}
        if len(sources) == 1:  # a weight's transpose or cast keeps the parameter's name (reports, keep lists)
            constant.meta["graphopt_source"] = sources.pop()
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
        values[constant] = result
        folded += 1
    return folded


def drop_clones(gm: fx.GraphModule) -> int:
    """clone(x) -> x. After functionalization nothing writes to a clone, so it only copies
    (`.contiguous()` on a transposed tensor): it would hide the ops around it from the rules.
    Clones that feed the graph's outputs stay, so no output aliases an input; so do clones
    to channels-last (a bilinear upsample's `.contiguous(channels_last)`): inductor lays
    out the buffers around them by it (SegFormer's decode head without them, on CPU: its
    upsamples and their concat NCHW, gathered across channels-last rows, 1.36x inductor's time)."""
    changed = 0
    returned: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "output":
            fx.node.map_arg(node.args, returned.add)
    for node in list(gm.graph.nodes):
        if (node.op == "call_function" and node.target is aten.clone.default and node not in returned and isinstance(node.args[0], fx.Node)
                and node.kwargs.get("memory_format") not in (torch.channels_last, torch.channels_last_3d)):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            changed += 1
    if changed:  # strides downstream may differ now: a view may have to copy
        views_to_reshapes(gm)
    return changed


def split_rsqrt(gm: fx.GraphModule) -> int:
    """rsqrt(x) -> reciprocal(sqrt(x)), the form ONNX graphs (and the RMSNorm rules) have."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.rsqrt.default:
            with gm.graph.inserting_before(node):
                root = gm.graph.call_function(aten.sqrt.default, (node.args[0],))
                inverse = gm.graph.call_function(aten.reciprocal.default, (root,))
            root.meta["val"] = inverse.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(inverse)
            gm.graph.erase_node(node)
            changed += 1
    return changed


def merge_rsqrt(gm: fx.GraphModule) -> int:
    """reciprocal(sqrt(x)) with the sqrt read once -> rsqrt(x) (what split_rsqrt left unused)."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.reciprocal.default:
            continue
        root = node.args[0]
        if isinstance(root, fx.Node) and root.target is aten.sqrt.default and len(root.users) == 1:
            with gm.graph.inserting_before(node):
                merged = gm.graph.call_function(aten.rsqrt.default, (root.args[0],))
            merged.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(merged)
            gm.graph.erase_node(node)
            gm.graph.erase_node(root)
            changed += 1
    return changed


_SPLIT_LOG1P = "graphopt.split_log1p"  # meta key on the Log that split_log1p made


def split_log1p(gm: fx.GraphModule) -> int:
    """log1p(x) -> log(x + 1) on float tensors, the form ONNX graphs (and FuseSoftplus) have.
    merge_log1p puts back what the rules left, so log1p's precision near 0 is kept."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.log1p.default or not isinstance(node.args[0], fx.Node):
            continue
        val, src = node.meta.get("val"), node.args[0].meta.get("val")
        if not (isinstance(val, torch.Tensor) and isinstance(src, torch.Tensor) and src.dtype == val.dtype and val.dtype.is_floating_point):
            continue
        with gm.graph.inserting_before(node):
            plus_one = gm.graph.call_function(aten.add.Tensor, (node.args[0], 1))
            log = gm.graph.call_function(aten.log.default, (plus_one,))
        plus_one.meta["val"] = log.meta["val"] = val
        plus_one.meta[_SPLIT_LOG1P] = log.meta[_SPLIT_LOG1P] = True
        node.replace_all_uses_with(log)
        gm.graph.erase_node(node)
        changed += 1
    return changed


def merge_log1p(gm: fx.GraphModule) -> int:
    """log(x + 1) that split_log1p made and no rule used -> log1p(x) (a Log the user wrote stays)."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.log.default or not node.meta.get(_SPLIT_LOG1P):
            continue
        plus_one = node.args[0]
        if isinstance(plus_one, fx.Node) and plus_one.target is aten.add.Tensor and plus_one.args[1] == 1 and len(plus_one.users) == 1:
            with gm.graph.inserting_before(node):
                merged = gm.graph.call_function(aten.log1p.default, (plus_one.args[0],))
            merged.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(merged)
            gm.graph.erase_node(node)
            gm.graph.erase_node(plus_one)
            changed += 1
    return changed


def views_to_reshapes(gm: fx.GraphModule) -> int:
    """aten.view -> aten.reshape. Rewrites may hand a view a tensor with other strides (a
    permuted attention output, a channels-last feature map); reshape is a view whenever the
    strides allow it and a copy otherwise (what inductor's freezing does too)."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (aten.view.default, aten._unsafe_view.default):
            node.target = aten.reshape.default
            changed += 1
    return changed


def is_conv2d(node: fx.Node) -> bool:
    """A 2-D, not transposed convolution: aten.convolution, or graphopt::conv_relu (same x, w positions)."""
    if node.op != "call_function":
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 4:
        return False
    if node.target is aten.convolution.default:
        return not node.args[6]
    return str(node.target) == "graphopt.conv_relu.default"


def to_channels_last(gm: fx.GraphModule, new_constant: NewConstant) -> int:
    """2-D convolutions in channels-last (NHWC) memory format: constant weights are stored
    channels-last, and each input is made channels-last (a no-op at run time when its
    producer already was one: convolutions and pointwise ops keep the format)."""
    graph = gm.graph
    changed = 0
    for node in list(graph.nodes):
        if not is_conv2d(node):
            continue
        x, w = node.args[0], node.args[1]
        if isinstance(w, fx.Node) and w.op == "get_attr":
            weight = attr_tensor(gm, str(w.target))
            if isinstance(weight, torch.Tensor) and not weight.is_contiguous(memory_format=torch.channels_last):
                with graph.inserting_before(node):
                    w_cl = new_constant(weight.contiguous(memory_format=torch.channels_last), f"{w.name}_nhwc")
                node.replace_input_with(w, w_cl)
        if isinstance(x, fx.Node) and not (x.target is aten.contiguous.default and x.kwargs.get("memory_format") == torch.channels_last):
            with graph.inserting_before(node):
                x_cl = graph.call_function(aten.contiguous.default, (x,), {"memory_format": torch.channels_last})
            x_val = x.meta.get("val")
            x_cl.meta["val"] = x_val.contiguous(memory_format=torch.channels_last) if isinstance(x_val, torch.Tensor) else x_val
            node.replace_input_with(x, x_cl)
        changed += 1
    return changed


#: Half-precision GEMMs whose output row length N is not a multiple of this run on slow
#: unaligned kernels: GPT-2's LM head (N = 50257) takes 0.42 ms on an H200, 0.07 ms padded
#: to 50264 (benchmarks/torch_op_choices.py, "lm_head").
GEMM_N_ALIGNMENT = 8
_PADDED_GEMM_MIN_N = 256  # below this the GEMM is too small for the padding to matter
_GEMMS = (aten.mm.default, aten.matmul.default, aten.addmm.default)


def _transposed_constant(gm: fx.GraphModule, node: Any) -> tuple[fx.Node, torch.Tensor] | None:
    """(get_attr node, its tensor W [N, K]) when `node` is W transposed (t / permute / transpose)."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    args: list[Any] = list(node.args)
    is_t = node.target is aten.t.default or (node.target is aten.permute.default and list(args[1]) == [1, 0]) or (
        node.target is aten.transpose.int and sorted(int(d) % 2 for d in args[1:3]) == [0, 1])
    source = node.args[0]
    if not is_t or not isinstance(source, fx.Node) or source.op != "get_attr":
        return None
    tensor = attr_tensor(gm, str(source.target))
    return (source, tensor) if isinstance(tensor, torch.Tensor) and tensor.dim() == 2 else None


def _constant_2d(gm: fx.GraphModule, node: Any) -> torch.Tensor | None:
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    tensor = attr_tensor(gm, str(node.target))
    return tensor if isinstance(tensor, torch.Tensor) and tensor.dim() == 2 else None


def _padded_right_operand(gm: fx.GraphModule, operand: Any, n: int, padded_n: int,
                          new_constant: NewConstant, fake_mode: Any) -> fx.Node | None:
    """The GEMM's constant right operand [K, N] as a node of the padded one [K, padded_n]."""
    transposed = _transposed_constant(gm, operand)
    if transposed is not None:  # B = W^T with W [N, K] (nn.Linear): pad W's rows, transpose again
        source, weight = transposed
        w_node = new_constant(torch.nn.functional.pad(weight, (0, 0, 0, padded_n - n)), f"{source.name}_padded")
        t_node = gm.graph.call_function(aten.t.default, (w_node,))
        t_node.meta["val"] = _fake_call(fake_mode, aten.t.default, (w_node.meta.get("val"),))
        return t_node
    matrix = _constant_2d(gm, operand)
    if matrix is None:
        return None
    return new_constant(torch.nn.functional.pad(matrix, (0, padded_n - n)), f"{operand.name}_padded")


def pad_unaligned_gemms(gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any,
                        devices: tuple[str, ...] = ("cuda",)) -> int:
    """A half-precision GEMM (on one of `devices`) with a constant right operand whose N is
    unaligned gets that operand (and a constant bias) zero-padded to a multiple of
    GEMM_N_ALIGNMENT, once, at compile time; the result is the padded product sliced back to N
    (a view: the extra columns are computed and never read). The values are the same; the
    kernel is an aligned one."""
    graph = gm.graph
    changed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _GEMMS:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.device.type not in devices or val.dtype not in (torch.float16, torch.bfloat16):
            continue
        n = val.shape[-1]
        if not isinstance(n, int) or n % GEMM_N_ALIGNMENT == 0 or n < _PADDED_GEMM_MIN_N:
            continue
        args = list(node.args)
        is_addmm = node.target is aten.addmm.default
        padded_n = -(-n // GEMM_N_ALIGNMENT) * GEMM_N_ALIGNMENT
        bias: torch.Tensor | None = None
        if is_addmm:  # addmm(bias, x, B): the bias must be a constant [N] to be padded too
            bias_node = args[0]
            bias = attr_tensor(gm, str(bias_node.target)) if isinstance(bias_node, fx.Node) and bias_node.op == "get_attr" else None
            if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != n:
                continue
        right = 2 if is_addmm else 1
        with graph.inserting_before(node):
            new_right = _padded_right_operand(gm, args[right], n, padded_n, new_constant, fake_mode)
            if new_right is None:
                continue
            args[right] = new_right
            if bias is not None:
                args[0] = new_constant(torch.nn.functional.pad(bias, (0, padded_n - n)), f"{node.name}_bias_padded")
            product = graph.call_function(node.target, tuple(args), dict(node.kwargs))
            arg_vals = tuple(a.meta.get("val") if isinstance(a, fx.Node) else a for a in args)
            product.meta["val"] = _fake_call(fake_mode, node.target, arg_vals, dict(node.kwargs))
            sliced = graph.call_function(aten.slice.Tensor, (product, val.dim() - 1, 0, n))
            sliced.meta["val"] = _fake_call(fake_mode, aten.slice.Tensor, (product.meta["val"], val.dim() - 1, 0, n))
        node.replace_all_uses_with(sliced)
        graph.erase_node(node)
        changed += 1
    return changed


def _fake_call(fake_mode: Any, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    if fake_mode is None:
        return target(*args, **(kwargs or {}))
    with fake_mode:
        return target(*args, **(kwargs or {}))


def remove_dead_code(gm: fx.GraphModule) -> int:
    """Erase pure nodes nobody reads, then the constants nothing reads any more."""
    graph = gm.graph
    before = len(graph.nodes)
    for node in list(graph.nodes):  # getitems of erased tuples first, so their producers can go too
        if node.op == "call_function" and node.target is operator.getitem and not node.users:
            graph.erase_node(node)
    # Random ops nobody reads go too (SDPA is tagged random for its dropout, even at p = 0).
    graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure(impure_random=False))
    used = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_buffers(recurse=False)):
        if name.startswith(("_go_", "_frozen_")) and name not in used:
            delattr(gm, name)
    return before - len(graph.nodes)


def _cse_key(arg: Any) -> Hashable:
    """A hashable stand-in for an argument, typed so that 1, 1.0 and True stay apart."""
    if isinstance(arg, (list, tuple)):
        return (type(arg).__name__, tuple(_cse_key(a) for a in arg))
    if isinstance(arg, dict):
        return ("dict", tuple(sorted((k, _cse_key(v)) for k, v in arg.items())))
    if isinstance(arg, fx.Node):
        return ("node", arg)
    hash(arg)  # a SymInt or a tensor argument raises TypeError: the node is not merged
    return (type(arg), arg)


def eliminate_common_subexpressions(gm: fx.GraphModule) -> int:
    """Merge call_function nodes that compute the same op on the same arguments (the
    same ``(h - mean)`` written twice in a LayerNorm), so a rule sees one shared value
    as the ONNX front door's CSE pass shows it. In place: the FX view keeps its graph
    (torch.fx's CSEPass builds a new GraphModule); its list of banned ops (random and
    in-place ops) is used as it is, and impure nodes are never merged."""
    from torch.fx.passes.dialect.common.cse_pass import get_CSE_banned_ops

    banned = get_CSE_banned_ops()
    seen: dict[Hashable, fx.Node] = {}
    merged = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.is_impure() or getattr(node.target, "overloadpacket", node.target) in banned:
            continue
        try:
            # What split_log1p made never merges with the same op the user wrote (log(x + 1) stays as written).
            key = (node.target, _cse_key(node.args), _cse_key(node.kwargs), bool(node.meta.get(_SPLIT_LOG1P)))
            kept = seen.setdefault(key, node)
        except TypeError:
            continue
        if kept is not node:
            node.replace_all_uses_with(kept)
            gm.graph.erase_node(node)
            merged += 1
    return merged
