"""Comparing a model's outputs with the original's, within a tolerance that depends on the type.

`compare_outputs` gives the largest difference per output and one line per output out
of tolerance: integers, bools and strings must match exactly; floats within
`TOLERANCES` of their element type (loosened to a precision's `PRECISION_TOLERANCES`
when the model was converted to 16 bits), with NaN and infinity in the same places.
graphopt.verify runs the models; this module only judges their outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["Tolerance", "TOLERANCES", "PRECISION_TOLERANCES", "QUANTIZED_MIN_COSINE", "compare_outputs", "cosine_similarity"]


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


#: Per element type: |got - want| <= atol * max(1, scale) + rtol * |want|, where scale is
#: the output's largest magnitude (rounding error grows with the size of what is summed).
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-9),
    "float32": Tolerance(1e-4, 1e-5),
    "float16": Tolerance(1e-2, 1e-3),
    "bfloat16": Tolerance(5e-2, 1e-2),
}
_EXACT = Tolerance(0.0, 0.0)

#: With `--precision`, the least tolerance for float outputs (which keep their float32
#: type but were computed in 16 bits): about ten units in the last place of the low type,
#: relative to the output's largest magnitude (docs/precision.md has the measurements).
PRECISION_TOLERANCES: dict[str, Tolerance] = {
    "fp16": Tolerance(1e-2, 1e-2),
    "bf16": Tolerance(5e-2, 5e-2),
}


#: With `--weights`: float outputs are judged by the cosine similarity of the whole output with the
#: original's (element-wise tolerances would flag the expected quantization error on every element).
#: One layer at the int4 budget (20 dB) gives about 0.995; random-weight LLaMA decoders' hidden states
#: 0.983 (2 layers, hidden 256) and 0.951 (4 layers, hidden 1024) with int4 block 32, 0.9996 with int8.
#: A broken rewrite (a transposed or wrong weight, a wrong layout) gives far less: the bounds leave room
#: for deeper models, not for bugs.
QUANTIZED_MIN_COSINE: dict[str, float] = {"int8": 0.99, "int4": 0.9}


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Of two arrays flattened (finite elements only); 1.0 for two all-zero arrays."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    finite = np.isfinite(x) & np.isfinite(y)
    x, y = x[finite], y[finite]
    norms = float(np.linalg.norm(x) * np.linalg.norm(y))
    if norms == 0.0:
        return 1.0 if not x.any() and not y.any() else 0.0
    return float(np.dot(x, y) / norms)


def _loosest(a: Tolerance, b: Tolerance | None) -> Tolerance:
    return a if b is None else Tolerance(max(a.rtol, b.rtol), max(a.atol, b.atol))


def _tolerance(dtype: np.dtype) -> Tolerance:
    return TOLERANCES.get(np.dtype(dtype).name, _EXACT)


def compare_outputs(
    want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], floor: Tolerance | None = None,
    min_cosine: float | None = None, cosines: dict[str, float] | None = None,
) -> tuple[dict[str, float], list[str]]:
    """Max abs difference per output, and one line per output that is out of tolerance.

    `floor` (a precision's tolerance) loosens the tolerance of every float output. With
    `min_cosine` (quantized weights), a float output passes when its cosine similarity with the
    original's is at least that (and NaN/infinity sit in the same places); `cosines` gets each
    float output's cosine similarity (the lowest over calls)."""
    diffs: dict[str, float] = {}
    problems: list[str] = []
    for name, expected in want.items():
        if name not in got:
            problems.append(f"output '{name}' is missing")
            continue
        actual = np.asarray(got[name])
        expected = np.asarray(expected)
        # Outputs that cannot be compared element-wise get no max_abs_diff entry; the problem says why.
        if actual.shape != expected.shape:
            problems.append(f"output '{name}' has shape {list(actual.shape)}, expected {list(expected.shape)}")
            continue
        if actual.dtype != expected.dtype:
            problems.append(f"output '{name}' has type {actual.dtype}, expected {expected.dtype}")
            continue
        tol = _tolerance(expected.dtype)
        if tol is not _EXACT:
            tol = _loosest(tol, floor)
        if tol is _EXACT or expected.size == 0:
            equal = np.array_equal(actual, expected)
            if expected.dtype.kind in "biu":
                diffs[name] = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64)), initial=0.0))
            else:
                diffs[name] = 0.0 if equal else 1.0  # strings: equal or not
            if not equal:
                problems.append(f"output '{name}' differs (exact match required for {expected.dtype})")
            continue
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        # NaN and infinity must sit in the same places; the rest is compared numerically.
        special = ~np.isfinite(e) | ~np.isfinite(a)
        same_special = (
            np.array_equal(np.isnan(a), np.isnan(e))
            and np.array_equal(a[np.isinf(e)], e[np.isinf(e)])
            and not np.isinf(a[~np.isinf(e)]).any()
        )
        finite = ~special
        if cosines is not None or min_cosine is not None:
            cosine = cosine_similarity(a, e)
            if cosines is not None:
                cosines[name] = min(cosines.get(name, 1.0), cosine)
        delta = np.abs(a[finite] - e[finite])
        diffs[name] = float(delta.max(initial=0.0))
        scale = max(1.0, float(np.abs(e[finite]).max(initial=0.0)))
        bad = delta > tol.atol * scale + tol.rtol * np.abs(e[finite])
        broken = np.isfinite(e) & ~np.isfinite(a)
        if broken.any():
            problems.append(
                f"output '{name}' is not finite where the original's is: {int(broken.sum())} of {e.size} elements NaN or infinity"
            )
        elif not same_special:
            problems.append(f"output '{name}' has NaN or infinity in different places")
        elif min_cosine is not None:
            if cosine < min_cosine:
                problems.append(f"output '{name}' differs beyond the quantization error: cosine similarity {cosine:.5f} < {min_cosine:g} (max abs diff {diffs[name]:.3g})")
        elif bad.any():
            problems.append(
                f"output '{name}' differs: max abs diff {diffs[name]:.3g} ({int(bad.sum())} of {e.size} elements out of tolerance rtol={tol.rtol:g}, atol={tol.atol:g}×{scale:.3g})"
            )
    return diffs, problems

