"""graphopt's own fused ops (domain `graphopt`): one declaration each.

A rule emits these neutral ops; each target then runs them its own way (`lowerings`:
onnxruntime's com.microsoft contrib kernels on ort-cpu / ort-cuda, standard ops of recent
opsets on `onnx`; graphopt/ops/torch_lowering.py registers the torch lowering of each).
Attribute defaults are the target kernel's defaults (tests/test_op_registry.py checks
them against onnxruntime's and onnx's schemas); where a target's op has another default,
the lowering names the attribute in `Lowering.explicit` and writes it.

To add a fused op: declare it here (inputs, outputs, attributes, `infer`, lowerings),
emit it from a rule, and register its torch lowering if it has one; docs/design.md
("The op registry") walks through it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from graphopt.ops.opspec import (
    MS_DOMAIN,
    Attribute,
    Contract,
    InferContext,
    Input,
    Lowering,
    OpSpec,
    Output,
    facts,
    is_given,
    known_shape,
    unproven,
)
from graphopt.pattern.ir import MISSING

__all__ = ["FUSED_OPS", "FUSED_CONV_ACTIVATIONS"]

#: The activations graphopt.FusedConv carries: those onnxruntime's CPU kernel maps
#: (contrib_ops/cpu/fused_activation.cc; 1.31 refuses Silu in the NCHWc kernel).
FUSED_CONV_ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")


def _ort(low: Lowering) -> dict[str, Lowering]:
    """The same lowering on both onnxruntime targets."""
    return {"ort-cpu": low, "ort-cuda": low}


# --------------------------------------------------------------------------- contracts


def _activation_in(*allowed: str | None) -> Contract:
    """FusedConv's `activation` must be one the provider's kernel maps (None: attribute absent)."""

    def check(attrs: Mapping[str, Any], shapes: Sequence[Any]) -> str | None:
        activation = attrs.get("activation")
        if isinstance(activation, bytes):
            activation = activation.decode()
        if activation not in allowed:
            names = ", ".join(a for a in allowed if a)
            return f"the kernel's activations are {names}, not {activation}"
        return None

    return check


def _cuda_group_norm(attrs: Mapping[str, Any], shapes: Sequence[Any]) -> str | None:
    """group_norm.cc / group_norm_impl.cu: 4-D input, C divisible by groups, and the
    channels per group even (2 per thread) and at most 512 (one block), else NOT_IMPLEMENTED."""
    x_shape = known_shape(shapes, 0)
    if x_shape is None:
        return unproven("X", "the 4-D input the CUDA GroupNorm kernel takes")
    if len(x_shape) != 4:
        return f"the CUDA GroupNorm kernel takes 4-D input, not rank {len(x_shape)}"
    gamma = known_shape(shapes, 1)
    if gamma is None or len(gamma) != 1 or not isinstance(gamma[0], int):
        return unproven("gamma", "the channel count the CUDA GroupNorm kernel splits into groups")
    groups = attrs.get("groups")
    if not groups:
        return "the group count is unknown"
    channels, groups = gamma[0], int(groups)
    if channels % groups:
        return f"{channels} channels do not split into {groups} groups"
    per_group = channels // groups
    if per_group % 2 or per_group > 512:
        return f"the CUDA GroupNorm kernel needs an even number of channels per group, at most 512 (got {per_group})"
    return None


_BIAS_SPLIT_GELU_WIDTHS = (2560, 5120, 10240)


def _cuda_bias_split_gelu(attrs: Mapping[str, Any], shapes: Sequence[Any]) -> str | None:
    """contrib_ops/cuda/diffusion/bias_split_gelu.cc: X is 3-D with a last dim of 2560,
    5120 or 10240 (the kernel is instantiated for those half widths only), bias is [D]."""
    x_shape = known_shape(shapes, 0)
    if x_shape is None or (len(x_shape) == 3 and not isinstance(x_shape[-1], int)):
        return unproven("X", f"the 3-D input of a hidden size in {_BIAS_SPLIT_GELU_WIDTHS} the CUDA BiasSplitGelu kernel takes")
    if len(x_shape) != 3:
        return f"the CUDA BiasSplitGelu kernel takes 3-D input, not rank {len(x_shape)}"
    if x_shape[-1] not in _BIAS_SPLIT_GELU_WIDTHS:
        return f"the CUDA BiasSplitGelu kernel runs hidden sizes 2560, 5120 and 10240 only, not {x_shape[-1]}"
    bias = known_shape(shapes, 1)
    if bias is None:
        return unproven("bias", f"the bias [{x_shape[-1]}] the CUDA BiasSplitGelu kernel takes")
    if list(bias) != [x_shape[-1]]:
        return f"the CUDA BiasSplitGelu kernel takes a bias of [{x_shape[-1]}], not {list(bias)}"
    return None


def _gqa_head(shapes: Sequence[Any]) -> int | str:
    """The head size (past_key [batch, kv_heads, past, head]), or why it is not known."""
    past = known_shape(shapes, 3)
    head = past[3] if past is not None and len(past) == 4 else None
    return head if isinstance(head, int) else unproven("past_key", "the head size GroupQueryAttention rotates (do_rotary)")


def _gqa_rotary_problem(attrs: Mapping[str, Any], shapes: Sequence[Any]) -> str | None:
    """contrib_ops/cpu/bert/group_query_attention_helper.h (both providers): with do_rotary "cos_cache
    dimension 1 must be <= head_size / 2 and a multiple of 8" (a partial rotary rotates its first twice as many dims)."""
    if attrs.get("do_rotary") != 1:
        return None
    head = _gqa_head(shapes)
    if isinstance(head, str):
        return head
    widths = []
    for index, name in ((7, "cos_cache"), (8, "sin_cache")):
        cache = known_shape(shapes, index)
        if cache is None or len(cache) != 2 or not isinstance(cache[1], int):
            return unproven(name, f"a rotary cache width <= head / 2 ({head // 2}) and a multiple of 8 (do_rotary)")
        widths.append(cache[1])
    if widths[0] != widths[1]:
        return f"GroupQueryAttention rotates with cos and sin caches of one width, not {widths[0]} and {widths[1]}"
    width = widths[0]
    if width % 8 or 2 * width > head:
        return f"GroupQueryAttention rotates (do_rotary) with caches of a width <= head / 2 ({head // 2}) and a multiple of 8, not {width}"
    return None


