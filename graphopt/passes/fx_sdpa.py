"""What SDPA's attn_mask looks like when graphopt hands the graph on (issue 15, T5).

On CUDA the fused scaled_dot_product_attention kernels (memory-efficient, cuDNN) read an
additive mask only with stride 1 on its last axis, its other strides multiples of 8 elements,
its base 16-byte aligned and its dtype the query's; otherwise SDPA runs its math form (a
float32 upcast, two batched matmuls and a softmax: several kernels per attention). The CPU
kernels take any mask, so nothing on a CPU shows it.

graphopt can make such a mask where dynamo's graph had a dense one: drop_clones removes the
`.contiguous()` the model wrote and constant folding freezes the permuted view, strides and
all (T5's relative position bias: [1, heads, q, k] read from the embedding's [q, k, heads],
last-axis stride = heads; 12 attentions of T5-base in the math form on an H100, 1.13x
slower than inductor). What to do about it is `attention_mask` (a torch.compile option):

* ``"keep"`` (the default): nothing; the mask stays as folding left it. A dense copy of the
  frozen bias (commit c80cbcd, reverted in a3b0d21) made graphopt+inductor fail on the H100
  with "CUDA error: misaligned address" for a cause not found on a CPU, so no fused form is
  the default until `benchmarks/t5_attention_check.py` has run each one on the GPU.
* ``"aligned"``: a frozen mask is replaced, once at compile time, by a fresh allocation in
  the query's dtype: storage offset 0, base 16-byte aligned, last axis dense and its
  row stride padded to a multiple of 8 elements (as aten's pad_bias does per call); a
  computed mask with a strided last axis gets `clone(contiguous_format)` (the model's own
  `.contiguous()` again).
* ``"copy"``: a frozen mask is copied in the graph on every call (`clone`, in the query's
  dtype), so inductor owns the buffer and lays it out for the attention kernel as it does
  for the mask dynamo's graph computes; computed masks as with "aligned".
* ``"decompose"``: an attention whose mask is not fit for a fused kernel is written out
  (q @ k^T, scale, the mask added and the softmax in float32, @ v), as the model's eager
  attention has it: inductor then decides, as for a model that never called SDPA. Its
  fuse_attention patterns may make it an SDPA again (on a CPU they do, with the mask copied
  into a buffer of its own per call), or it fuses the scale, the mask and the softmax into
  one kernel between two half-precision GEMMs (the math form runs them in float32).

Masks already fit for a fused kernel, boolean masks, and attentions without a mask are left alone.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from graphopt.passes.fx_passes import NewConstant, _fake_call, attr_tensor

__all__ = ["MASK_HANDLING", "DEFAULT_MASK_HANDLING", "fused_ready", "aligned_mask", "attention_masks"]

aten = torch.ops.aten
prims = torch.ops.prims
SDPA = aten.scaled_dot_product_attention.default

MASK_HANDLING = ("keep", "aligned", "copy", "decompose")
DEFAULT_MASK_HANDLING = "keep"
#: Elements every non-unit stride but the last must be a multiple of (mem-efficient attention's
#: kAlignmentQ for half types; inductor's sdpa_constraint ALIGNMENT), and bytes of base alignment.
STRIDE_ALIGNMENT = 8
BASE_ALIGNMENT = 16


def fused_ready(mask: Any, dtype: torch.dtype) -> bool:
    """Whether a fused CUDA attention kernel reads `mask` as it is with a `dtype` query: last
    axis dense, the other strides multiples of 8 elements (0 for a broadcast axis is fine),
    base and storage offset 16-byte aligned, the query's dtype. A value that is not a real
    or fake tensor, or has a symbolic stride, counts as ready (nothing to do for it)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() == 0:
        return True
    if mask.dtype == torch.bool:
        return True  # SDPA turns a boolean mask into a fresh float one itself
    strides, sizes = mask.stride(), mask.shape
    if not all(isinstance(s, int) for s in (*strides, *sizes, mask.storage_offset())):
        return True  # symbolic: no guard on a stride
    if mask.dtype != dtype:
        return False
    if sizes[-1] > 1 and strides[-1] != 1:
        return False
    if any(size > 1 and stride % STRIDE_ALIGNMENT for size, stride in zip(sizes[:-1], strides[:-1])):
        return False
    if (mask.storage_offset() * mask.element_size()) % BASE_ALIGNMENT:
        return False
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(mask, FakeTensor) or mask.device.type == "meta" or mask.data_ptr() % BASE_ALIGNMENT == 0


