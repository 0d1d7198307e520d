"""The table of tests/both_kinds.py: per rule, a small torch module whose ONNX export and
whose FX graph both hold the rule's pattern, and how many rewrites it makes on each;
`NEGATIVE_CASES`: modules that look like a rule's pattern but are not it (a wrong constant,
an op used twice, a graph output), where it must not fire on either kind.

A rule that cannot be proven on both kinds says why in its .pdll file
(``// ONNX only: ...`` or ``// FX only: ...`` above the rule), not here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from both_kinds import Case

__all__ = ["CASES", "NEGATIVE_CASES"]


class Fn(nn.Module):
    """A module around a function of its inputs and of named constant tensors (its buffers)."""

    def __init__(self, fn: Callable[..., Any], **constants: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for name, value in constants.items():
            self.register_buffer(name, value)

    def forward(self, *xs: torch.Tensor) -> Any:
        return self.fn(self, *xs)


def fn(f: Callable[..., Any], **constants: Callable[[], torch.Tensor]) -> Callable[[], nn.Module]:
    """A builder of `Fn(f, ...)`; constants are built (seeded) when the case runs."""
    return lambda: Fn(f, **{k: make() for k, make in constants.items()})


def rand(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(*shape),)


def wide(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    """Inputs over [-8, 8]: both saturations of relu6(x + 3) and the part in between."""
    return lambda: (torch.rand(*shape) * 16 - 8,)


def rands(*shapes: tuple[int, ...]) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: tuple(torch.randn(*s) for s in shapes)


def const(*shape: int, positive: bool = False) -> Callable[[], torch.Tensor]:
    return lambda: torch.rand(*shape) + 0.5 if positive else torch.randn(*shape)


def seq(*layers: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """nn.Sequential of the layers, BatchNorm statistics made non-trivial."""

    def build() -> nn.Module:
        module = nn.Sequential(*(make() for make in layers))
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                with torch.no_grad():
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 1.5)
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
        return module

    return build


SQRT2 = math.sqrt(2.0)
K_TANH = math.sqrt(2.0 / math.pi)


def _gelu_erf(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x * 0.5 * (1.0 + torch.erf(x / SQRT2))


def _gelu_tanh(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(K_TANH * (x + 0.044715 * torch.pow(x, 3.0))))


def _layer_norm(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    d = x - mean
    var = d.pow(2.0).mean(-1, keepdim=True)
    return d / torch.sqrt(var + 1e-5) * m.g + m.b


def _repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """transformers' repeat_kv: each key/value head copied `group` times, in place."""
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, group, t, d).reshape(b, h * group, t, d)


def _tiled_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """The heads copied as a whole, `group` times (k.repeat(1, group, 1, 1)), written with expand."""
    b, h, t, d = x.shape
    return x[:, None].expand(b, group, h, t, d).reshape(b, group * h, t, d)


def _rms_norm(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    var = x.pow(2.0).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + 1e-6) * m.w


