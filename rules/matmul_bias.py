"""Native helpers for matmul_bias.pdll."""

from __future__ import annotations

from graphopt.pattern.native import native_constraint


@native_constraint("BiasFitsGemm")
def bias_fits_gemm(ctx, product, bias):
    """C must broadcast (one way) to the [M, N] product, so Add's result keeps the product's shape."""
    out = ctx.shape(product)
    c = ctx.shape(bias)
    if c is None:
        return "the bias's shape is unknown"
    if len(c) > 2:
        return f"the bias has rank {len(c)}; Gemm's C has at most 2 dims"
    if ctx.dtype(bias) != ctx.dtype(product):
        return f"the bias is {ctx.dtype(bias)}, the product {ctx.dtype(product)}"
    if out is None or len(out) != 2:
        return "the product is not known to be 2-D"
    for c_dim, out_dim in zip(reversed(c), reversed(out)):
        if c_dim == 1:
            continue
        if c_dim != out_dim:
            return f"the bias's shape {list(c)} does not broadcast to the product's {list(out)}"
    return True