def _cpu_gqa(attrs: Mapping[str, Any], shapes: Sequence[Any]) -> str | None:
    """contrib_ops/cpu/bert/group_query_attention.cc: do_rotary needs "head_size shall be a multiple
    of 16"; "batch_size must be 1 when sequence_length > 1 and past context is given" (a run-time
    error) unless query_seqlens is given (FuseGroupQueryAttention gives it on ort-cpu): without it,
    only shapes that prove batch 1, one new token or no past pass."""
    if attrs.get("do_rotary") == 1:
        head = _gqa_head(shapes)
        if isinstance(head, str):
            return head
        if head % 16:
            return f"the CPU GroupQueryAttention kernel rotates (do_rotary) heads of a multiple of 16 only, not {head}"
    if (rotary := _gqa_rotary_problem(attrs, shapes)) is not None:
        return rotary
    if is_given(shapes, 16):
        return None  # query_seqlens given: batched chunks run (causal = 1)
    query, past = known_shape(shapes, 0), known_shape(shapes, 3)
    query_dims = query[:2] if query is not None and len(query) == 3 else (None, None)
    past_len = past[2] if past is not None and len(past) == 4 else None
    batch, seq = query_dims
    if batch == 1 or seq == 1 or past_len == 0:
        return None
    if isinstance(batch, int) and isinstance(seq, int) and isinstance(past_len, int):
        return f"the CPU GroupQueryAttention kernel takes several new tokens over a past only at batch 1 (batch {batch}, {seq} tokens, past {past_len})"
    return unproven("past_key" if isinstance(batch, int) and isinstance(seq, int) else "query",
                    "batch 1, one new token or no past (without query_seqlens the CPU GroupQueryAttention kernel "
                    "takes several new tokens over a past only at batch 1)")