def _rms_norm_upcast(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm on a half-precision input: normalized in float32, cast back."""
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2.0).mean(-1, keepdim=True) + 1e-6)
    return m.w * x.to(h.dtype)


def _rms_norm_gemma(m: nn.Module, h: torch.Tensor, up: torch.dtype = torch.float32) -> torch.Tensor:
    """transformers' GemmaRMSNorm on a half-precision input: normalized and scaled by (1 + w) in float32 (or `up`),
    then cast back. eps 2^-20: a float64 one rounds to the fused op's float32 attribute exactly."""
    x = h.to(up)
    x = x * torch.rsqrt(x.pow(2.0).mean(-1, keepdim=True) + 2.0**-20)
    return (x * (1.0 + m.w.to(up))).to(h.dtype)


def _layer_norm_second_moment(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """flax's LayerNorm: the variance from the second moment, clamped at 0."""
    mean = x.mean(-1, keepdim=True)
    var = torch.maximum((x * x).mean(-1, keepdim=True) - mean * mean, m.zero)  # jax2onnx writes Max
    return (x - mean) / torch.sqrt(var + 1e-6) * m.g + m.b


def _layer_norm_clamped_rsqrt(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A LayerNorm written with the variance clamped by clamp(min=0) (Clip) and rsqrt (Reciprocal(Sqrt))."""
    d = x - x.mean(-1, keepdim=True)
    return d * torch.rsqrt(torch.clamp((d * d).mean(-1, keepdim=True), min=0.0) + 1e-5) * m.g + m.b


def _layer_norm_moments(m: nn.Module, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Keras's LayerNormalization: a = rsqrt(var + eps) * gamma, x * a + (beta - mean * a)."""
    mean = x.mean(dim, keepdim=True)
    d = x - mean
    a = torch.rsqrt((d * d).mean(dim, keepdim=True) + 1e-6) * m.g
    return x * a + (m.b - mean * a)


def _layer_norm_summed(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A LayerNorm whose means are sums divided by N, the variance clamped by relu, eps added first."""
    d = x - x.sum(-1, keepdim=True) / 8
    return d / torch.sqrt(torch.relu((d * d).sum(-1, keepdim=True) / 8 + 1e-5)) * m.g + m.b


def _layer_norm_unscaled(x: torch.Tensor) -> torch.Tensor:
    """A LayerNorm with neither gamma nor beta, the variance as the second moment, rsqrt."""
    mean = x.mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(torch.relu((x * x).mean(-1, keepdim=True) - mean * mean) + 1e-5)


def _rms_norm_keras(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Keras's RMSNormalization: x * (rsqrt(mean(x * x) + eps) * weight)."""
    return x * (torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * m.w)


def _attention(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _masked_attention(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1), v)


def _group_norm(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Group norm written out: [N, G, -1] view, mean and variance over its last axis, view back, affine."""
    g = x.reshape(x.shape[0], 2, -1)
    d = g - g.mean(-1, keepdim=True)
    var = d.pow(2.0).mean(-1, keepdim=True)
    return (d / torch.sqrt(var + 1e-5)).reshape(x.shape) * m.g + m.b


def _geglu(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x[..., :half] * F.gelu(x[..., half:])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary_caches(seq_len: int, head: int, batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
    angles = torch.outer(torch.arange(seq_len).float(), inv)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos()[None, None], emb.sin()[None, None]


def _rotary(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x * m.cos + _rotate_half(x) * m.sin


def _rotary_bsnh(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    cos, sin = m.cos.transpose(1, 2), m.sin.transpose(1, 2)  # [1, seq, 1, head]: x is [batch, seq, heads, head] (GPT-J)
    return x * cos + _rotate_half(x) * sin


def _rotary_batched(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    cos, sin = m.cos.expand(2, 1, -1, -1) * m.scale, m.sin.expand(2, 1, -1, -1) * m.scale  # [batch, 1, seq, head]: one row per batch
    return x * cos + _rotate_half(x) * sin


def _cached_attention(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor,
                      repeat: Callable[[torch.Tensor, int], torch.Tensor] = _repeat_kv, masked: bool = True) -> tuple[torch.Tensor, ...]:
    """transformers' LLaMA attention over a DynamicCache, written out: the cache concatenated with
    the new k, v on the sequence axis (the presents, returned), repeat_kv, and the causal mask
    aligned to the end (key t seen by query s where t <= past + s) as Where(keep, 0, finfo.min), or
    none (`masked` False: what transformers passes for one new token)."""
    kc, vc = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
    past, seq, group = past_k.shape[2], q.shape[2], q.shape[1] // k.shape[1]
    keep = torch.arange(past + seq)[None, :] <= torch.arange(past, past + seq)[:, None]
    mask = torch.where(keep, 0.0, torch.finfo(q.dtype).min)[None, None]
    scores = torch.matmul(q, repeat(kc, group).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores + mask if masked else scores
    return torch.matmul(torch.softmax(scores, dim=-1), repeat(vc, group)), kc, vc


def _rotated_cached_attention(m: nn.Module, q: torch.Tensor, k: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The new q and k rotated (half form) at their positions past .. past + seq - 1, then `_cached_attention`."""
    return _cached_attention(m, q * m.cos + _rotate_half(q) * m.sin, k * m.cos + _rotate_half(k) * m.sin, *rest)


def _rotary_at(past: int, seq: int, head: int) -> dict[str, torch.Tensor]:
    """cos / sin [1, 1, seq, head] of positions past .. past + seq - 1 (what the model computes for the new tokens)."""
    inv = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
    emb = torch.outer(torch.arange(past, past + seq).float(), inv).repeat(1, 2)
    return {"cos": emb.cos()[None, None], "sin": emb.sin()[None, None]}


def _cache_inputs(batch: int, heads: int, kv_heads: int, seq: int, past: int, head: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    """q [batch, heads, seq, head], new k, v [batch, kv_heads, seq, head], past k, v [batch, kv_heads, past, head]."""
    return rands((batch, heads, seq, head), *[(batch, kv_heads, seq, head)] * 2, *[(batch, kv_heads, past, head)] * 2)


def _self_attention(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Two-head self-attention whose q, k and v are x @ w + b projections of one input (BERT's form)."""
    batch, seq, hidden = x.shape

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, seq, 2, hidden // 2).transpose(1, 2)

    o = _attention(m, heads(x @ m.wq + m.bq), heads(x @ m.wk + m.bk), heads(x @ m.wv + m.bv))
    return o.transpose(1, 2).reshape(batch, seq, hidden)


def _gpt2_attention(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """GPT-2's form: one Conv1D (addmm on the flattened tokens) makes q, k and v, split in three."""
    batch, seq, hidden = x.shape
    qkv = torch.addmm(m.b, x.reshape(-1, hidden), m.w).reshape(batch, seq, 3 * hidden)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, seq, 2, hidden // 2).transpose(1, 2)

    q, k, v = qkv.split(hidden, dim=2)
    o = _attention(m, heads(q), heads(k), heads(v))
    return o.transpose(1, 2).reshape(batch, seq, hidden)


_PROJECTIONS = {name: const(8, 8) if name.startswith("w") else const(8) for name in ("wq", "bq", "wk", "bk", "wv", "bv")}
#: the canonical rules that cancel FuseAttention's layout adapters against the projections' reshapes
_ATTENTION_ALONG = ("FuseAttention", "ComposeTransposes", "DropIdentityTranspose", "DropNoOpReshape", "CollapseReshapes")
#: FuseAttention makes the graphopt.MultiHeadAttention gqa.pdll's rules start from; ComposeTransposes folds k^T into its adapter
_GQA_ALONG = ("FuseAttention", "ComposeTransposes")


class ConvBnOfWeights(nn.Module):
    """A Conv whose weights come in as an input, then BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = seq(lambda: nn.BatchNorm2d(4))()

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.bn(F.conv2d(x, w, padding=1))


def _swin_window_pad(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """HF Swin's maybe_pad on [B, H, W, C]: pad H and W up to the window (4); a multiple of it pads by 0."""
    _, h, w, _ = x.shape
    return F.pad(x, (0, 0, 0, (4 - w % 4) % 4, 0, (4 - h % 4) % 4))


CASES: list[Case] = [
    # activations.pdll
    Case("FuseGeluErf", fn(_gelu_erf), rand(2, 8), 1, opset=20),
    Case("FuseGeluTanh", fn(_gelu_tanh), rand(2, 8), 1, opset=20),
    Case("FuseBiasGelu", fn(lambda m, x: F.gelu(x + m.b), b=const(8)), rand(2, 3, 8), 1, opset=20, onnx_target="ort-cpu"),
    # the same rule on the tanh GELU: FastGelu takes the bias
    Case("FuseBiasGelu", fn(lambda m, x: F.gelu(x + m.b, approximate="tanh"), b=const(8)), rand(2, 3, 8), 1, opset=20,
         onnx_target="ort-cpu"),
    Case("FuseQuickGelu", fn(lambda m, x: x * torch.sigmoid(1.702 * x)), rand(2, 8), 1, onnx_target="ort-cpu"),
    Case("FuseSiLU", fn(lambda m, x: x * torch.sigmoid(x)), rand(2, 8), 1, onnx_target="ort-cpu"),
    # canonical.pdll
    Case("ComposeTransposes", fn(lambda m, x: x.permute(0, 2, 1, 3).permute(0, 1, 3, 2) + 1.0), rand(2, 3, 4, 5), 1, exporter="dynamo"),
    Case("DropIdentityTranspose", fn(lambda m, x: x.permute(0, 1, 2) + 1.0), rand(2, 3, 4), 1, exporter="dynamo"),
    Case("DropNoOpReshape", fn(lambda m, x: x.reshape(2, 3, 4) + 1.0), rand(2, 3, 4), 1, exporter="dynamo"),
    Case("CollapseReshapes", fn(lambda m, x: x.reshape(6, 20).reshape(2, 60) + 1.0), rand(2, 3, 4, 5), 1),
    Case("UnflattenBatchedTranspose", fn(lambda m, x: x.reshape(-1, 4, 5).transpose(1, 2).reshape(2, 3, 5, 4) + 1.0), rand(2, 3, 4, 5), 1),
    Case("CollapseShapeOps", fn(lambda m, x: x.flatten(2).unsqueeze(1) + 1.0), rand(2, 3, 4, 5), 1),
    Case("CollapseShapeOps", fn(lambda m, x: x.squeeze(1).reshape(2, 12) + 1.0), rand(2, 1, 3, 4), 1, name="squeeze_reshape"),
    # cleanup.pdll
    Case("DropReshapeRoundTrip", fn(lambda m, x: x.squeeze(-1).view(2, 4, 1) + 1.0), rand(2, 4, 1), 1),
    Case("DropReshapeRoundTrip", fn(lambda m, x: x.unsqueeze(0).reshape(2, 4) + 1.0), rand(2, 4), 1, name="unsqueeze"),
    Case("DropSingleInputConcat", fn(lambda m, x: torch.cat([x]) + 1.0), rand(2, 4), 1),
    # both keep the zero Pad: the exporter's Pad and aten.constant_pad_nd with the pads (0, 0, 0, 0, 0, 0) the remainders came to
    Case("DropZeroPad", fn(lambda m, x: _swin_window_pad(m, x) + 1.0), rand(1, 8, 8, 3), 1),
    Case("DropPassThrough", fn(lambda m, x: torch.ops.aten.alias(x) + 1.0), rand(2, 4), 1, exporter="dynamo"),
    # cast.pdll
    Case("CollapseCastChain", fn(lambda m, x: x.double().float() + 1.0), rand(2, 8), 1),
    Case("DropNoOpCast", fn(lambda m, x: x.double().float() + 1.0), rand(2, 8), 1, along=("CollapseCastChain",)),
    # conv_bn.pdll
    Case("FoldConvBatchNorm", seq(lambda: nn.Conv2d(3, 4, 3, padding=1), lambda: nn.BatchNorm2d(4)), rand(1, 3, 6, 6), 1, exporter="dynamo"),
    Case("FoldConvBatchNorm", seq(lambda: nn.ConvTranspose2d(3, 4, 3, stride=2), lambda: nn.BatchNorm2d(4)), rand(1, 3, 5, 5), 1, name="transpose"),
    Case("FoldGemmBatchNorm", seq(lambda: nn.Linear(6, 4), lambda: nn.BatchNorm1d(4)), rand(3, 6), 1),
    Case("FoldMatMulBatchNorm", seq(lambda: nn.Linear(6, 4, bias=False), lambda: nn.BatchNorm1d(4)), rand(3, 6), 1),
    Case("FoldConvBatchNormComputedWeights", ConvBnOfWeights, rands((1, 3, 6, 6), (4, 3, 3, 3)), 1),
    # hard_activations.pdll: the activations written out by hand (relu6 and clamp are Clip on both kinds)
    Case("FuseHardSigmoid", fn(lambda m, x: F.relu6(x + 3) / 6), wide(2, 8), 1),
    Case("FuseHardSigmoid", fn(lambda m, x: torch.clamp(x + 1, 0, 2) * 0.5), wide(2, 8), 1, name="mul"),
    Case("FuseHardSwish", fn(lambda m, x: x * F.relu6(x + 3) / 6), wide(2, 8), 1),
    Case("FuseHardSwish", fn(lambda m, x: x * torch.clamp(x + 3, 0, 6) * (1 / 6)), wide(2, 8), 1, name="mul"),
    Case("FuseHardSwishFromHardSigmoid", fn(lambda m, x: x * F.hardsigmoid(x)), wide(2, 8), 1),
    Case("FuseHardSwishFromHardSigmoid", fn(lambda m, x: x * F.relu6(x + 3) / 6), wide(2, 8), 1, along=("FuseHardSwish",),
         name="written_out"),
    Case("FuseSoftplus", fn(lambda m, x: torch.log(1 + torch.exp(x))), wide(2, 8), 1),
    # log1p reads as Log(Add(x, 1)) on FX (split before the rules, merged back where unused); the ONNX exporter writes that
    Case("FuseSoftplus", fn(lambda m, x: torch.log1p(torch.exp(x))), wide(2, 8), 1, name="log1p"),
    Case("FuseMish", fn(lambda m, x: x * torch.tanh(F.softplus(x))), wide(2, 8), 1),
    Case("FuseMish", fn(lambda m, x: x * torch.tanh(torch.log(1 + torch.exp(x)))), wide(2, 8), 1, along=("FuseSoftplus",), name="written_out"),
    # linear_affine.pdll: a per-channel scale (a BatchNorm written out) after a linear op with constant weights
    Case("FoldScaleIntoConv", fn(lambda m, x: F.conv2d(x, m.w, m.b, padding=1) * m.s.view(1, -1, 1, 1), w=const(4, 3, 3, 3), b=const(4),
                                 s=const(4, positive=True)), rand(1, 3, 6, 6), 1),
    Case("FoldScaleIntoConv", fn(lambda m, x: F.conv_transpose2d(x, m.w, stride=2) * m.s.view(1, -1, 1, 1), w=const(3, 4, 3, 3),
                                 s=const(4, positive=True)), rand(1, 3, 5, 5), 1, name="transpose"),
    Case("FoldScaleIntoMatMul", fn(lambda m, x: (x @ m.w) * m.s, w=const(6, 4), s=const(4)), rand(3, 6), 1),
    # bias_fold.pdll: a bias added after the op that could have added it
    Case("FoldAddIntoConvBias", fn(lambda m, x: F.conv2d(x, m.w, padding=1) + m.b.view(1, -1, 1, 1), w=const(4, 3, 3, 3), b=const(4)),
         rand(1, 3, 6, 6), 1),
    Case("FoldAddIntoConvBias", fn(lambda m, x: F.conv2d(x, m.w, m.b0) * m.s.view(1, -1, 1, 1) + m.b.view(1, -1, 1, 1), w=const(4, 3, 3, 3),
                                   b0=const(4), s=const(4, positive=True), b=const(4)), rand(1, 3, 6, 6), 1, along=("FoldScaleIntoConv",),
         name="after_scale"),
    Case("FoldAddIntoConvBiasBeforeRelu", fn(lambda m, x: F.relu(F.conv2d(x, m.w, m.b0) + m.b.view(1, -1, 1, 1)), w=const(4, 3, 3, 3),
                                             b0=const(4), b=const(4)), rand(1, 3, 6, 6), 1),
    Case("FoldAddIntoConvBias", fn(lambda m, x: F.conv_transpose2d(x, m.w) + m.b.view(1, -1, 1, 1), w=const(3, 4, 3, 3), b=const(4)),
         rand(1, 3, 5, 5), 1, name="transpose"),
    Case("FoldChannelsLastAddIntoConvBias", fn(lambda m, x: F.conv2d(x, m.w).permute(0, 2, 3, 1) + m.b, w=const(4, 3, 3, 3), b=const(4)),
         rand(1, 3, 6, 6), 1),
    # conv_activation.pdll (on FX: cuDNN's fused conv + ReLU on CUDA, the ATen ops they were elsewhere)
    Case("FuseConvActivation", seq(lambda: nn.Conv2d(3, 4, 3, padding=1), nn.ReLU), rand(1, 3, 6, 6), 1, onnx_target="ort-cpu"),
    Case("FuseConvActivation", seq(lambda: nn.Conv2d(3, 4, 3, padding=1), lambda: nn.LeakyReLU(0.2)), rand(1, 3, 6, 6), 1,
         onnx_target="ort-cpu", name="leaky"),
    Case("FuseConvActivation", seq(lambda: nn.Conv2d(3, 4, 3, stride=2), nn.ReLU6), rand(1, 3, 7, 7), 1, onnx_target="ort-cpu", name="clip"),
    Case("FuseConvAddRelu", fn(lambda m, x, z: F.relu(F.conv2d(x, m.w, m.b, padding=1) + z), w=const(4, 3, 3, 3), b=const(4)),
         rands((1, 3, 6, 6), (1, 4, 6, 6)), 1, onnx_target="ort-cpu"),
    Case("FuseConvAdd", fn(lambda m, x, z: F.conv2d(x, m.w, m.b, padding=1) + z, w=const(4, 3, 3, 3), b=const(4)),
         rands((1, 3, 6, 6), (1, 4, 6, 6)), 1, onnx_target="ort-cpu"),
    # gemm_activation.pdll (ONNX: nn.Linear is Gemm with transB = 1; ort-cpu runs com.microsoft.FusedGemm)
    Case("FuseGemmActivation", fn(lambda m, x: F.relu(F.linear(x, m.w, m.b)), w=const(16, 8), b=const(16)), rand(3, 8), 1, onnx_target="ort-cpu"),
    # gates.pdll: GeGLU is com.microsoft.BiasSplitGelu on ort-cuda (hidden 2560, 5120 or 10240; written back as standard ops here);
    # the torchscript exporter writes F.gelu out (FuseGeluErf makes it one op) and the halves as Slices
    Case("FuseGeGLU", fn(lambda m, x: _geglu(x + m.b), b=const(2560)), rand(1, 2, 2560), 1, opset=20, along=("FuseGeluErf",), onnx_target="ort-cuda"),
    Case("FuseGeGLU", fn(lambda m, x: _geglu(x)), rand(1, 2, 2560), 1, opset=20, along=("FuseGeluErf",), onnx_target="ort-cuda", name="no-bias"),
    # group_norm.pdll: nn.GroupNorm is GroupNormalization at opset 21 (dynamo exporter) and aten.native_group_norm on FX;
    # com.microsoft.GroupNorm (ort-cuda) runs on the CPU written back as standard ops
    Case("FuseGroupNorm", fn(_group_norm, g=const(8, 1, 1), b=const(8, 1, 1)), rand(2, 8, 4, 4), 1, onnx_target="ort-cuda"),
    Case("GroupNormalizationToGroupNorm", lambda: nn.GroupNorm(2, 8), rand(2, 8, 4, 4), 1, exporter="dynamo", opset=21, onnx_target="ort-cuda"),
    Case("FuseGroupNormSiLU", seq(lambda: nn.GroupNorm(4, 8), nn.SiLU), rand(2, 8, 4, 4), 1, exporter="dynamo", opset=21, onnx_target="ort-cuda",
         along=("GroupNormalizationToGroupNorm", "FuseSiLU")),
    # matmul_bias.pdll
    Case("MatMulAddToGemm", fn(lambda m, x: x @ m.w + m.b, w=const(6, 4), b=const(4)), rand(3, 6), 1),
    # normalization.pdll
    Case("FuseLayerNorm", fn(_layer_norm, g=const(8), b=const(8)), rand(2, 3, 8), 1),
    # the sum also returned: the rule's fourth output carries it (the single-use form is covered along FoldBias* below)
    Case("FuseSkipLayerNorm", fn(lambda m, a, b: (F.layer_norm(a + b, (8,), m.g, m.b), a + b), g=const(8), b=const(8)), rands((2, 3, 8), (2, 3, 8)), 1,
         onnx_target="ort-cpu"),
    Case("FoldBiasIntoSkipLayerNorm", fn(lambda m, y, s: F.layer_norm((y + m.bias) + s, (8,), m.g, m.b), g=const(8), b=const(8), bias=const(8)),
         rands((2, 3, 8), (2, 3, 8)), 1, along=("FuseSkipLayerNorm",), onnx_target="ort-cpu"),
    # the same rule with the bias Add on SkipLayerNorm's second input
    Case("FoldBiasIntoSkipLayerNorm", fn(lambda m, y, s: F.layer_norm(s + (y + m.bias), (8,), m.g, m.b), g=const(8), b=const(8), bias=const(8)),
         rands((2, 3, 8), (2, 3, 8)), 1, along=("FuseSkipLayerNorm",), onnx_target="ort-cpu"),
    Case("FuseRMSNorm", fn(_rms_norm, w=const(8)), rand(2, 3, 8), 1, onnx_target="ort-cpu"),
    Case("FuseRMSNorm", fn(_rms_norm, w=const(8)), rand(2, 3, 8), 1, opset=23),
    Case("FuseLayerNormSecondMoment", fn(_layer_norm_second_moment, g=const(8), b=const(8), zero=lambda: torch.zeros(())), rand(2, 3, 8), 1, rtol=1e-4, atol=1e-4),
    Case("FuseLayerNorm", fn(_layer_norm_clamped_rsqrt, g=const(8), b=const(8)), rand(2, 3, 8), 1, name="clamped-rsqrt"),
    Case("FuseLayerNorm", fn(lambda m, x: _layer_norm_summed(m, x), g=const(8), b=const(8)), rand(2, 3, 8), 1, name="sum-over-n"),
    Case("FuseLayerNormMoments", fn(_layer_norm_moments, g=const(8), b=const(8)), rand(2, 3, 8), 1, rtol=1e-4, atol=1e-4),
    Case("FuseRMSNorm", fn(_rms_norm_keras, w=const(8)), rand(2, 3, 8), 1, onnx_target="ort-cpu", name="keras"),
    Case("FuseLayerNormUnscaled", fn(lambda m, x: _layer_norm_unscaled(x)), rand(2, 3, 8), 1, rtol=1e-4, atol=1e-4),
    Case("FoldScaleIntoLayerNorm", fn(lambda m, x: F.layer_norm(x, (8,)) * m.g, g=const(8)), rand(2, 3, 8), 1),
    Case("FoldBiasIntoLayerNorm", fn(lambda m, x: F.layer_norm(x, (8,), m.g) + m.b, g=const(8), b=const(8)), rand(2, 3, 8), 1),
    Case("FuseRMSNormUpcast", fn(_rms_norm_upcast, w=lambda: (torch.rand(8) + 0.5).half()), lambda: (torch.randn(2, 3, 8).half(),), 1,
         onnx_target="ort-cpu", rtol=2e-3, atol=2e-3),  # one fp16 rounding apart: the weight multiplies before or after it
    # Gemma: the (1 + w) scale in float32 before the cast back; FuseRMSNorm takes the float32 interior first
    Case("FuseRMSNormDowncast", fn(_rms_norm_gemma, w=lambda: (torch.rand(8) - 0.5).half()), lambda: (torch.randn(2, 3, 8).half(),), 1,
         along=("FuseRMSNorm",), onnx_target="ort-cpu", rtol=2e-3, atol=2e-3),
    Case("FuseSkipRMSNorm", fn(lambda m, a, b: (_rms_norm(m, a + b), a + b), w=const(8)), rands((2, 3, 8), (2, 3, 8)), 1, along=("FuseRMSNorm",),
         onnx_target="ort-cpu"),
    # pad_conv.pdll
    Case("FoldPadIntoConv", fn(lambda m, x: F.conv2d(F.pad(x, (1, 1, 2, 2)), m.w), w=const(4, 3, 3, 3)), rand(1, 3, 6, 6), 1),
    # attention.pdll
    Case("FuseAttention", fn(_attention), rands((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4)), 1, onnx_target="ort-cpu"),
    # masked_fill(mask, fill) is the FX view's Where(mask, fill, scores)
    Case("FuseAttention", fn(_masked_attention), lambda: (*rands((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4))(), torch.rand(2, 1, 5, 5) > 0.7), 1, atol=1e-4,
         onnx_target="ort-cpu", name="masked_fill"),
    Case("PackAttentionProjections", fn(_self_attention, **_PROJECTIONS), rand(2, 5, 8), 1, along=_ATTENTION_ALONG, onnx_target="ort-cpu",
         atol=1e-4),
    Case("PackedProjectionAttention", fn(_gpt2_attention, w=const(8, 24), b=const(24)), rand(2, 5, 8), 1, along=_ATTENTION_ALONG,
         onnx_target="ort-cpu", atol=1e-4),
    # FX only (the rule's file says why not ONNX): proven on FX
    Case("FuseSwiGLU", fn(lambda m, x: F.silu(x @ m.w1) * (x @ m.w3), w1=const(8, 16), w3=const(8, 16)), rand(2, 3, 8), 1, kinds=("fx",)),
    Case("FuseGatedGelu", fn(lambda m, x: F.gelu(x @ m.w1, approximate="tanh") * (x @ m.w3), w1=const(8, 16), w3=const(8, 16)), rand(2, 3, 8), 1,
         kinds=("fx",)),
    Case("FuseGatedGelu", fn(lambda m, x: F.gelu(x @ m.w1) * (x @ m.w3), w1=const(8, 16), w3=const(8, 16)), rand(2, 3, 8), 1, kinds=("fx",),
         name="erf"),
    Case("FuseScaledDotProductAttention", fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v)),
         rands((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4)), 1, kinds=("fx",)),
    # sdpa.pdll: repeat_kv copies taken out of attention (ONNX's opset-23 Attention, graphopt's SDPA on FX)
    Case("FuseGroupedKV", fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2))),
         rands((2, 4, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4)), 1, along=("FuseScaledDotProductAttention", "DropPassThrough"), opset=23,
         exporter="dynamo"),
    # gqa.pdll: attention over Concat(past, new) k / v -> graphopt.GroupQueryAttention (ort-cpu: com.microsoft's, with
    # query_seqlens: 3 new tokens over a past of 5 at batch 2; torch: aten SDPA with enable_gqa over the concatenations)
    Case("FuseGroupQueryAttention", fn(_cached_attention), _cache_inputs(2, 4, 2, 3, 5, 8), 1, along=_GQA_ALONG, onnx_target="ort-cpu",
         atol=1e-4),
    Case("FuseGroupQueryAttention", fn(_cached_attention), _cache_inputs(2, 4, 4, 2, 6, 8), 1, along=_GQA_ALONG, onnx_target="ort-cpu",
         atol=1e-4, name="mha"),
    # one new token without a mask (a decode step): causal hides nothing
    Case("FuseGroupQueryAttention", fn(lambda m, *xs: _cached_attention(m, *xs, masked=False)), _cache_inputs(2, 4, 2, 1, 6, 8), 1,
         along=_GQA_ALONG, onnx_target="ort-cpu", atol=1e-4, name="decode_unmasked"),
    # the CPU kernel rotates heads of a multiple of 16 only
    Case("FoldRotaryIntoGroupQueryAttention", lambda: Fn(_rotated_cached_attention, **_rotary_at(5, 3, 16)), _cache_inputs(2, 4, 2, 3, 5, 16), 1,
         along=("FuseRotaryEmbedding", *_GQA_ALONG, "FuseGroupQueryAttention"), onnx_target="ort-cpu", atol=1e-4),
    # rotary.pdll
    Case("FuseRotaryEmbedding", lambda: Fn(_rotary, **dict(zip(("cos", "sin"), _rotary_caches(5, 8))))
         , rand(2, 2, 5, 8), 1, onnx_target="ort-cpu"),
    Case("FuseRotaryEmbedding", lambda: Fn(_rotary_bsnh, **dict(zip(("cos", "sin"), _rotary_caches(5, 8)))), rand(2, 5, 3, 8), 1,
         onnx_target="ort-cpu"),
    Case("FuseRotaryEmbedding", lambda: Fn(_rotary_batched, scale=torch.tensor([1.0, 0.5]).reshape(2, 1, 1, 1),
                                                  **dict(zip(("cos", "sin"), _rotary_caches(5, 8)))), rand(2, 2, 5, 8), 1, onnx_target="ort-cpu"),
]

#: Modules that look like a rule's pattern but are not it: no rewrite on either kind (count 0),
#: the outputs still the module's.
NEGATIVE_CASES: list[Case] = [
    # gelu(gate) * up with up broadcast along the rows: not one elementwise gate
    Case("FuseGatedGelu", fn(lambda m, x: F.gelu(x @ m.w1) * m.u, w1=const(8, 16), u=const(16)), rand(2, 3, 8), 0, kinds=("fx",)),
    # Gemma's norm computed in float64: the fused op would normalize in float32
    Case("FuseRMSNormDowncast", fn(lambda m, h: _rms_norm_gemma(m, h, torch.float64), w=lambda: (torch.rand(8) - 0.5).half()),
         lambda: (torch.randn(2, 3, 8).half(),), 0, along=("FuseRMSNorm",), onnx_target="ort-cpu"),

    # Keras's LayerNorm over the middle axis: not LayerNormalization's last axis
    Case("FuseLayerNormMoments", fn(lambda m, x: _layer_norm_moments(m, x, dim=1), g=const(8), b=const(8)),
         rand(2, 3, 8), 0, name="middle-axis"),
    # the shift's inverse with another epsilon than the scale's
    Case("FuseLayerNormMoments", fn(lambda m, x: x * (torch.rsqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + 1e-6) * m.g)
                                    + (m.b - x.mean(-1, keepdim=True) * (torch.rsqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + 1e-3) * m.g)),
                                    g=const(8), b=const(8)), rand(2, 3, 8), 0, name="two-epsilons"),
    # a per-token scale after a LayerNorm without gamma: not LayerNormalization's scale
    Case("FoldScaleIntoLayerNorm", fn(lambda m, x: F.layer_norm(x, (8,)) * m.g, g=const(2, 3, 1)), rand(2, 3, 8), 0, name="per-token"),
    # centered by the mean of another tensor
    Case("FuseLayerNorm", fn(lambda m, x, y: (x - y.mean(-1, keepdim=True)) * torch.rsqrt(((x - y.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + 1e-5)
                             * m.g + m.b, g=const(8), b=const(8)), rands((2, 3, 8), (2, 3, 8)), 0, name="mean-of-another"),
    # k.repeat(1, 2, 1, 1)'s order (head h reads h % Hkv), not repeat_kv's: another attention
    Case("FuseGroupedKV", fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, _tiled_kv(k, 2), _tiled_kv(v, 2))),
         rands((2, 4, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4)), 0, along=("FuseScaledDotProductAttention", "DropPassThrough"), opset=23,
         exporter="dynamo", name="tiled"),
    # the kv heads copied as a block (query head i reads kv head i % kv_heads): not GroupQueryAttention's grouping
    Case("FuseGroupQueryAttention", fn(lambda m, *xs: _cached_attention(m, *xs, repeat=_tiled_kv)), _cache_inputs(2, 4, 2, 3, 5, 8), 0,
         along=_GQA_ALONG, onnx_target="ort-cpu", atol=1e-4, name="tiled"),
    # two new tokens without a mask: each sees the other, which GroupQueryAttention's causal = 1 would hide
    Case("FuseGroupQueryAttention", fn(lambda m, *xs: _cached_attention(m, *xs, masked=False)), _cache_inputs(2, 4, 2, 2, 6, 8), 0,
         along=_GQA_ALONG, onnx_target="ort-cpu", atol=1e-4, name="unmasked"),
    # q and k rotated at different positions (k's cos / sin from another offset): one cache pair cannot serve both
    Case("FoldRotaryIntoGroupQueryAttention",
         lambda: Fn(lambda m, q, k, *rest: _cached_attention(m, q * m.cos + _rotate_half(q) * m.sin, k * m.cos2 + _rotate_half(k) * m.sin2, *rest),
                    **_rotary_at(5, 3, 16), **{f"{n}2": t for n, t in _rotary_at(4, 3, 16).items()}),
         _cache_inputs(2, 4, 2, 3, 5, 16), 0, along=("FuseRotaryEmbedding", *_GQA_ALONG, "FuseGroupQueryAttention"), onnx_target="ort-cpu",
         atol=1e-4, name="k_other_positions"),
    Case("FuseHardSigmoid", fn(lambda m, x: F.relu6(x + 3) / 5), wide(2, 8), 0, name="divided_by_5"),
    Case("FuseHardSigmoid", fn(lambda m, x: (lambda c: (c / 6, c))(F.relu6(x + 3))), wide(2, 8), 0, name="clip_used_twice"),
    Case("FuseHardSwish", fn(lambda m, x: x * F.relu6(x + 2) / 6), wide(2, 8), 0, name="offset_2"),
    Case("FuseHardSwish", fn(lambda m, x: x * torch.clamp(x + 3, -1, 6) * (1 / 6)), wide(2, 8), 0, name="lower_bound_-1"),
    Case("FuseHardSwishFromHardSigmoid", fn(lambda m, x, y: y * F.hardsigmoid(x)), rands((2, 8), (2, 8)), 0, name="other_operand"),
    Case("FuseSoftplus", fn(lambda m, x: torch.log(2 + torch.exp(x))), wide(2, 8), 0, name="plus_2"),
    Case("FuseMish", fn(lambda m, x: x * torch.tanh(F.softplus(x, beta=2.0))), wide(2, 8), 0, name="softplus_beta_2"),
    Case("FoldScaleIntoConv", fn(lambda m, x: F.conv2d(x, m.w, padding=1) * m.s, w=const(4, 3, 3, 3), s=const(1, 4, 6, 6)), rand(1, 3, 6, 6), 0,
         name="scale_per_element"),
    Case("FoldScaleIntoMatMul", fn(lambda m, x: (x @ m.w) * m.s, w=const(6, 4), s=const(3, 1)), rand(3, 6), 0, name="scale_per_row"),
    Case("FoldAddIntoConvBias", fn(lambda m, x: F.conv2d(x, m.w, padding=1) + m.b, w=const(4, 3, 3, 3), b=const(1, 4, 6, 6)), rand(1, 3, 6, 6), 0,
         name="add_per_element"),
    Case("FoldChannelsLastAddIntoConvBias", fn(lambda m, x: F.conv2d(x, m.w).permute(0, 2, 1, 3) + m.b, w=const(4, 3, 3, 3), b=const(4)),
         rand(1, 3, 6, 6), 0, name="not_channels_last"),
    Case("DropReshapeRoundTrip", fn(lambda m, x: x.squeeze(-1).view(4, 2, 1) + 1.0), rand(2, 4, 1), 0, name="other_shape"),
    Case("DropReshapeRoundTrip", fn(lambda m, x: x.squeeze(-1).view(2, 4, 1)), rand(2, 4, 1), 0, name="graph_output"),
    Case("DropSingleInputConcat", fn(lambda m, x: torch.cat([x])), rand(2, 4), 0, name="graph_output"),
    # 7 rows: pad_b = 1
    Case("DropZeroPad", fn(lambda m, x: _swin_window_pad(m, x) + 1.0), rand(1, 7, 8, 3), 0, name="non_zero_pads"),
    Case("DropZeroPad", fn(_swin_window_pad), rand(1, 8, 8, 3), 0, name="graph_output"),
    # Unsqueeze of Squeeze: neither a Reshape nor a Flatten
    Case("CollapseShapeOps", fn(lambda m, x: x.squeeze(1).unsqueeze(0) + 1.0), rand(2, 1, 3, 4), 0, name="no_reshape"),
    Case("DropPassThrough", fn(lambda m, x: torch.ops.aten.alias(x)), rand(2, 4), 0, exporter="dynamo", name="graph_output"),
]
