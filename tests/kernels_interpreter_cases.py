"""The Triton kernels' logic, checked in Triton's interpreter on CPU tensors (or on a GPU).

Not collected by the normal test run: tests/test_kernels_triton.py runs this file in a
child pytest with TRITON_INTERPRET=1 (Triton reads it at import, before any kernel is
defined). Each case calls a kernel's launcher directly and compares it with the
plain-torch reference and with torch's own op (or a formula written out here).

On a GPU machine the same cases run compiled, on CUDA tensors:

    GRAPHOPT_KERNELS_DEVICE=cuda python -m pytest -q tests/kernels_interpreter_cases.py

Shapes are small (the interpreter runs every program in numpy) but cover several tiles:
the interpreter's tiles are 16 wide, so lengths like 37 or 45 need a partial last tile.
bf16 is checked where the kernel has no tl.dot: the interpreter's bf16 dot is wrong
(it multiplies the raw bits), and its bf16 rounding truncates, hence the looser bf16
tolerance.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F

DEVICE = torch.device(os.environ.get("GRAPHOPT_KERNELS_DEVICE", "cpu"))
if os.environ.get("TRITON_INTERPRET") != "1" and DEVICE.type != "cuda":
    raise RuntimeError("run this file with TRITON_INTERPRET=1 (tests/test_kernels_triton.py does) or GRAPHOPT_KERNELS_DEVICE=cuda")

from graphopt.kernels import _triton  # noqa: E402
from graphopt.kernels.attention import attention_reference, attention_triton  # noqa: E402
from graphopt.kernels.decode_attention import decode_attention_reference, decode_attention_triton  # noqa: E402
from graphopt.kernels.gates import geglu_reference, geglu_triton, swiglu_reference, swiglu_triton  # noqa: E402
from graphopt.kernels.matmul import linear_act_reference, linear_act_triton  # noqa: E402
from graphopt.kernels.norms import layer_norm_reference, layer_norm_triton, rms_norm_reference, rms_norm_triton  # noqa: E402
from graphopt.kernels.rotary import rotary_reference, rotary_triton  # noqa: E402

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
TOL = {F32: dict(atol=2e-5, rtol=2e-5), F16: dict(atol=3e-3, rtol=3e-3), BF16: dict(atol=3e-2, rtol=3e-2)}


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = {k: v * scale for k, v in TOL[dtype].items()}
    torch.testing.assert_close(got.float(), want.float(), **tol)


def rand(*shape: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)


def test_triton_runs_the_kernels() -> None:
    assert _triton.HAS_TRITON and (_triton.INTERPRET or DEVICE.type == "cuda")
    assert _triton.use_triton(rand(2))


# --- attention -----------------------------------------------------------------------------


def naive_attention(q, k, v, mask=None, is_causal=False, scale=None):  # type: ignore[no-untyped-def]
    """softmax(q k^T * scale + mask) v in fp64, written out (rows with nothing to attend to give 0)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    allowed = torch.ones_like(scores, dtype=torch.bool)
    if is_causal:
        allowed = allowed & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            scores = scores + mask.double()
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)
    return weights @ v


ATTENTION_CASES = {
    # name: (B, Hq, Hkv, S, T, D, Dv, dtype, causal, mask kind, mask shape)
    "mha_odd_lengths_d24": (1, 2, 2, 37, 37, 24, 24, F32, False, None, None),
    "gqa_causal_s_lt_t": (2, 4, 2, 19, 45, 16, 16, F32, True, None, None),
    "mqa_causal_s_gt_t": (1, 4, 1, 45, 19, 32, 32, F32, True, None, None),
    "decode_one_query": (2, 4, 2, 1, 40, 32, 32, F32, False, None, None),
    "fp16_d64": (1, 2, 2, 33, 40, 64, 64, F16, False, None, None),
    "fp16_causal_gqa_d80": (1, 4, 2, 40, 40, 80, 80, F16, True, None, None),
    "value_dim_differs": (1, 2, 2, 20, 27, 16, 40, F32, False, None, None),
    "bool_mask_full": (2, 2, 2, 33, 40, 16, 16, F32, False, "bool", (2, 2, 33, 40)),
    "bool_mask_broadcast_causal": (2, 4, 2, 33, 40, 16, 16, F32, True, "bool", (1, 1, 33, 40)),
    "additive_mask_2d_fp32_on_fp16": (1, 2, 2, 33, 40, 32, 32, F16, False, "additive", (33, 40)),
    "additive_padding_mask_causal": (2, 2, 1, 33, 33, 16, 16, F32, True, "padding", (2, 1, 1, 33)),
}