def aligned_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`mask` in a fresh allocation of `dtype`: offset 0, last axis dense, its row stride
    padded to a multiple of 8 elements (a view of the first columns where padded)."""
    last = mask.shape[-1]
    padded = -(-last // STRIDE_ALIGNMENT) * STRIDE_ALIGNMENT
    storage = torch.zeros((*mask.shape[:-1], padded), dtype=dtype, device=mask.device)
    out = storage[..., :last] if padded != last else storage
    out.copy_(mask)
    assert out.data_ptr() % BASE_ALIGNMENT == 0 and fused_ready(out, dtype), (out.stride(), out.data_ptr())
    return out


def _arg(node: fx.Node, position: int, name: str, default: Any = None) -> Any:
    return node.args[position] if position < len(node.args) else node.kwargs.get(name, default)


def _set_mask(node: fx.Node, value: fx.Node) -> None:
    if len(node.args) > 3:
        args = list(node.args)
        args[3] = value
        node.args = tuple(args)
    else:
        node.kwargs = {**node.kwargs, "attn_mask": value}


def _call(graph: fx.Graph, fake_mode: Any, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> fx.Node:
    node = graph.call_function(target, args, kwargs or {})
    vals = fx.node.map_arg((args, kwargs or {}), lambda n: n.meta["val"])
    node.meta["val"] = _fake_call(fake_mode, target, vals[0], vals[1])
    return node


class _Masks:
    """One replacement per mask value, shared by every attention that reads it."""

    def __init__(self, gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any, how: str) -> None:
        self.gm, self.new_constant, self.fake_mode, self.how = gm, new_constant, fake_mode, how
        self.made: dict[tuple[fx.Node, torch.dtype], fx.Node] = {}

    def replacement(self, mask: fx.Node, dtype: torch.dtype) -> fx.Node | None:
        key = (mask, dtype)
        if key not in self.made:
            made = self._constant(mask, dtype) if mask.op == "get_attr" else self._computed(mask, dtype)
            if made is None:
                return None
            self.made[key] = made
        return self.made[key]

    def _constant(self, mask: fx.Node, dtype: torch.dtype) -> fx.Node | None:
        tensor = attr_tensor(self.gm, str(mask.target))
        if not isinstance(tensor, torch.Tensor) or fused_ready(tensor, dtype):
            return None
        name = f"{mask.name.removeprefix('_go_')}_aligned"
        if self.how == "aligned":
            return self.new_constant(aligned_mask(tensor, dtype), name)
        # "copy": the constant as it is (in the query's dtype), copied dense on every call
        source = mask if tensor.dtype == dtype else self.new_constant(tensor.to(dtype), name)
        graph = self.gm.graph
        with graph.inserting_after(source):
            return _call(graph, self.fake_mode, aten.clone.default, (source,), {"memory_format": torch.contiguous_format})

    def _computed(self, mask: fx.Node, dtype: torch.dtype) -> fx.Node | None:
        val = mask.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0 or val.dtype == torch.bool:
            return None
        stride = val.stride(-1)
        if not isinstance(stride, int) or stride == 1 or val.shape[-1] == 1:
            return None  # only the strided last axis (what a dropped clone did); the rest is inductor's layout to choose
        graph = self.gm.graph
        with graph.inserting_after(mask):
            return _call(graph, self.fake_mode, aten.clone.default, (mask,), {"memory_format": torch.contiguous_format})


def _decomposable(node: fx.Node) -> bool:
    return (_arg(node, 4, "dropout_p", 0.0) == 0.0 and not _arg(node, 5, "is_causal", False)
            and not node.kwargs.get("enable_gqa", False))


def _decompose(gm: fx.GraphModule, node: fx.Node, mask: fx.Node, fake_mode: Any) -> None:
    """softmax(q @ k^T * scale + mask) @ v, the scores and the softmax in float32."""
    q, k, v = node.args[:3]
    assert isinstance(q, fx.Node) and isinstance(k, fx.Node) and isinstance(v, fx.Node)
    qval = q.meta["val"]
    scale = _arg(node, 6, "scale")
    if scale is None:
        scale = 1.0 / float(qval.shape[-1]) ** 0.5
    graph = gm.graph
    with graph.inserting_before(node):
        scores = _call(graph, fake_mode, aten.matmul.default, (q, _call(graph, fake_mode, aten.transpose.int, (k, -2, -1))))
        scores = _call(graph, fake_mode, prims.convert_element_type.default, (scores, torch.float32))
        if scale != 1.0:
            scores = _call(graph, fake_mode, aten.mul.Tensor, (scores, float(scale)))
        scores = _call(graph, fake_mode, aten.add.Tensor, (scores, mask))
        probs = _call(graph, fake_mode, aten._softmax.default, (scores, -1, False))
        probs = _call(graph, fake_mode, prims.convert_element_type.default, (probs, qval.dtype))
        out = _call(graph, fake_mode, aten.matmul.default, (probs, v))
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def attention_masks(gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any, how: str = DEFAULT_MASK_HANDLING) -> int:
    """Apply `how` (one of MASK_HANDLING) to every SDPA whose floating mask a fused CUDA
    kernel would not read as it is; returns how many masks were replaced (shared ones once)
    or, for "decompose", how many attentions were written out."""
    if how not in MASK_HANDLING:
        raise ValueError(f"attention_mask takes one of {', '.join(MASK_HANDLING)}, not {how!r}")
    if how == "keep":
        return 0
    masks = _Masks(gm, new_constant, fake_mode, how)
    decomposed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not SDPA:
            continue
        mask, query = _arg(node, 3, "attn_mask"), node.args[0]
        if not isinstance(mask, fx.Node) or not isinstance(query, fx.Node):
            continue
        dtype = query.meta["val"].dtype
        value = attr_tensor(gm, str(mask.target)) if mask.op == "get_attr" else mask.meta.get("val")
        if fused_ready(value, dtype):
            continue
        if how == "decompose":
            if _decomposable(node):
                _decompose(gm, node, mask, fake_mode)
                decomposed += 1
            continue
        replacement = masks.replacement(mask, dtype)
        if replacement is not None:
            _set_mask(node, replacement)
    return decomposed if how == "decompose" else len(masks.made)
