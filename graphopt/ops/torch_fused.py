"""graphopt ops -> torch: the `GRAPHOPT` table. A graphopt op a rule builds on an FX graph
(graphopt.SkipLayerNorm, graphopt.MultiHeadAttention, ...) stays a *neutral* node while
rules run; after them each neutral node becomes the torch custom op it runs on
(``torch.ops.graphopt.*``, registered by graphopt.kernels), with view/permute adapters where
the layouts differ, or plain ATen ops where no custom op fits. Each entry says which custom
ops it needs, for which dtypes, and whether it has a gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from graphopt.ops import registry
from graphopt.ops.fx_builder import FLOATS, FxBuilder, arg
from graphopt.ops.torch_canonical import emit_canonical, emit_swish
from graphopt.ops.torch_custom_ops import custom_op_problem, graphopt_op
from graphopt.pattern.native import RewriteDeclined

__all__ = ["GRAPHOPT", "GraphoptLowering", "LoweringFn", "RotaryApply", "rotary_with", "norm_stats"]

aten = torch.ops.aten
prims = torch.ops.prims

#: fn(builder, inputs, attrs, wanted output indices) -> the outputs (only the wanted ones need be built).
LoweringFn = Callable[[FxBuilder, list[Any], dict[str, Any], set[int]], list[Any]]


@dataclass(frozen=True)
class GraphoptLowering:
    op_type: str
    fn: LoweringFn
    #: The custom ops it calls ("graphopt::attention"); empty when it lowers to ATen only.
    custom_ops: tuple[str, ...] = ()
    dtypes: frozenset[str] = FLOATS
    #: Why the ATen ops it emits have no derivative (None: they have one); such a lowering is
    #: left out where gradients flow.
    no_gradient: str | None = None
    #: The same op as ATen ops only (graphopt.ops.torch_aten_forms), for where no custom op
    #: may run (kernels="none": a custom op is a fusion barrier for inductor); None: none.
    aten: LoweringFn | None = None

    def problem(self, training: bool, aten_only: bool = False) -> str | None:
        """Why this lowering cannot be used (None: it can); `aten_only`: its ATen form."""
        if aten_only:
            return None if self.aten is not None else f"graphopt.{self.op_type} has no ATen-only form"
        if training and self.no_gradient:
            return self.no_gradient
        for qualname in self.custom_ops:
            reason = custom_op_problem(qualname, training)
            if reason is not None:
                return reason
        return None


#: graphopt op -> its torch lowering: the registry's table (graphopt.ops.registry), filled by `_lowers`.
GRAPHOPT: Mapping[str, GraphoptLowering] = registry.torch_lowerings()


def _lowers(op_type: str, custom_ops: tuple[str, ...] = (), dtypes: frozenset[str] = FLOATS,
            no_gradient: str | None = None) -> Callable[[LoweringFn], LoweringFn]:
    def register(fn: LoweringFn) -> LoweringFn:
        registry.register_torch_lowering(op_type, GraphoptLowering(op_type, fn, custom_ops, dtypes, no_gradient))
        return fn

    return register


def _scale(attrs: dict[str, Any]) -> float | None:
    scale = attrs.get("scale")
    return None if scale is None else float(scale)


@_lowers("ScaledDotProductAttention", ("graphopt::attention", "graphopt::decode_attention"))
def _sdpa(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    q, k, v, mask = (b.tensor(a) if a is not None else None for a in (*args, None, None, None)[:4])
    causal = bool(int(attrs.get("is_causal", 0)))
    q_val = b.meta(q)
    # One query position over a KV cache (a decode step) replayed as a CUDA graph: the split-K
    # kernel, whose second launch and partial buffers cost nothing there.
    if b.cuda_graphs and not causal and isinstance(q_val, torch.Tensor) and q_val.dim() == 4 and type(q_val.shape[2]) is int and q_val.shape[2] == 1:
        # the rows the mask can show (up to the query, within a sliding window), proven from the graph: read only those
        from graphopt.ops.fx_key_range import key_range

        rows, _ = key_range(b, mask, b.meta(k).shape[2]) if mask is not None else (None, "")
        if rows is None:
            return [b.call(graphopt_op("decode_attention"), q, k, v, mask, _scale(attrs))]
        return [b.call(graphopt_op("decode_attention"), q, k, v, mask, _scale(attrs), rows.key_positions, rows.query_position, rows.window)]
    return [b.call(graphopt_op("attention"), q, k, v, mask, causal, _scale(attrs))]


@_lowers("MultiHeadAttention", ("graphopt::attention",))
def _mha(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """q, k, v [batch, seq, heads * head] -> [batch, heads, seq, head] views, attention, and back."""
    q, k, v, bias = (b.tensor(a) if a is not None else None for a in (*args, None, None, None)[:4])
    heads = int(attrs["num_heads"])

    def split_heads(x: Any) -> Any:
        hidden = b.size(x, 2)
        if not isinstance(hidden, int) or hidden % heads:
            raise RewriteDeclined(f"hidden size {hidden} does not split into {heads} heads")
        x4 = b.call(aten.reshape.default, x, [b.size(x, 0), b.size(x, 1), heads, hidden // heads])
        return b.call(aten.permute.default, x4, [0, 2, 1, 3])

    if bias is not None and b.meta(bias).dtype == torch.bool:
        raise RewriteDeclined("graphopt.MultiHeadAttention takes an additive bias")
    out = b.call(graphopt_op("attention"), split_heads(q), split_heads(k), split_heads(v), bias, False, _scale(attrs))
    merged = b.call(aten.permute.default, out, [0, 2, 1, 3])
    return [b.call(aten.reshape.default, merged, [b.size(q, 0), b.size(q, 1), b.size(v, 2)])]


@_lowers("Attention", ("graphopt::attention",))
def _packed_attention(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.Attention(x [batch, seq, hidden], w [hidden, 3 * hidden], bias [3 * hidden], attention_bias):
    one addmm of the packed weights on the flattened tokens, its thirds (views) as q, k and v,
    then as graphopt.MultiHeadAttention."""
    x, w, bias = (b.tensor(a) for a in args[:3])
    if b.rank(x) != 3 or b.rank(w) != 2 or b.rank(bias) != 1:
        raise RewriteDeclined("graphopt.Attention takes x [batch, seq, hidden], w [hidden, 3 * hidden], bias [3 * hidden]")
    hidden, width = b.size(x, 2), b.size(w, 1)
    if not isinstance(hidden, int) or width != 3 * hidden:
        raise RewriteDeclined(f"packed weights of width {width} are not three projections of hidden size {hidden}")
    tokens = b.call(aten.reshape.default, x, [-1, hidden])
    qkv = b.call(aten.reshape.default, b.call(aten.addmm.default, bias, tokens, w), [b.size(x, 0), b.size(x, 1), width])
    q, k, v = (b.call(aten.slice.Tensor, qkv, 2, i * hidden, (i + 1) * hidden) for i in range(3))
    return _mha(b, [q, k, v, arg(args, 3)], attrs, wanted)


