"""Native helper for hard_swish.pdll: the four constants of x * Clip(x + 3, 0, 6) / 6."""

from __future__ import annotations

from graphopt.pattern.native import native_constraint


@native_constraint("HardSwishConstants")
def hard_swish_constants(ctx, three, low, high, six):
    """True, or a sentence saying which constant is off (it becomes the near-miss reason)."""
    for name, value, expected in (("the added constant", three, 3.0), ("Clip's min", low, 0.0), ("Clip's max", high, 6.0), ("the divisor", six, 6.0)):
        actual = ctx.scalar(value)  # a one-element constant as a float, None otherwise
        if actual != expected:
            return f"{name} is {actual}, expected {expected:g}"
    return True
