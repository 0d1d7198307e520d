"""graphopt::rotary: rotary position embedding in Hugging Face transformers' form.

x ``[B, H, S, D]``; cos and sin ``[B or 1, S, R]`` (or ``[S, R]``), broadcast over heads,
R even and ``<= D``. On the first R dims of each head:

    out = x * cos + rotate(x) * sin

where ``rotate`` is HF's ``rotate_half`` (``cat(-x2, x1)`` of the two halves; cos and sin
hold both halves) or, with ``interleaved``, the pairwise form (``(x0, x1) -> (-x1, x0)``
for each pair ``(2i, 2i+1)``). Dims beyond R pass through unchanged. Computed in fp32
and rounded once to x's dtype.

Element j of the result needs x at its partner index (``j +- R/2``, or ``j +- 1``
interleaved): the Triton kernel loads the tile a second time at the partner indices
(the same cache lines) rather than shuffling registers. One program handles one
(batch, position) for a block of heads, so cos and sin are read once per block.
"""

import torch
from torch import Tensor

from graphopt.kernels._triton import next_power_of_2, tl, triton

__all__ = ["check_rotary", "rotary_fake", "rotary_reference", "rotary_triton"]


def check_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    shapes = f"x {tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}"
    torch._check(x.dim() == 4 and x.dtype.is_floating_point, lambda: f"graphopt::rotary: x must be a floating [B, H, S, D] tensor; got {x.dtype} {tuple(x.shape)}")
    torch._check(cos.shape == sin.shape and cos.dim() in (2, 3), lambda: f"graphopt::rotary: cos and sin must share a shape [B or 1, S, R]: {shapes}")
    torch._check(cos.dtype.is_floating_point and sin.dtype.is_floating_point, lambda: f"graphopt::rotary: cos and sin must be floating: {cos.dtype}, {sin.dtype}")
    torch._check(cos.shape[-2] == x.shape[2], lambda: f"graphopt::rotary: cos/sin length differs from x's: {shapes}")
    torch._check(cos.dim() == 2 or cos.shape[0] == 1 or cos.shape[0] == x.shape[0], lambda: f"graphopt::rotary: cos/sin batch must be 1 or x's: {shapes}")
    rot = cos.shape[-1]
    torch._check(rot % 2 == 0 and rot <= x.shape[3], lambda: f"graphopt::rotary: the rotary dim R (cos.shape[-1]) must be even and <= D: {shapes}")


def rotary_fake(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    check_rotary(x, cos, sin)
    return x.new_empty(x.shape)


def rotary_reference(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """The CPU implementation, written as HF's apply_rotary_pos_emb (partial-rotary form)."""
    check_rotary(x, cos, sin)
    rot = cos.shape[-1]
    c, s = cos.float(), sin.float()
    if c.dim() == 3:  # [B, S, R] -> [B, 1, S, R]: broadcast over heads
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    xr = x[..., :rot].float()
    if interleaved:
        rotated = torch.stack((-xr[..., 1::2], xr[..., 0::2]), dim=-1).flatten(-2)
    else:
        half = rot // 2
        rotated = torch.cat((-xr[..., half:], xr[..., :half]), dim=-1)
    out = (xr * c + rotated * s).to(x.dtype)
    return torch.cat((out, x[..., rot:]), dim=-1).contiguous()


# --- Triton -------------------------------------------------------------------------------


@triton.jit
def _rotary_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr,
    H, S, D, R,
    stride_xb, stride_xh, stride_xs, stride_cb, stride_cs,
    INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # one program per (batch, position, block of heads)
    head_blocks = tl.cdiv(H, BLOCK_H)
    pid = tl.program_id(0)
    hb = pid % head_blocks
    bs = pid // head_blocks
    b = (bs // S).to(tl.int64)
    s = (bs % S).to(tl.int64)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    in_rot = dims < R
    if INTERLEAVED:
        partner = tl.where(dims % 2 == 0, dims + 1, dims - 1)
        sign = tl.where(dims % 2 == 0, -1.0, 1.0)
    else:
        half = R // 2
        partner = tl.where(dims < half, dims + half, dims - half)
        sign = tl.where(dims < half, -1.0, 1.0)
    partner = tl.where(in_rot, partner, dims)

    c = tl.load(cos_ptr + b * stride_cb + s * stride_cs + dims, mask=in_rot, other=1.0).to(tl.float32)
    sn = tl.load(sin_ptr + b * stride_cb + s * stride_cs + dims, mask=in_rot, other=0.0).to(tl.float32)

    ok = (heads[:, None] < H) & (dims[None, :] < D)
    row = x_ptr + b * stride_xb + heads[:, None].to(tl.int64) * stride_xh + s * stride_xs
    x = tl.load(row + dims[None, :], mask=ok, other=0.0).to(tl.float32)
    x_partner = tl.load(row + partner[None, :], mask=ok, other=0.0).to(tl.float32)
    # outside the rotary dims c = 1 and sn = 0: x passes through
    out = x * c[None, :] + sign[None, :] * x_partner * sn[None, :]
    out_row = out_ptr + ((b * H + heads[:, None].to(tl.int64)) * S + s) * D
    tl.store(out_row + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)


def rotary_triton(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    from torch.library import wrap_triton

    check_rotary(x, cos, sin)
    batch, heads, seq, head_d = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    if x.stride(3) != 1:
        x = x.contiguous()
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    # one layout for both tables: unit stride along R, the same batch and position strides
    cos, sin = cos.contiguous(), sin.contiguous()
    stride_cb = 0 if cos.shape[0] == 1 else cos.stride(0)
    block_d = next_power_of_2(head_d)
    block_h = min(next_power_of_2(heads), max(1, 4096 // block_d))
    grid = (batch * seq * triton.cdiv(heads, block_h),)
    wrap_triton(_rotary_kernel)[grid](
        x, cos, sin, out, heads, seq, head_d, cos.shape[-1],
        x.stride(0), x.stride(1), x.stride(2), stride_cb, cos.stride(1),
        INTERLEAVED=interleaved, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4,
    )
    return out