@pytest.mark.parametrize("name", sorted(ATTENTION_CASES))
def test_attention(name: str) -> None:
    b, hq, hkv, s, t, d, dv, dtype, causal, mask_kind, mask_shape = ATTENTION_CASES[name]
    q, k, v = rand(b, hq, s, d, dtype=dtype, seed=1), rand(b, hkv, t, d, dtype=dtype, seed=2), rand(b, hkv, t, dv, dtype=dtype, seed=3)
    mask = None
    if mask_kind == "bool":
        mask = (torch.rand(*mask_shape, generator=torch.Generator().manual_seed(4)) > 0.4).to(DEVICE)
        mask[..., 3, :] = False  # a query row that may attend to nothing: zeros
    elif mask_kind == "additive":
        mask = rand(*mask_shape, seed=5)
    elif mask_kind == "padding":  # HF-style padding: the last keys of batch 1 hidden
        mask = torch.zeros(*mask_shape, device=DEVICE)
        mask[1, ..., t - 7 :] = torch.finfo(torch.float32).min
    got = attention_triton(q, k, v, mask, causal)
    want = naive_attention(q, k, v, mask, causal)
    close(got, want, dtype)
    close(got, attention_reference(q, k, v, mask, causal), dtype)
    if mask_kind == "bool":
        assert got[:, :, 3].abs().max() == 0
    if not causal:  # SDPA itself; with causal + mask, SDPA's backends disagree on support
        cpu = [t.cpu() if t is not None else None for t in (q.float(), k.float(), v.float(), mask)]
        sdpa = F.scaled_dot_product_attention(*cpu[:3], attn_mask=cpu[3], enable_gqa=hq != hkv)  # CPU: SDPA's own semantics
        close(got.cpu(), sdpa, dtype)


def test_attention_strided_inputs_and_scale() -> None:
    # q from a [B, S, H, D] projection, transposed: no copy is made, strides are honoured
    q = rand(2, 21, 4, 16, seed=6).transpose(1, 2)
    k = rand(2, 35, 2, 16, seed=7).transpose(1, 2)
    v = rand(2, 2, 16, 35, seed=8).transpose(2, 3)
    got = attention_triton(q, k, v, None, True, 0.37)
    close(got, naive_attention(q, k, v, None, True, 0.37), F32)
    assert got.transpose(1, 2).is_contiguous()  # stored [B, S, H, D]: the merge of heads after it is a view


# --- linear_act ------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "silu"])
def test_linear_act_activations(activation: str) -> None:
    x, w, bias = rand(3, 13, 40, seed=1), rand(40, 37, seed=2), rand(37, seed=3)
    got = linear_act_triton(x, w, bias, activation)
    y = x @ w + bias
    torch_op = {"none": y, "relu": F.relu(y), "gelu": F.gelu(y), "gelu_tanh": F.gelu(y, approximate="tanh"), "silu": F.silu(y)}[activation]
    close(got, torch_op, F32, scale=5)
    close(got, linear_act_reference(x, w, bias, activation), F32, scale=5)


def test_linear_act_fp16_transposed_weight_no_bias() -> None:
    # an nn.Linear weight [N, K] passed as w.t(): read through its strides
    x = rand(2, 45, 50, dtype=F16, seed=4)
    weight = rand(33, 50, dtype=F16, seed=5) * 0.2
    got = linear_act_triton(x, weight.t(), None, "gelu")
    close(got, F.gelu(F.linear(x.float(), weight.float())), F16)