# Measured (benchmarks/llm_onnx_decode.py --profile): the host rebuilds the cuDNN attention plan
# whenever the total sequence length changes, i.e. every step of a cache grown by Concat.
GROWING_KV_CACHE_ON_CUDA = (
    "onnxruntime's CUDA attention over a KV cache that grows each call (Concat of past and new) rebuilds "
    "its plan every step: 40.6 ms/step against 2.28 unfused for a 4-layer decoder on an H100 "
    "(benchmarks/results/llm_onnx_decode-2026-11-27-h100-diag.json); left unfused until graphopt "
    "writes a fixed-size KV buffer"
)


# Set by graphopt.api.optimize for its run: OptimizeOptions.kv_buffer == "shared" (the caller binds one
# max-length buffer as past and present, graphopt.passes.kv_buffer): the total length no longer
# changes the buffers' shapes, which is what made the growing cache slow on CUDA (the builder's
# GroupQueryAttention models run that way).
SHARED_KV_BUFFER: ContextVar[bool] = ContextVar("graphopt_shared_kv_buffer", default=False)


@contextmanager
def shared_kv_buffer(shared: bool = True) -> Iterator[None]:
    """SHARED_KV_BUFFER set to `shared` for the block (an optimize run, a contract check)."""
    token = SHARED_KV_BUFFER.set(shared)
    try:
        yield
    finally:
        SHARED_KV_BUFFER.reset(token)


def _cuda_mha(attrs: Mapping[str, Any], shapes: Sequence[Any]) -> str | None:
    """k, v read a KV cache that grows each call (kv_cache = 1, set by FuseAttention): slower
    fused than unfused on onnxruntime's CUDA provider (GROWING_KV_CACHE_ON_CUDA)."""
    # With a shared buffer asked for, the MultiHeadAttention is the step before GroupQueryAttention
    # (FuseGroupQueryAttention); a float32 model has no CUDA GroupQueryAttention and keeps it over
    # the growing cache (slow: use float16 there).
    return GROWING_KV_CACHE_ON_CUDA if attrs.get("kv_cache") == 1 and not SHARED_KV_BUFFER.get() else None


def _cuda_gqa(attrs: Mapping[str, Any], shapes: Sequence[Any]) -> str | None:
    """contrib_ops/cuda/bert/group_query_attention.cc: attention_bias is refused at run time
    ("not supported in GroupQueryAttention cuda kernel"; onnxruntime builds that take it run it
    unfused), and query_seqlens (input 16) is newer than the onnxruntime-gpu builds in use.
    (`shapes` ends at the last input given: trailing omitted inputs are left out.) The rest is
    refused too: GroupQueryAttention attends over past + new, a cache that grows each call by
    construction (present = Concat(past, new)), slower fused (GROWING_KV_CACHE_ON_CUDA)."""
    if is_given(shapes, 10):  # given, whatever its shape
        return "the CUDA GroupQueryAttention kernel takes no attention_bias (a mask that pads)"
    if is_given(shapes, 16):
        return "the CUDA GroupQueryAttention kernels in use take no query_seqlens"
    if (rotary := _gqa_rotary_problem(attrs, shapes)) is not None:
        return rotary
    return None if SHARED_KV_BUFFER.get() else GROWING_KV_CACHE_ON_CUDA


# --------------------------------------------------------------------------- shape inference


def _like_first(ctx: InferContext) -> list[list[Any] | None]:
    """Every output has the first input's shape."""
    return [ctx.shape(0) for _ in ctx.op.outputs]


def _skip_norm(ctx: InferContext) -> list[list[Any] | None]:
    """output and the input + skip (+ bias) sum: the input's shape; mean and inv_std: [..., 1]."""
    x = ctx.shape(0)
    stats = None if x is None else [*x[:-1], 1]
    return [x, stats, stats, x]


def _mha(ctx: InferContext) -> list[list[Any] | None]:
    """[batch, seq] of the query, the value's hidden size."""
    q, v = ctx.shape(0), ctx.shape(2)
    return [None if q is None or v is None or len(q) != 3 or len(v) != 3 else [q[0], q[1], v[2]]]


