"""FP8 (E4M3) GEMMs on the torch path: ``options={"precision": "fp8"}`` (issue 18, item 2).

Each GEMM with a constant 2-D weight (aten.mm / addmm / matmul against a frozen [K, N]
weight, or the transpose of an [N, K] one) whose K and N are multiples of 16 becomes:

- the weight quantized once, here, to float8_e4m3fn with one fp32 scale per output row (1, N);
- the activation quantized per row at run time (amax per row -> scale (M, 1), clamped to
  +-448) by plain ATen ops: with inductor on, inductor fuses them into the epilogue of the op
  that produces the activation (the RMSNorm or SwiGLU writes it in fp8 too); without inductor
  they run as ATen ops;
- ``torch._scaled_mm(x_fp8 row-major, w_fp8 column-major, scale_x, scale_w, bias, out_dtype)``.

A GEMM stays in the model's type when its signal-to-noise against the original, measured on
random probe rows with FP8 emulated in fp32 (quantize, dequantize), is under FP8_BUDGET_DB, or
when `keep` names it (by default the lm head: the projection named lm_head, or else the last
GEMM when its N is the largest). Only on CUDA with compute capability >= 8.9
(`device_refusal`); elsewhere the graph is left as it is and the report says why.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from graphopt.passes.fx_passes import NewConstant, _constant_2d, _fake_call, _transposed_constant

__all__ = ["FP8_BUDGET_DB", "Fp8Outcome", "device_refusal", "fp8_matmuls", "quantize_rows", "snr_db", "record", "summary"]

aten = torch.ops.aten

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
FP8_BUDGET_DB = 25.0  # issue 18's per-layer default for FP8
ALIGNMENT = 16  # torch._scaled_mm needs K and N multiples of 16
LM_HEAD = "lm_head"  # the keep-list name of the lm head (found by name or shape, `_is_lm_head`)
_TINY = 1e-12  # the smallest amax a scale is made from: an all-zero row quantizes to zeros, not NaN
_PROBE_ROWS = 64
_GEMMS = (aten.mm.default, aten.addmm.default, aten.matmul.default, aten._addmm_activation.default)
_BIASED = (aten.addmm.default, aten._addmm_activation.default)
_OUT_TYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Time FP8 against the GEMM as it is off CUDA too (tests, with fx_weight_quant_forms.TIMER replaced).
MEASURE_OFF_CUDA = False
#: FP8 is kept only where measured faster than the GEMM as it is by more than this (the noise margin).
MARGIN = 0.03


def device_refusal(device: torch.device) -> str | None:
    """Why FP8 GEMMs cannot run on `device`, or None where they can (CUDA, compute capability >= 8.9)."""
    if device.type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) >= (8, 9):
            return None
        what = f"{torch.cuda.get_device_name(device)}, compute capability {major}.{minor}"
    else:
        what = str(device)
    return f"fp8: not supported on this device ({what}; needs compute capability ≥ 8.9): the graph is left as it is"


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` [R, C] as float8_e4m3fn with one fp32 scale per row [R, 1]: t ~ q * scale.
    The same arithmetic as the activation quantize the pass puts in the graph."""
    t32 = t.float()
    scale = t32.abs().amax(dim=-1, keepdim=True).clamp_min(_TINY) / FP8_MAX
    return (t32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def _dequantized(t: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_rows(t)
    return q.float() * scale


def snr_db(weight_nk: torch.Tensor, probe_rows: int = _PROBE_ROWS, seed: int = 0) -> float:
    """Signal-to-noise (dB) of x @ W^T in FP8 (both operands per-row quantized, emulated in
    fp32) against fp32, on random normal probe rows x; -inf for a non-finite result."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(probe_rows, weight_nk.shape[1], generator=generator).to(weight_nk.device)
    w = weight_nk.float()
    with torch.no_grad():
        exact = x @ w.t()
        approx = _dequantized(x) @ _dequantized(w).t()
        signal, noise = float(exact.square().sum()), float((exact - approx).square().sum())
    if not (math.isfinite(signal) and math.isfinite(noise)):
        return -math.inf
    return math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-300) / noise)


@dataclass
class _Site:
    node: fx.Node
    weight_node: fx.Node  # the get_attr holding the weight ([N, K] behind a transpose, or [K, N])
    weight_nk: torch.Tensor
    name: str
    activation: str | None  # a fused GEMM's epilogue (_addmm_activation): "relu" or "gelu" (tanh)


@dataclass
class Fp8Outcome:
    """What the pass did: GEMMs now in FP8, GEMMs kept (name, why), or why nothing was done."""

    converted: list[tuple[str, float]] = field(default_factory=list)  # (name, SNR dB)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)
    refusal: str | None = None
    shapes: dict[str, tuple[int, int, str, int]] = field(default_factory=dict)  # name -> (K, N, op, bytes per element) for the report
    snrs: dict[str, float] = field(default_factory=dict)  # name -> SNR dB where measured (kept ones too)
    budget_db: float = 0.0


def _weight(gm: fx.GraphModule, operand: Any) -> tuple[fx.Node, torch.Tensor] | None:
    """The GEMM's constant right operand: (its get_attr node, the weight as [N, K])."""
    transposed = _transposed_constant(gm, operand)
    if transposed is not None:
        return transposed
    matrix = _constant_2d(gm, operand)
    return (operand, matrix.t()) if matrix is not None else None


def _sites(gm: fx.GraphModule) -> list[_Site]:
    sites = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _GEMMS or set(node.kwargs) - {"use_gelu"}:
            continue
        is_addmm = node.target in _BIASED
        if len(node.args) != (3 if is_addmm else 2) or (is_addmm and not isinstance(node.args[0], fx.Node)):
            continue
        activation = None
        if node.target is aten._addmm_activation.default:
            activation = "gelu" if node.kwargs.get("use_gelu", False) else "relu"
        bias, x, operand = (node.args if is_addmm else (None, *node.args))
        found = _weight(gm, operand)
        val, x_val = node.meta.get("val"), getattr(x, "meta", {}).get("val")
        if found is None or not isinstance(x, fx.Node) or not isinstance(val, torch.Tensor) or not isinstance(x_val, torch.Tensor):
            continue
        weight_node, weight_nk = found
        n, k = (int(d) for d in weight_nk.shape)
        if n % ALIGNMENT or k % ALIGNMENT or val.dtype not in _OUT_TYPES or x_val.dtype != val.dtype or x_val.dim() < 2:
            continue
        if node.target is not aten.matmul.default and x_val.dim() != 2:
            continue
        if sum(not isinstance(d, int) for d in x_val.shape[:-1]) > 1:  # one symbolic leading dim at most: reshaped back with -1
            continue
        name = str(weight_node.meta.get("graphopt_source") or weight_node.target)  # "model.layers.0.mlp.up_proj.weight", "+"-joined when packed
        sites.append(_Site(node, weight_node, weight_nk, name, activation))
    return sites


def _is_lm_head(site: _Site, sites: Sequence[_Site]) -> bool:
    if any(LM_HEAD in s.name for s in sites):
        return LM_HEAD in site.name
    widths = [s.weight_nk.shape[0] for s in sites]
    return len(sites) > 1 and site is sites[-1] and widths[-1] > max(widths[:-1])


def _kept_by_name(site: _Site, sites: Sequence[_Site], keep: Sequence[str]) -> str | None:
    for pattern in keep:
        if pattern == LM_HEAD and _is_lm_head(site, sites):
            return "the lm head (precision_keep)"
        if any(fnmatch.fnmatchcase(part, pattern) for part in site.name.split("+")):
            return f"named in precision_keep ({pattern!r})"
    return None


def fp8_matmuls(gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any, keep: Sequence[str] | None = None,
                budget_db: float | None = None, refusal: Callable[[torch.device], str | None] | None = None) -> Fp8Outcome:
    """Rewrite the GEMMs with constant weights into FP8 `torch._scaled_mm` (see the module's doc).
    `budget_db` (None: FP8_BUDGET_DB) and `refusal` (None: device_refusal) are read when called."""
    keep = [LM_HEAD] if keep is None else list(keep)
    budget_db = FP8_BUDGET_DB if budget_db is None else budget_db
    refusal = device_refusal if refusal is None else refusal
    outcome = Fp8Outcome(budget_db=budget_db)
    sites = _sites(gm)
    if not sites:
        return outcome
    device = sites[0].node.meta["val"].device
    outcome.refusal = refusal(device)
    if outcome.refusal is not None:
        return outcome
    quantized: dict[fx.Node, tuple[fx.Node, fx.Node]] = {}  # one FP8 copy per weight, however many GEMMs read it
    for site in sites:
        reason = _kept_by_name(site, sites, keep)
        snr = math.nan
        outcome.shapes[site.name] = (int(site.weight_nk.shape[1]), int(site.weight_nk.shape[0]), str(getattr(site.node.target, "__name__", "")).split(".")[0],
                                     site.node.meta["val"].element_size())
        if reason is None:
            snr = outcome.snrs[site.name] = snr_db(site.weight_nk)
            if not snr >= budget_db:
                reason = f"SNR {snr:.1f} dB under the {budget_db:g} dB budget"
        if reason is None:
            reason = _measured_slower(site)
        if reason is not None:
            outcome.kept.append((site.name, reason))
            continue
        with gm.graph.inserting_before(site.node):
            if site.weight_node not in quantized:
                w_fp8, w_scale = quantize_rows(site.weight_nk)
                quantized[site.weight_node] = (new_constant(w_fp8.contiguous(), f"{site.weight_node.name}_fp8"),
                                               new_constant(w_scale.t().contiguous(), f"{site.weight_node.name}_fp8_scale"))
            _rewrite(gm.graph, site, *quantized[site.weight_node], fake_mode)
        outcome.converted.append((site.name, snr))
    from graphopt.passes.fx_weight_quant_forms import release_timing_buffers

    release_timing_buffers()  # the L2 flush buffer of the timings
    return outcome


def _rows(site: _Site) -> int | None:
    """The rows the GEMM reads (the product of the activation's leading dims), None if symbolic."""
    x_val = site.node.args[1 if site.node.target in _BIASED else 0].meta["val"]  # type: ignore[union-attr]
    rows = 1
    for dim in x_val.shape[:-1]:
        if not isinstance(dim, int):
            return None
        rows *= dim
    return rows


def _measured_slower(site: _Site) -> str | None:
    """On CUDA: time the FP8 GEMM (the activation quantize included) against the GEMM as it is, at the
    rows the graph reads, once per shape; a reason to keep the GEMM when FP8 is no faster. At one row
    (a decode step) FP8 lost on an H100: TinyLlama decode 1.569 ms/token with FP8 against 1.420."""
    weight = site.weight_nk
    rows = _rows(site)
    if rows is None or (weight.device.type != "cuda" and not MEASURE_OFF_CUDA):
        return None
    from graphopt.passes import fx_weight_quant_forms as forms

    n, k = (int(d) for d in weight.shape)
    dtype = site.node.meta["val"].dtype
    w = weight.to(dtype)
    w_fp8, w_scale = quantize_rows(weight)
    w_scale_row = w_scale.t().contiguous()
    cuda = weight.device.type == "cuda"

    def fp8(x: torch.Tensor) -> torch.Tensor:
        x_fp8, x_scale = quantize_rows(x)
        return torch._scaled_mm(x_fp8, w_fp8.t(), x_scale, w_scale_row, out_dtype=torch.bfloat16 if cuda else dtype, use_fast_accum=cuda)

    x = torch.randn(rows, k, device=weight.device, dtype=dtype)
    times = forms.fastest(("fp8", rows, k, n, str(dtype), str(weight.device)), x,
                          [forms.Candidate("fp8", fp8), forms.Candidate("as it is", lambda x: x @ w.t())])
    if "fp8" in times and "as it is" in times and times["fp8"] < times["as it is"] * (1 - MARGIN):
        return None
    if "fp8" not in times:
        return "FP8 GEMM could not run at this shape"
    return f"measured no faster in FP8 at {rows} row(s): {times['fp8']:.4f} ms against {times.get('as it is', float('nan')):.4f} ms"


def _rewrite(graph: fx.Graph, site: _Site, w_fp8: fx.Node, w_scale: fx.Node, fake_mode: Any) -> None:
    def call(target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        node = graph.call_function(target, args, kwargs)
        node.meta["val"] = _fake_call(fake_mode, target, *fx.node.map_arg((args, kwargs), lambda n: n.meta["val"]))
        return node

    # The operands as they are now: an earlier rewrite may have replaced the GEMM that produced x.
    bias, x = (site.node.args[0], site.node.args[1]) if site.node.target in _BIASED else (None, site.node.args[0])
    assert isinstance(x, fx.Node) and (bias is None or isinstance(bias, fx.Node))
    val, x_val = site.node.meta["val"], x.meta["val"]
    n, k = (int(d) for d in site.weight_nk.shape)
    x = x if x_val.dim() == 2 else call(aten.reshape.default, x, [-1, k])
    # The activation quantize, as quantize_rows: plain ATen ops that inductor fuses into the producer.
    x32 = call(aten._to_copy.default, x, dtype=torch.float32)
    amax = call(aten.amax.default, call(aten.abs.default, x32), [-1], True)
    scale = call(aten.div.Tensor, call(aten.clamp_min.default, amax, _TINY), FP8_MAX)
    # Row-major whatever x's strides (a transposed view): _scaled_mm takes no other A layout.
    x_fp8 = call(aten._to_copy.default, call(aten.clamp.default, call(aten.div.Tensor, x32, scale), -FP8_MAX, FP8_MAX), dtype=FP8,
                 memory_format=torch.contiguous_format)
    # On CUDA the row-wise scaled GEMM writes bf16 (the type its kernels have); cast after if the model's differs.
    cuda = val.device.type == "cuda"
    out_dtype = torch.bfloat16 if cuda else val.dtype
    fused_bias = bias is not None and tuple(bias.meta["val"].shape) == (n,) and bias.meta["val"].dtype == out_dtype
    out = call(aten._scaled_mm.default, x_fp8, call(aten.t.default, w_fp8), scale, w_scale,
               bias if fused_bias else None, None, out_dtype, cuda)
    if out_dtype != val.dtype:
        out = call(aten._to_copy.default, out, dtype=val.dtype)
    if bias is not None and not fused_bias:
        out = call(aten.add.Tensor, out, bias)
    if site.activation == "relu":
        out = call(aten.relu.default, out)
    elif site.activation == "gelu":  # _addmm_activation's GELU is the tanh form (cuBLASLt's epilogue)
        out = call(aten.gelu.default, out, approximate="tanh")
    if x_val.dim() != 2:
        leading = [d if isinstance(d, int) else -1 for d in x_val.shape[:-1]]
        out = call(aten.reshape.default, out, [*leading, n])
    site.node.replace_all_uses_with(out)
    graph.erase_node(site.node)


def record(outcome: Fp8Outcome, report: Any) -> None:
    """The outcome in the report: one decision per GEMM (fp8, or kept and why), or the refusal."""
    from graphopt.report.sections import DecisionRecord

    if outcome.refusal is not None:
        report.warnings.append(outcome.refusal)
        return
    for name, snr in outcome.converted:
        report.decisions.append(DecisionRecord(kind="precision_fp8", site=name, chosen="fp8", baseline="model type",
                                               basis="measured", reason=f"SNR {snr:.1f} dB on random rows (emulated FP8)"))
    for name, reason in outcome.kept:
        report.decisions.append(DecisionRecord(kind="precision_fp8", site=name, chosen="model type", baseline="model type",
                                               basis="measured" if reason.startswith("SNR") else "forced", reason=reason))
    if outcome.shapes:
        report.weight_quantization = summary(outcome)
    if outcome.kept:
        report.warnings.append(f"fp8: {len(outcome.kept)} GEMMs kept in the model's type: "
                               + "; ".join(f"{name} ({reason})" for name, reason in outcome.kept))


def _reason_code(reason: str) -> str:
    """The report's reason code for a kept GEMM's words (as the weight-only path's)."""
    if reason.startswith("SNR"):
        return "budget"
    if reason.startswith("measured"):
        return "speed_measured"
    if reason.startswith("FP8 GEMM could not run"):
        return "no_kernel"
    return "lm_head" if "lm head" in reason else "keep_list"


def summary(outcome: Fp8Outcome) -> Any:
    """The outcome as the report's weight_quantization (weights "fp8", per-row scales: block 0)."""
    from graphopt.report.sections import WeightLayer, WeightQuantSummary

    result = WeightQuantSummary(weights="fp8", block_size=0, symmetric=True, form="per layer", accuracy_level=None,
                                min_snr_db=outcome.budget_db)
    kept = dict(outcome.kept)
    for name, (k, n, op, itemsize) in outcome.shapes.items():
        reason = kept.get(name)
        snr = outcome.snrs.get(name)
        snr = snr if snr is not None and math.isfinite(snr) else None  # a non-finite FP8 form: the words say it
        result.layers.append(WeightLayer(node=name, op=op, k=k, n=n, quantized=reason is None, reason="" if reason is None else _reason_code(reason),
                                         snr_db=snr, layer_form="_scaled_mm" if reason is None else "", detail=reason or "E4M3 weights per row, activations per row"))
        if reason is None:
            result.quantized += 1
            result.bytes_before += k * n * itemsize
            result.bytes_after += k * n + n * 4  # E4M3 + an fp32 scale per row
        else:
            result.kept += 1
    return result