def test_linear_act_fp16_bias_noncontiguous_x() -> None:
    x = rand(40, 24, dtype=F16, seed=6)[:, :20]  # row stride 24
    w, bias = rand(20, 17, dtype=F16, seed=7) * 0.3, rand(17, dtype=F16, seed=8)
    close(linear_act_triton(x, w, bias, "silu"), F.silu(x.float() @ w.float() + bias.float()), F16)


# --- layer_norm / rms_norm ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("with_residual", [True, False])
def test_layer_norm(dtype: torch.dtype, with_residual: bool) -> None:
    x, residual = rand(3, 5, 50, dtype=dtype, seed=1), rand(3, 5, 50, dtype=dtype, seed=2)
    weight, bias = rand(50, seed=3), rand(50, seed=4)
    res = residual if with_residual else None
    out, residual_out = layer_norm_triton(x, res, weight, bias, 1e-5)
    s = x + residual if with_residual else x
    close(out, F.layer_norm(s.float(), (50,), weight, bias, 1e-5), dtype)
    close(residual_out, s, dtype)
    ref_out, _ = layer_norm_reference(x, res, weight, bias, 1e-5)
    close(out, ref_out, dtype)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_rms_norm_with_residual(dtype: torch.dtype) -> None:
    x, residual, weight = rand(7, 96, dtype=dtype, seed=1), rand(7, 96, dtype=dtype, seed=2), rand(96, seed=3)
    out, residual_out = rms_norm_triton(x, residual, weight, 1e-6)
    s = (x + residual).float()
    close(out, s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weight, dtype)
    close(residual_out, x + residual, dtype)
    close(out, rms_norm_reference(x, residual, weight, 1e-6)[0], dtype)


def test_norms_without_bias_on_strided_rows() -> None:
    x = rand(9, 64, seed=5)[:, :40]  # rows of 40 with a row stride of 64
    weight = rand(40, seed=6)
    out, residual_out = layer_norm_triton(x, None, weight, None, 1e-5)
    close(out, F.layer_norm(x, (40,), weight, None, 1e-5), F32)
    assert torch.equal(residual_out, x) and residual_out.data_ptr() != x.data_ptr()
    out, _ = rms_norm_triton(x, None, weight, 1e-5)
    close(out, F.rms_norm(x, (40,), weight, 1e-5), F32)


# --- swiglu / geglu ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_gates_contiguous(dtype: torch.dtype) -> None:
    gate, up = rand(3, 5, 70, dtype=dtype, seed=1), rand(3, 5, 70, dtype=dtype, seed=2)
    g, u = gate.float(), up.float()
    close(swiglu_triton(gate, up), F.silu(g) * u, dtype)
    close(geglu_triton(gate, up), F.gelu(g) * u, dtype)
    close(geglu_triton(gate, up, True), F.gelu(g, approximate="tanh") * u, dtype)
    close(swiglu_triton(gate, up), swiglu_reference(gate, up), dtype)
    close(geglu_triton(gate, up, True), geglu_reference(gate, up, True), dtype)


def test_gates_on_chunked_halves() -> None:
    # gate, up = h.chunk(2, -1): two views with a row stride of 2N, read in place
    h = rand(4, 3, 2 * 1100, dtype=F16, seed=3)  # rows longer than one 1024-wide block
    gate, up = h.chunk(2, -1)
    assert not gate.is_contiguous()
    close(swiglu_triton(gate, up), F.silu(gate.float()) * up.float(), F16)
    close(geglu_triton(gate, up), F.gelu(gate.float()) * up.float(), F16)


# --- rotary ------------------------------------------------------------------------------------


def hf_rotary(x, cos, sin, interleaved):  # type: ignore[no-untyped-def]
    """transformers' apply_rotary_pos_emb with partial rotary, and the GPT-J pairwise form."""
    rot = cos.shape[-1]
    cos, sin = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
    x_rot, x_pass = x[..., :rot].float(), x[..., rot:].float()
    if interleaved:
        rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), dim=-1).flatten(-2)
    else:
        x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2 :]
        rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