def norm_stats(b: FxBuilder, total: Any, rms: bool) -> tuple[Any, Any]:
    """Mean and 1/std over the last axis with the kept dim ([batch, seq, 1]), as the ONNX ops return them (f32 math)."""
    x = b.call(prims.convert_element_type.default, total, torch.float32)
    mean = b.call(aten.mean.dim, x, [-1], True)
    centred = x if rms else b.call(aten.sub.Tensor, x, mean)
    var = b.call(aten.mean.dim, b.call(aten.mul.Tensor, centred, centred), [-1], True)
    return mean, var


@_lowers("SkipLayerNorm", ("graphopt::layer_norm",))
def _skip_layer_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """(out, mean, inv_std, sum) of LayerNorm(a + skip (+ bias)); graphopt::layer_norm returns out and the sum."""
    a, skip, gamma, beta, bias = (b.tensor(x) if x is not None else None for x in (*args, None, None, None)[:5])
    if bias is not None:
        a = b.call(aten.add.Tensor, a, bias)
    eps = float(attrs.get("epsilon", 1e-5))
    both = b.call(graphopt_op("layer_norm"), a, skip, gamma, beta, eps)
    out, total = b.item(both, 0), b.item(both, 1)
    outputs: list[Any] = [out, None, None, total]
    if wanted & {1, 2}:
        mean, var = norm_stats(b, total, rms=False)
        outputs[1] = mean
        outputs[2] = b.call(aten.rsqrt.default, b.call(aten.add.Tensor, var, eps))
    return outputs


