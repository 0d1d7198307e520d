"""Native helpers for gemm_activation.pdll."""

from __future__ import annotations

from graphopt.pattern.native import native_constraint


@native_constraint("IsEpilogueActivation")
def is_epilogue_activation(ctx, kind, approximate):
    """cuBLASLt's epilogues: ReLU, and GELU in its tanh approximation only (no erf GELU)."""
    if kind == "Gelu" and approximate != "tanh":
        return f"Gelu with approximate = {approximate or 'none'!r}: cuBLASLt's GELU epilogue is the tanh approximation"
    return True