def rope_tables(batch: int, seq: int, rot: int, interleaved: bool, seed: int = 0):  # type: ignore[no-untyped-def]
    """cos/sin as HF builds them from position ids (both halves, or each frequency twice)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    positions = torch.randint(0, 100, (batch, seq), generator=torch.Generator().manual_seed(seed)).float()
    freqs = positions[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos().to(DEVICE), emb.sin().to(DEVICE)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_partial(dtype: torch.dtype, interleaved: bool) -> None:
    x = rand(2, 3, 7, 40, dtype=dtype, seed=1)
    cos, sin = rope_tables(2, 7, 24, interleaved)
    got = rotary_triton(x, cos, sin, interleaved)
    close(got, hf_rotary(x, cos, sin, interleaved), dtype)
    close(got, rotary_reference(x, cos, sin, interleaved), dtype)
    assert torch.equal(got[..., 24:], x[..., 24:])  # pass-through dims untouched


def test_rotary_full_width_shared_tables_strided_x() -> None:
    x = rand(2, 9, 5, 32, dtype=F16, seed=2).transpose(1, 2)  # [B, H, S, D] view of [B, S, H, D]
    cos, sin = rope_tables(1, 9, 32, False)
    close(rotary_triton(x, cos, sin), hf_rotary(x, cos, sin, False), F16)
    close(rotary_triton(x, cos[0], sin[0]), hf_rotary(x, cos, sin, False), F16)  # [S, R] tables


def test_attention_row_masked_with_finfo_min_averages_values() -> None:
    # HF masks with finfo.min, not -inf: a row masked everywhere that way averages v (SDPA does)
    q, k, v = rand(1, 2, 20, 16, seed=9), rand(1, 2, 30, 16, seed=10), rand(1, 2, 30, 16, seed=11)
    mask = torch.zeros(1, 1, 20, 30, device=DEVICE)
    mask[..., 5, :] = torch.finfo(torch.float32).min
    mask[..., 6, :] = float("-inf")
    got = attention_triton(q, k, v, mask)
    close(got.cpu(), F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), attn_mask=mask.cpu()), F32)
    close(got[:, :, 5], v.mean(2), F32)
    assert got[:, :, 6].abs().max() == 0


# --- decode_attention (split-K over a KV cache) -----------------------------------------------

DECODE_CASES = {
    # name: batch, q heads, kv heads, cache length, head, dtype, mask, splits (None: the kernel's choice)
    "gqa_cache_mask": (2, 8, 2, 45, 16, F32, "cache", None),
    "gqa_fp16_three_splits": (2, 8, 2, 61, 32, F16, "cache", 3),
    "mqa_one_split": (1, 4, 1, 37, 16, F32, "cache", 1),
    "mha_additive_per_head": (2, 4, 4, 30, 16, F32, "additive", 2),
    "no_mask_more_splits_than_tiles": (1, 6, 2, 20, 16, F32, None, 9),
    "group_of_three": (1, 6, 2, 33, 16, F16, "cache", 2),
}


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_attention(name: str) -> None:
    b, hq, hkv, t, d, dtype, mask_kind, splits = DECODE_CASES[name]
    q, k, v = rand(b, hq, 1, d, dtype=dtype, seed=1), rand(b, hkv, t, d, dtype=dtype, seed=2), rand(b, hkv, t, d, dtype=dtype, seed=3)
    mask = None
    if mask_kind == "cache":  # a static cache's: the positions written so far (one fewer in batch 1)
        filled = torch.tensor([t - 6, t - 7])[:b].to(DEVICE)
        mask = (torch.arange(t, device=DEVICE)[None, :] < filled[:, None]).view(b, 1, 1, t)
    elif mask_kind == "additive":
        mask = rand(b, hq, 1, t, seed=5)
    got = decode_attention_triton(q, k, v, mask, None, splits=splits)
    close(got, naive_attention(q, k, v, mask), dtype)
    close(got, decode_attention_reference(q, k, v, mask), dtype)
    cpu = [x.cpu() if x is not None else None for x in (q.float(), k.float(), v.float(), mask)]
    close(got.cpu(), F.scaled_dot_product_attention(*cpu[:3], attn_mask=cpu[3], enable_gqa=hq != hkv), dtype)
    assert got.transpose(1, 2).is_contiguous()  # graphopt::attention's layout
    if mask_kind == "cache":  # positions past the filled ones are never read into the result
        v_poisoned = v.clone()
        v_poisoned[:, :, t - 6 :] = 1e4
        close(decode_attention_triton(q, k, v_poisoned, mask, None, splits=splits), got, dtype)


#: name: cache rows, position of row 0, query position, window (-1: the causal bound alone), splits, mask
DECODE_RANGE_CASES = {
    "window_inside_a_long_cache": (64, 0, 40, 8, None, "window"),
    "window_at_the_start": (64, 0, 3, 8, 2, "window"),  # fewer rows than the window so far
    "window_cache_rolled": (8, 13, 20, 8, None, "window"),  # a StaticSlidingWindowLayer: row 0 at position 13
    "causal_bound_only": (48, 0, 17, -1, 3, "causal"),
    "window_wider_than_the_cache": (24, 0, 23, 4096, 2, "window"),
}


@pytest.mark.parametrize("name", list(DECODE_RANGE_CASES))
def test_decode_attention_reads_only_the_key_range(name: str) -> None:
    """key_positions / query_position / window: equal to the mask that says the same; the rows outside the range
    (poisoned with NaN) are never read."""
    t, first, query, window, splits, kind = DECODE_RANGE_CASES[name]
    q, k, v = rand(2, 4, 1, 16, seed=21), rand(2, 2, t, 16, seed=22), rand(2, 2, t, 16, seed=23)
    pos = first + torch.arange(t, device=DEVICE)
    keep = pos <= query
    if kind == "window":
        keep &= pos > query - window
    mask = keep.view(1, 1, 1, t).expand(2, 1, 1, t)
    key_positions, query_position = pos, torch.tensor([query], device=DEVICE)
    got = decode_attention_triton(q, k, v, mask, None, key_positions, query_position, window, splits=splits)
    close(got, naive_attention(q, k, v, mask), F32)
    close(decode_attention_reference(q, k, v, None, None, key_positions, query_position, window), got, F32)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :, ~keep], poisoned_v[:, :, ~keep] = float("nan"), float("nan")
    got_poisoned = decode_attention_triton(q, poisoned_k, poisoned_v, mask, None, key_positions, query_position, window, splits=splits)
    assert not torch.isnan(got_poisoned).any()
    close(got_poisoned, got, F32)
    if kind == "window" and int(keep.sum()) < t:  # without the range the kernel reads the poisoned rows
        assert torch.isnan(decode_attention_triton(q, poisoned_k, poisoned_v, mask, None, splits=splits)).any()


def test_decode_attention_rows_with_nothing_to_attend_and_finfo_min() -> None:
    q, k, v = rand(3, 4, 1, 16, seed=9), rand(3, 2, 40, 16, seed=10), rand(3, 2, 40, 16, seed=11)
    bool_mask = torch.ones(3, 1, 1, 40, dtype=torch.bool, device=DEVICE)
    bool_mask[1] = False  # batch 1 may attend to nothing: zeros
    got = decode_attention_triton(q, k, v, bool_mask, None, splits=4)
    assert got[1].abs().max() == 0
    close(got[0], naive_attention(q[:1], k[:1], v[:1])[0], F32)
    additive = torch.zeros(3, 1, 1, 40, device=DEVICE)
    additive[2] = torch.finfo(torch.float32).min  # HF's "masked" everywhere: v averaged, as SDPA does
    got = decode_attention_triton(q, k, v, additive, 0.3, splits=3)
    close(got[2], v[2].mean(1, keepdim=True).repeat_interleave(2, 0), F32)
    close(got[:2], naive_attention(q[:2], k[:2], v[:2], None, False, 0.3), F32)


def test_decode_attention_strided_cache() -> None:
    # k and v as [B, T, H, D] storage seen as [B, H, T, D]; q from a [B, 1, H, D] projection
    q = rand(2, 1, 8, 16, seed=12).transpose(1, 2)
    k = rand(2, 29, 2, 16, seed=13).transpose(1, 2)
    v = rand(2, 29, 2, 16, seed=14).transpose(1, 2)
    close(decode_attention_triton(q, k, v, None, None, splits=2), naive_attention(q, k, v), F32)