@_lowers("RMSNorm", ("graphopt::rms_norm",))
def _rms_norm_op(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    x, weight = b.tensor(args[0]), b.tensor(args[1])
    axis = int(attrs.get("axis", -1))
    if axis not in (-1, b.rank(x) - 1):
        raise RewriteDeclined(f"graphopt::rms_norm normalizes the last axis, not {axis}")
    both = b.call(graphopt_op("rms_norm"), x, None, weight, float(attrs.get("epsilon", 1e-5)))
    return [b.item(both, 0)]


@_lowers("SkipRMSNorm", ("graphopt::rms_norm",))
def _skip_rms_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    a, skip, gamma = (b.tensor(x) for x in args[:3])
    eps = float(attrs.get("epsilon", 1e-5))
    both = b.call(graphopt_op("rms_norm"), a, skip, gamma, eps)
    out, total = b.item(both, 0), b.item(both, 1)
    outputs: list[Any] = [out, None, None, total]
    if wanted & {1, 2}:
        mean, var = norm_stats(b, total, rms=True)
        outputs[1] = mean
        outputs[2] = b.call(aten.rsqrt.default, b.call(aten.add.Tensor, var, eps))
    return outputs


@_lowers("Gelu", dtypes=FLOATS | {"f64"})
def _gelu_op(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [b.call(aten.gelu.default, b.tensor(args[0]))]


@_lowers("BiasGelu", dtypes=FLOATS | {"f64"})
def _bias_gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [b.call(aten.gelu.default, b.call(aten.add.Tensor, b.tensor(args[0]), b.tensor(args[1])))]


@_lowers("FastGelu", dtypes=FLOATS | {"f64"})
def _fast_gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    x = b.tensor(args[0])
    if arg(args, 1) is not None:
        x = b.call(aten.add.Tensor, x, b.tensor(args[1]))
    return [b.call(aten.gelu.default, x, approximate="tanh")]


@_lowers("QuickGelu", dtypes=FLOATS | {"f64"})
def _quick_gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [emit_swish(b, [args[0]], {"alpha": float(attrs.get("alpha", 1.702))}, 1)]


@_lowers("SwiGLU", ("graphopt::swiglu",))
def _swiglu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [b.call(graphopt_op("swiglu"), b.tensor(args[0]), b.tensor(args[1]))]


@_lowers("GatedGelu", ("graphopt::geglu",))
def _gated_gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [b.call(graphopt_op("geglu"), b.tensor(args[0]), b.tensor(args[1]), str(attrs.get("approximate", "none")) == "tanh")]


@_lowers("GeGLU", ("graphopt::geglu",))
def _geglu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.GeGLU(x, bias): (x + bias) halved on the last axis into (a, g) -> a * gelu(g)."""
    x = b.call(aten.add.Tensor, b.tensor(args[0]), b.tensor(args[1]))
    width = b.size(x, -1)
    if not isinstance(width, int) or width % 2:
        raise RewriteDeclined(f"the last dim {width} does not halve")
    half = width // 2
    up = b.call(aten.slice.Tensor, x, -1, 0, half)
    gate = b.call(aten.slice.Tensor, x, -1, half, width)
    return [b.call(graphopt_op("geglu"), gate, up, False)]


#: apply(builder, x [batch, heads, seq, head], cos, sin [batch or 1, seq, rotary], interleaved) -> the rotated x.
RotaryApply = Callable[[FxBuilder, Any, Any, Any, bool], Any]


def rotary_with(b: FxBuilder, args: list[Any], attrs: dict[str, Any], apply: RotaryApply) -> list[Any]:
    """graphopt.RotaryEmbedding(x, position_ids or offset, cos_cache, sin_cache), caches
    [positions, rotary / 2] as onnxruntime takes them -> `apply` on the HF form cos, sin
    [batch or 1, seq, rotary] (the half-width rows picked, then repeated)."""
    x, positions, cos_cache, sin_cache = (b.tensor(a) for a in args[:4])
    interleaved = bool(int(attrs.get("interleaved", 0)))
    if b.rank(x) not in (3, 4) or attrs.get("num_heads") or attrs.get("rotary_embedding_dim"):
        raise RewriteDeclined("graphopt::rotary takes x [batch, heads, seq, head] or [batch, seq, hidden] with the whole rotary dim in the caches")
    hidden_form = b.rank(x) == 3
    if hidden_form:  # [batch, seq, heads * head] as onnxruntime takes it: heads of the caches' width, moved to [batch, heads, seq, head]
        head, hidden = 2 * b.size(cos_cache, -1), b.size(x, 2)
        if not isinstance(head, int) or not isinstance(hidden, int) or hidden % head:
            raise RewriteDeclined(f"hidden size {hidden} is no multiple of the rotary head size {head}")
        batch, length = b.size(x, 0), b.size(x, 1)
        x = b.call(aten.permute.default, b.call(aten.reshape.default, x, [batch, length, hidden // head, head]), [0, 2, 1, 3])
    seq = b.size(x, 2)
    single = b.meta(positions).numel() == 1

    def hf_form(cache: Any) -> Any:
        if single:  # positions offset, offset + 1, ... (the offset is a constant; 0 while only shapes are asked)
            offsets = b.const_array(positions)
            offset = int(offsets.reshape(-1)[0]) if offsets is not None else 0
            if offset and not isinstance(seq, int):
                raise RewriteDeclined("a rotary offset with a symbolic sequence length")
            rows = b.call(aten.unsqueeze.default, b.call(aten.slice.Tensor, cache, 0, offset, offset + seq if offset else seq), 0)
        else:  # position ids [batch, seq]
            rows = b.call(aten.embedding.default, cache, positions)
        if interleaved:
            return b.call(aten.repeat_interleave.self_int, rows, 2, -1)
        return b.call(aten.cat.default, [rows, rows], -1)

    out = apply(b, x, hf_form(cos_cache), hf_form(sin_cache), interleaved)
    if hidden_form:
        out = b.call(aten.reshape.default, b.call(aten.permute.default, out, [0, 2, 1, 3]), [batch, length, hidden])
    return [out]


@_lowers("RotaryEmbedding", ("graphopt::rotary",))
def _rotary(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt::rotary on the HF form of the caches (`rotary_with`)."""
    return rotary_with(b, args, attrs, lambda b, x, cos, sin, interleaved: b.call(graphopt_op("rotary"), x, cos, sin, interleaved))


@_lowers("GemmActivation", dtypes=FLOATS | {"f64"}, no_gradient="aten._addmm_activation has no derivative formula")
def _gemm_activation(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.GemmActivation(a, b, bias) {activation = Relu | GeluTanh, transB} -> aten._addmm_activation
    (cuBLASLt's bias + activation epilogue on CUDA; addmm then ReLU in place on the CPU)."""
    activation = attrs.get("activation")
    activation = activation.decode() if isinstance(activation, bytes) else activation
    if activation not in ("Relu", "GeluTanh"):
        raise RewriteDeclined(f"aten._addmm_activation applies Relu or GeluTanh, not {activation}")
    a, m, c = (b.tensor(x) for x in args[:3])
    if int(attrs.get("transB", 0)):  # b given as [N, K], as onnxruntime's FusedGemm takes it
        m = b.call(aten.permute.default, m, [1, 0])
    if b.autotune and custom_op_problem("graphopt::tuned_linear_act") is None:
        # inductor will autotune: graphopt::linear_act only where it beats inductor's own compiled code for the
        # site, timed now, as the rewrite is planned (graphopt.inductor_sites). Where it does not, the rewrite
        # is declined and the site's ATen ops stay as they were: inductor lowers them as it would without graphopt.
        kind = "relu" if activation == "Relu" else "gelu_tanh"
        if b.evaluate:
            from graphopt import inductor_sites

            verdict = inductor_sites.decide_linear_act(b.site, b.meta(a), b.meta(m), b.meta(c), kind)
            if verdict is not None:
                raise RewriteDeclined(verdict)
        return [b.call(graphopt_op("tuned_linear_act"), a, m, c, kind)]
    if activation == "GeluTanh" and b.meta(a).device.type != "cuda":
        # The CPU kernel of aten._addmm_activation applies the erf GELU (CUDA's, the tanh one).
        raise RewriteDeclined("aten._addmm_activation applies the tanh GELU on CUDA tensors only")
    if b.inductor and b.meta(a).device.type != "cuda":
        # On the CPU it is addmm then ReLU in place, no fused kernel: a call inductor cannot fuse
        # into, where it would fuse the ReLU with its neighbours (OPT on CPU 1.03x inductor).
        raise RewriteDeclined("aten._addmm_activation on the CPU is addmm then ReLU, nothing fused: inductor fuses the ReLU itself")
    return [b.call(aten._addmm_activation.default, c, a, m, use_gelu=activation == "GeluTanh")]


_FLOAT_MAX = float(torch.finfo(torch.float32).max)  # an unbounded side of FusedConv's Clip


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _conv_relu_problem(b: FxBuilder, x: Any, w: Any, attrs: dict[str, Any]) -> str | None:
    """Why graphopt::conv_relu (cuDNN's fused kernel) does not take this FusedConv (None: it does)."""
    if _text(attrs.get("activation")) != "Relu":
        return f"graphopt::conv_relu fuses ReLU only, not {attrs.get('activation')}"
    if b.meta(x).device.type != "cuda":  # elsewhere there is no fused kernel to gain
        return "graphopt::conv_relu runs cuDNN's fused kernel, on CUDA tensors only"
    if b.rank(w) != 4:
        return "graphopt::conv_relu takes 2-D convolutions"
    if _text(attrs.get("auto_pad", "NOTSET")) != "NOTSET":
        return "graphopt::conv_relu takes explicit pads only"
    pads = [int(p) for p in attrs.get("pads", [0] * 4)]
    if pads[:2] != pads[2:]:
        return f"graphopt::conv_relu pads both sides equally, not {pads}"
    return None


def _activation(b: FxBuilder, y: Any, kind: Any, params: list[float]) -> Any:
    """FusedConv's `activation` with its `activation_params` (onnxruntime's meaning) as ATen ops."""
    if kind in (None, ""):
        return y
    if kind in ("Relu", "Tanh", "Sigmoid"):
        return b.call({"Relu": aten.relu, "Tanh": aten.tanh, "Sigmoid": aten.sigmoid}[kind].default, y)
    if kind == "LeakyRelu":
        return b.call(aten.leaky_relu.default, y, params[0] if params else 0.01)
    if kind == "HardSigmoid":  # clamp(alpha * y + beta, 0, 1)
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        return b.call(aten.clamp.default, b.call(aten.add.Tensor, b.call(aten.mul.Tensor, y, alpha), beta), 0.0, 1.0)
    if kind == "Clip":
        lo, hi = (params + [-_FLOAT_MAX, _FLOAT_MAX][len(params):])[:2]
        return b.call(aten.clamp.default, y, None if lo <= -_FLOAT_MAX else lo, None if hi >= _FLOAT_MAX else hi)
    raise RewriteDeclined(f"graphopt.FusedConv on torch applies Relu, Tanh, Sigmoid, LeakyRelu, HardSigmoid or Clip, not {kind}")


@_lowers("FusedConv", ("graphopt::conv_relu",))
def _fused_conv(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.FusedConv(x, w, b, z) {activation, activation_params} -> activation(conv(x, w, b) + z).

    2-D with ReLU on CUDA: graphopt::conv_relu, cuDNN's fused conv-bias-(add-)ReLU. Anywhere
    else (other devices, activations, 1-D/3-D, asymmetric pads) no fused torch kernel exists:
    the convolution, the add and the activation as the ATen ops they were."""
    x, w = b.tensor(args[0]), b.tensor(args[1])
    bias = b.tensor(arg(args, 2), like=x) if arg(args, 2) is not None else None
    z = b.tensor(arg(args, 3), like=x) if arg(args, 3) is not None else None
    if _conv_relu_problem(b, x, w, attrs) is None:
        pads = [int(p) for p in attrs.get("pads", [0] * 4)]
        strides = [int(v) for v in attrs.get("strides", [1, 1])]
        dilations = [int(v) for v in attrs.get("dilations", [1, 1])]
        return [b.call(graphopt_op("conv_relu"), x, w, bias, z, strides, pads[:2], dilations, int(attrs.get("group", 1)))]
    conv_attrs = {k: v for k, v in attrs.items() if not k.startswith("activation")}
    y = emit_canonical(b, "Conv", [x, w, bias], conv_attrs, 1)
    if z is not None:
        y = b.call(aten.add.Tensor, y, z)
    params = [float(p) for p in attrs.get("activation_params") or []]
    return [_activation(b, y, _text(attrs.get("activation")), params)]



@_lowers("GroupNorm", dtypes=FLOATS | {"f64"})
def _group_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.GroupNorm(x [N, C, ...], gamma [C], beta [C]) {groups, epsilon, activation} ->
    aten.native_group_norm (+ aten.silu for activation = 1): no torch kernel beats the one
    ATen has (inductor fuses it with its neighbours itself), so the fusion keeps its meaning."""
    if int(attrs.get("channels_last", 0)):
        raise RewriteDeclined("graphopt.GroupNorm on torch takes channels-first [N, C, ...] tensors")
    x = b.tensor(args[0])
    dtype = b.meta(x).dtype
    gamma, beta = (b.tensor(p, like=x) for p in args[1:3])
    # com.microsoft.GroupNorm reads gamma and beta as float32: aten's kernel takes them in x's dtype
    gamma, beta = (p if b.meta(p).dtype == dtype else b.call(prims.convert_element_type.default, p, dtype) for p in (gamma, beta))
    spatial = [b.size(x, i) for i in range(2, b.rank(x))]
    if b.rank(x) < 3 or not all(isinstance(d, int) for d in spatial):
        raise RewriteDeclined("graphopt.GroupNorm on torch takes [N, C, spatial...] with static spatial dims")
    hw = 1
    for d in spatial:
        hw *= d
    both = b.call(aten.native_group_norm.default, x, gamma, beta, b.size(x, 0), b.size(x, 1), hw,
                  int(attrs["groups"]), float(attrs.get("epsilon", 1e-5)))
    out = b.item(both, 0)
    activation = int(attrs.get("activation", 0))
    if activation not in (0, 1):
        raise RewriteDeclined(f"graphopt.GroupNorm's activation {activation} is none (0) or SiLU (1)")
    return [b.call(aten.silu.default, out) if activation else out]


def _rotate_positions(b: FxBuilder, x: Any, cos_cache: Any, sin_cache: Any, start: Any, seq: Any, interleaved: bool) -> Any:
    """x [batch, heads, seq, head] rotated at positions start .. start + seq - 1 of the caches
    [rows, head / 2], as onnxruntime's do_rotary does, in ATen ops (inductor fuses them)."""
    cos = b.call(aten.narrow.default, b.tensor(cos_cache, like=x), 0, start, seq)  # start, seq: sym_size nodes where dynamic
    sin = b.call(aten.narrow.default, b.tensor(sin_cache, like=x), 0, start, seq)
    if interleaved:  # pairs (x0, x1), (x2, x3), ...: rotated as (x0 c - x1 s, x1 c + x0 s)
        cos, sin = (b.call(aten.repeat_interleave.self_int, c, 2, -1) for c in (cos, sin))
        pairs = b.call(aten.unflatten.int, x, -1, [-1, 2])
        even, odd = (b.call(aten.select.int, pairs, -1, i) for i in (0, 1))
        rotated = b.call(aten.flatten.using_ints, b.call(aten.stack.default, [b.call(aten.neg.default, odd), even], -1), -2)
    else:  # halves: (x1 c - x2 s, x2 c + x1 s)
        cos, sin = (b.call(aten.cat.default, [c, c], -1) for c in (cos, sin))
        half = b.size(x, 3) // 2
        lo, hi = b.call(aten.slice.Tensor, x, 3, 0, half), b.call(aten.slice.Tensor, x, 3, half, 2 * half)
        rotated = b.call(aten.cat.default, [b.call(aten.neg.default, hi), lo], -1)
    return b.call(aten.add.Tensor, b.call(aten.mul.Tensor, x, cos), b.call(aten.mul.Tensor, rotated, sin))


@_lowers("GroupQueryAttention")
def _group_query_attention(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.GroupQueryAttention(q [B, S, N * H], k, v [B, S, KV * H], past k, v [B, KV, P, H], ...)
    -> (out [B, S, N * H], present k, v [B, KV, P + S, H]) in ATen ops: the presents are the
    concatenations, the attention is aten.scaled_dot_product_attention with enable_gqa (query head i
    reads kv head i // (N / KV)) under the causal mask aligned to the end (key t is visible to
    query s where t <= P + s), the attention_bias added where it is visible. seqlens_k,
    total_sequence_length and query_seqlens say what the shapes say (the rule writes them so)
    and are not read. No custom op: inductor fuses around it in every kernel policy."""
    q3, k3, v3, past_k, past_v = (b.tensor(a) for a in args[:5])
    cos_cache, sin_cache, position_ids, bias = (arg(args, i) for i in (7, 8, 9, 10))
    if any(arg(args, i) is not None for i in range(11, 16)):
        raise RewriteDeclined("graphopt.GroupQueryAttention on torch takes no head_sink, k / v scales or q / k norms")
    window = int(attrs.get("local_window_size", -1))
    if position_ids is not None or int(attrs.get("causal", 1)) != 1 or window == 0 or window < -1:
        raise RewriteDeclined("graphopt.GroupQueryAttention on torch is causal (over a local window or the whole cache), positions from the past length")
    heads, kv_heads = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    if b.rank(q3) != 3 or b.rank(past_k) != 4 or not isinstance(head := b.size(past_k, 3), int):
        raise RewriteDeclined("graphopt.GroupQueryAttention on torch takes q [batch, seq, heads * head] and past k [batch, kv_heads, past, head]")
    batch, seq, past = b.size(q3, 0), b.size(q3, 1), b.size(past_k, 2)

    def split_heads(x: Any, n: int) -> Any:
        return b.call(aten.permute.default, b.call(aten.reshape.default, x, [batch, seq, n, head]), [0, 2, 1, 3])

    q, k, v = split_heads(q3, heads), split_heads(b.tensor(k3), kv_heads), split_heads(b.tensor(v3), kv_heads)
    if int(attrs.get("do_rotary", 0)):
        width = None if cos_cache is None or sin_cache is None else b.size(cos_cache, 1)
        if not isinstance(width, int) or not 0 < 2 * width <= head:
            raise RewriteDeclined("graphopt.GroupQueryAttention on torch rotates the head's first dims with cos / sin caches [rows, <= head / 2]")
        interleaved = bool(int(attrs.get("rotary_interleaved", 0)))

        def rotate(x: Any) -> Any:  # the first 2 * width dims of each head (a partial rotary passes the rest through)
            if 2 * width == head:
                return _rotate_positions(b, x, cos_cache, sin_cache, past, seq, interleaved)
            part = _rotate_positions(b, b.call(aten.slice.Tensor, x, 3, 0, 2 * width), cos_cache, sin_cache, past, seq, interleaved)
            return b.call(aten.cat.default, [part, b.call(aten.slice.Tensor, x, 3, 2 * width, head)], -1)

        q, k = rotate(q), rotate(k)
    present_k = b.call(aten.cat.default, [past_k, k], 2)
    present_v = b.call(aten.cat.default, [past_v, v], 2)
    total = b.size(present_k, 2)
    device = b.meta(q3).device
    kv_pos = b.call(aten.arange.default, total, dtype=torch.int64, device=device)
    q_pos = b.call(aten.arange.start, past, total, dtype=torch.int64, device=device)
    kv_row, q_col = b.call(aten.unsqueeze.default, kv_pos, 0), b.call(aten.unsqueeze.default, q_pos, 1)
    keep = b.call(aten.le.Tensor, kv_row, q_col)
    if window > 0:  # the last `window` keys up to the query's own (onnxruntime's local_window_size)
        keep = b.call(aten.logical_and.default, keep, b.call(aten.gt.Tensor, kv_row, b.call(aten.sub.Tensor, q_col, window)))
    mask = keep
    if bias is not None:  # added where visible; elsewhere the lowest float, as the models write their masks
        fill = float(torch.finfo(b.meta(q3).dtype).min)
        mask = b.call(aten.where.ScalarOther, keep, b.tensor(bias, like=q3), fill)
    out = b.call(aten.scaled_dot_product_attention.default, q, present_k, present_v, mask, 0.0, False,
                 scale=_scale(attrs), enable_gqa=heads != kv_heads)
    merged = b.call(aten.reshape.default, b.call(aten.permute.default, out, [0, 2, 1, 3]), [batch, seq, heads * head])
    return [merged, present_k, present_v]