def _gqa(ctx: InferContext) -> list[list[Any] | None]:
    """output [batch, seq, num_heads * head_size] (head_size from past_key); present_key and
    present_value [batch, kv_heads, past + seq, head_size] (separate past and present buffers)."""
    q, past = ctx.shape(0), ctx.shape(3)
    heads = ctx.attr("num_heads")
    if q is None or past is None or len(q) != 3 or len(past) != 4 or not isinstance(heads, int):
        return [None, None, None]
    total = None if q[1] is None or past[2] is None else past[2] + q[1]
    present = [past[0], past[1], total, past[3]]
    head = past[3]
    return [[q[0], q[1], None if head is None else heads * head], present, list(present)]


def _packed_attention(ctx: InferContext) -> list[list[Any] | None]:
    """[batch, seq] of the input, a third of the packed weights' width."""
    x, w = ctx.shape(0), ctx.shape(1)
    if x is None or w is None or len(x) != 3 or len(w) != 2 or not isinstance(w[1], int) or w[1] % 3:
        return [None]
    return [[x[0], x[1], w[1] // 3]]


def _sdpa(ctx: InferContext) -> list[list[Any] | None]:
    q, v = ctx.shape(0), ctx.shape(2)
    return [None if q is None or v is None or len(q) < 2 else [*q[:-1], v[-1]]]


def _halved(ctx: InferContext) -> list[list[Any] | None]:
    """GeGLU: (x + bias) halved on the last axis."""
    x = ctx.shape(0)
    if x is None or not x or not isinstance(x[-1], int) or x[-1] % 2:
        return [None]
    return [[*x[:-1], x[-1] // 2]]


def _gemm(ctx: InferContext) -> list[list[Any] | None]:
    """[M, N] of A [M, K] and B [K, N] (B [N, K] with transB)."""
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return [None]
    return [[a[0], b[0] if ctx.attr("transB") in (1, True) else b[1]]]


def _conv(ctx: InferContext) -> list[list[Any] | None]:
    """Conv's output shape, for explicit pads (auto_pad NOTSET) and static spatial dims."""
    x, w = ctx.shape(0), ctx.shape(1)
    if x is None or w is None or len(x) != len(w) or len(x) < 3 or ctx.attr("auto_pad") not in ("NOTSET", b"NOTSET"):
        return [None]
    spatial = len(x) - 2
    kernel = list(ctx.attr("kernel_shape") or w[2:])
    strides = list(ctx.attr("strides") or [1] * spatial)
    dilations = list(ctx.attr("dilations") or [1] * spatial)
    pads = list(ctx.attr("pads") or [0] * (2 * spatial))
    dims: list[Any] = [x[0], w[0]]
    for i in range(spatial):
        size, k = x[2 + i], kernel[i]
        if not isinstance(size, int) or not isinstance(k, int):
            dims.append(None)
            continue
        dims.append((size + pads[i] + pads[i + spatial] - dilations[i] * (k - 1) - 1) // strides[i] + 1)
    return [dims]


# --------------------------------------------------------------------------- the ops

_X = (Input("X"),)
_Y = (Output("Y"),)
_NORM_OUTPUTS = (Output("output"), Output("mean", True, "f32"), Output("inv_std_var", True, "f32"), Output("input_skip_bias_sum", True))

FUSED_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        "graphopt", "MultiHeadAttention",
        "softmax(q k^T * scale + attention_bias) v on q, k, v [batch, seq, heads * head_size]",
        inputs=(Input("query"), Input("key"), Input("value"), Input("attention_bias", optional=True)),
        outputs=(Output("output"),),
        # kv_cache = 1: k and v read a KV cache that grows each call (Concat of a graph input and
        # the new tokens on the sequence axis; FuseAttention sets it). No target op has it: the
        # lowerings drop it, the ort-cuda contract reads it.
        attributes=(Attribute("num_heads", "INT"), Attribute("scale", "FLOAT"), Attribute("kv_cache", "INT", 0)),
        infer=_mha,
        lowerings={
            # com.microsoft.MultiHeadAttention(query, key, value, bias, key_padding_mask, attention_bias)
            "ort-cpu": Lowering(MS_DOMAIN, "MultiHeadAttention", inputs=(0, 1, 2, None, None, 3), rename={"kv_cache": ()}),
            "ort-cuda": Lowering(MS_DOMAIN, "MultiHeadAttention", inputs=(0, 1, 2, None, None, 3), rename={"kv_cache": ()},
                                 contract=_cuda_mha),
            # opset 23 Attention, 3-D form: the head counts are attributes.
            "onnx": Lowering("", "Attention", rename={"num_heads": ("q_num_heads", "kv_num_heads"), "kv_cache": ()}),
        },
    ),
    OpSpec(
        "graphopt", "Attention",
        "MultiHeadAttention of x [batch, seq, hidden] with packed q|k|v weights [hidden, 3 * hidden] and bias",
        inputs=(Input("input"), Input("weights"), Input("bias"), Input("attention_bias", optional=True)),
        outputs=(Output("output"),),
        attributes=(Attribute("num_heads", "INT"), Attribute("scale", "FLOAT")),
        infer=_packed_attention,
        # com.microsoft.Attention(input, weights, bias, mask_index, past, attention_bias)
        lowerings=_ort(Lowering(MS_DOMAIN, "Attention", inputs=(0, 1, 2, None, None, 3))),
    ),
    OpSpec(
        "graphopt", "GroupQueryAttention",
        "attention of q [batch, seq, heads * head] over past + new k, v ([batch, seq, kv_heads * head] new, "
        "[batch, kv_heads, past, head] past), query heads grouped over the kv heads; present = past + new",
        inputs=(Input("query"), Input("key"), Input("value"), Input("past_key"), Input("past_value"), Input("seqlens_k"),
                Input("total_sequence_length"), Input("cos_cache", optional=True), Input("sin_cache", optional=True),
                Input("position_ids", optional=True), Input("attention_bias", optional=True), Input("head_sink", optional=True),
                Input("k_scale", optional=True), Input("v_scale", optional=True), Input("q_norm_weight", optional=True),
                Input("k_norm_weight", optional=True), Input("query_seqlens", optional=True)),
        outputs=(Output("output"), Output("present_key", dtype=3), Output("present_value", dtype=4)),
        attributes=(Attribute("num_heads", "INT"), Attribute("kv_num_heads", "INT"), Attribute("scale", "FLOAT"),
                    Attribute("causal", "INT", 1), Attribute("local_window_size", "INT", -1),
                    Attribute("do_rotary", "INT", 0), Attribute("rotary_interleaved", "INT", 0)),
        infer=_gqa,
        # com.microsoft.GroupQueryAttention, same inputs in the same order. The CUDA kernel is float16 /
        # bfloat16 only (fp32 models keep graphopt.MultiHeadAttention there: targets.py).
        lowerings={
            "ort-cpu": Lowering(MS_DOMAIN, "GroupQueryAttention", contract=_cpu_gqa),
            "ort-cuda": Lowering(MS_DOMAIN, "GroupQueryAttention", contract=_cuda_gqa),
        },
    ),
    OpSpec(
        "graphopt", "ScaledDotProductAttention",
        "softmax(q k^T * scale + mask) v on [batch, heads, seq, head_size] (torch only)",
        inputs=(Input("query"), Input("key"), Input("value"), Input("attn_mask", optional=True)),
        outputs=(Output("output"),),
        attributes=(Attribute("scale", "FLOAT"), Attribute("is_causal", "INT", 0)),
        infer=_sdpa,
    ),
    OpSpec(
        "graphopt", "FusedConv",
        "Conv (+ Z, a residual of the output's shape) + activation",
        inputs=(Input("X"), Input("W"), Input("B", optional=True), Input("Z", optional=True)),
        outputs=_Y,
        attributes=(
            Attribute("activation", "STRING", choices=FUSED_CONV_ACTIVATIONS),
            Attribute("activation_params", "FLOATS"),
            Attribute("auto_pad", "STRING", "NOTSET"),
            Attribute("dilations", "INTS"),
            Attribute("group", "INT", 1),
            Attribute("kernel_shape", "INTS"),
            Attribute("pads", "INTS"),
            Attribute("strides", "INTS"),
        ),
        infer=_conv,
        lowerings={
            "ort-cpu": Lowering(MS_DOMAIN, "FusedConv", contract=_activation_in(None, *FUSED_CONV_ACTIVATIONS)),
            # contrib_ops/cuda/fused_conv.cc MapMode: Relu only (newer cuDNN-frontend builds add
            # Tanh), and the activation attribute is required.
            "ort-cuda": Lowering(MS_DOMAIN, "FusedConv", contract=_activation_in("Relu")),
        },
        # torch: cuDNN's fused conv + bias + (add +) ReLU against the convolution and inductor's
        # fused pointwise kernel, 1.12 ms against 1.82 ms for ResNet-50's 49 such convolutions on
        # an H200 (benchmarks/torch_op_choices.py). The Triton kernels (attention, norms, ...)
        # lose to or tie with inductor's code (benchmarks/RESULTS.md): not marked.
        facts=facts("torch_beats_inductor"),
    ),
    OpSpec(
        "graphopt", "SkipLayerNorm",
        "LayerNormalization(input + skip (+ bias)) over the last axis; the sum is the 4th output",
        inputs=(Input("input"), Input("skip"), Input("gamma"), Input("beta", optional=True), Input("bias", optional=True)),
        outputs=_NORM_OUTPUTS,
        attributes=(Attribute("epsilon", "FLOAT", 1e-12),),
        infer=_skip_norm,
        lowerings=_ort(Lowering(MS_DOMAIN, "SkipLayerNormalization")),
    ),
    OpSpec(
        "graphopt", "SkipRMSNorm",
        "RMS normalization of input + skip (+ bias) over the last axis; the sum is the 4th output",
        inputs=(Input("input"), Input("skip"), Input("gamma"), Input("bias", optional=True)),
        outputs=_NORM_OUTPUTS,
        attributes=(Attribute("epsilon", "FLOAT", 1e-12),),
        infer=_skip_norm,
        lowerings=_ort(Lowering(MS_DOMAIN, "SkipSimplifiedLayerNormalization")),
    ),
    OpSpec(
        "graphopt", "RMSNorm",
        "x / sqrt(mean(x^2, axis) + epsilon) * scale",
        inputs=(Input("X"), Input("scale")),
        outputs=_Y,
        attributes=(Attribute("axis", "INT", -1), Attribute("epsilon", "FLOAT", 1e-5)),
        infer=_like_first,
        # onnxruntime registers SimplifiedLayerNormalization in the default domain.
        lowerings=_ort(Lowering("", "SimplifiedLayerNormalization")),
    ),
    OpSpec(
        "graphopt", "LayerNorm",
        "(x - mean) / sqrt(var + epsilon) * scale + bias over the last axis: LayerNormalization below opset 17",
        inputs=(Input("X"), Input("Scale"), Input("B", optional=True)),
        outputs=_Y,
        attributes=(Attribute("axis", "INT", -1), Attribute("epsilon", "FLOAT", 1e-5)),
        infer=_like_first,
        # onnxruntime registers LayerNormalization in the default domain from opset 1 (a contrib
        # kernel below 17, what its own LayerNormFusion emits): the normalization rules use it
        # where the model's opset has no standard LayerNormalization.
        lowerings=_ort(Lowering("", "LayerNormalization")),
    ),
    OpSpec(
        "graphopt", "GroupNorm",
        "GroupNormalization with per-channel gamma and beta, optionally followed by SiLU (activation = 1)",
        inputs=(Input("X"), Input("gamma"), Input("beta")),
        outputs=_Y,
        # Rules write channels_last = 0 (X is NCHW, graphopt's form); the layout pass makes it
        # NHWC, the only layout the CUDA kernel runs.
        attributes=(Attribute("groups", "INT"), Attribute("activation", "INT"), Attribute("epsilon", "FLOAT", 1e-5), Attribute("channels_last", "INT", 1)),
        infer=_like_first,
        lowerings={"ort-cuda": Lowering(MS_DOMAIN, "GroupNorm", contract=_cuda_group_norm)},
    ),
    OpSpec("graphopt", "Gelu", "x * 0.5 * (1 + erf(x / sqrt(2)))", inputs=_X, outputs=_Y, infer=_like_first,
           lowerings=_ort(Lowering(MS_DOMAIN, "Gelu")), facts=facts("elementwise")),
    OpSpec(
        "graphopt", "FastGelu", "the tanh approximation of GELU of X (+ bias)",
        inputs=(Input("X"), Input("bias", optional=True)), outputs=_Y, infer=_like_first, facts=facts("same_shape"),
        lowerings=_ort(Lowering(MS_DOMAIN, "FastGelu")),
    ),
    OpSpec("graphopt", "BiasGelu", "erf GELU of A + B (B: a bias of A's last dim)", inputs=(Input("A"), Input("B")), outputs=(Output("C"),),
           infer=_like_first, lowerings=_ort(Lowering(MS_DOMAIN, "BiasGelu")), facts=facts("same_shape")),
    OpSpec(
        "graphopt", "QuickGelu", "x * Sigmoid(alpha * x) (SiLU at alpha = 1)",
        inputs=_X, outputs=_Y, attributes=(Attribute("alpha", "FLOAT", 1.702),), infer=_like_first, facts=facts("elementwise"),
        lowerings={
            **_ort(Lowering(MS_DOMAIN, "QuickGelu")),
            # opset 24 Swish(x) = x * Sigmoid(alpha * x), whose alpha defaults to 1.0: written always.
            "onnx": Lowering("", "Swish", explicit=("alpha",)),
        },
    ),
    OpSpec(
        "graphopt", "RotaryEmbedding",
        "rotary position embedding of x [batch, heads, seq, head] or [batch, seq, hidden] with cos/sin caches [max_pos, rotary_dim / 2]",
        inputs=(Input("input"), Input("position_ids"), Input("cos_cache"), Input("sin_cache")),
        outputs=(Output("output"),),
        attributes=(Attribute("interleaved", "INT", 0), Attribute("num_heads", "INT", 0), Attribute("rotary_embedding_dim", "INT", 0)),
        infer=_like_first,
        lowerings=_ort(Lowering(MS_DOMAIN, "RotaryEmbedding")),
    ),
    OpSpec(
        "graphopt", "GeGLU",
        "(X + bias) halved on the last axis into (a, g) -> a * Gelu_erf(g)",
        inputs=(Input("X"), Input("bias")), outputs=_Y, infer=_halved,
        lowerings={"ort-cuda": Lowering(MS_DOMAIN, "BiasSplitGelu", contract=_cuda_bias_split_gelu)},
    ),
    OpSpec("graphopt", "SwiGLU", "silu(gate) * up (torch only)", inputs=(Input("gate"), Input("up")), outputs=_Y, infer=_like_first),
    OpSpec("graphopt", "GatedGelu", "gelu(gate) * up, erf or tanh GELU, gate and up two projections (Gemma's MLP; torch only)",
           inputs=(Input("gate"), Input("up")), outputs=_Y,
           attributes=(Attribute("approximate", "STRING", "none", choices=("none", "tanh")),), infer=_like_first),
    OpSpec(
        "graphopt", "GemmActivation",
        "activation(A @ B + C) in the GEMM's epilogue (torch: cuBLASLt's; ort-cpu: FusedGemm, Relu only)",
        inputs=(Input("A"), Input("B"), Input("C")), outputs=_Y,
        attributes=(Attribute("activation", "STRING", MISSING, choices=("Relu", "GeluTanh")), Attribute("transB", "INT", 0)),
        infer=_gemm,
        # contrib_ops/cpu/fused_gemm.cc (float32): it reads FusedConv's activation table, no GELU.
        lowerings={"ort-cpu": Lowering(MS_DOMAIN, "FusedGemm", contract=_activation_in("Relu"))},
    ),
)  # fmt: skip
