"""LLM decode at the memory-bandwidth limit (issue 17): prefill + greedy decode of a LLaMA decoder.

A TinyLlama-1.1B-shaped LlamaConfig (hidden 2048, 22 layers, 32 heads, 4 key/value heads,
intermediate 5632, vocab 32000) with random weights, fp16 on CUDA; a prompt of --prompt
tokens, then --new-tokens greedy tokens, at each batch size of --batches. Variants, each in
the same process behind its own torch._dynamo.reset():

  eager         HF eager, dynamic cache (DynamicCache): the model's forward as it is
  inductor-ro   static cache (transformers' StaticCache) + torch.compile(model.forward,
                mode="reduce-overhead", fullgraph=True): inductor with CUDA graphs
  graphopt      static cache + backend="graphopt" (default mode: graphopt's rewrites, then inductor)
  graphopt-ro   the same with mode="reduce-overhead" (inductor's CUDA graphs)
  graphopt-cg   backend="graphopt", options={"inductor": False, "mode": "reduce-overhead"}:
                graphopt's rewritten graph with its Triton kernels, replayed as one CUDA graph
  graphopt-int8-ro, graphopt-int4-ro, graphopt-int8-cg, graphopt-int4-cg
                graphopt-ro / graphopt-cg with weight-only quantization (issue 18):
                options={"weights": "int8"|"int4", "block_size": --block-size}; each matmul's form
                (graphopt's Triton kernel, dequantize + matmul, torch._weight_int4pack_mm, or the
                fp16 matmul) is timed at compile time; the report's "weights" decisions are kept
                in the JSON (per-layer SNR and the winning form)
  graphopt-gemv-ro  graphopt-ro with options={"gemv": True}: the decode graph's GEMMs (M <= 16) offered to inductor's
                autotuner as graphopt::gemv_linear (graphopt/passes/fx_gemv.py), each kept where it timed faster than
                inductor's GEMM; the report's per-site "kernel" decisions are kept in the JSON ("gemv_sites": the
                winner per site, "gemv_kernels": how many each side won per graph)
  torchao-int4-ro  torchao's int4 weight-only (group --block-size, bf16: its tinygemm kernel's
                type) + inductor reduce-overhead; skipped where torchao is not importable

Every variant runs the same loop (one forward per token; the next token is the argmax of the
last logits), --warmup generations (compiling, CUDA-graph recording), then --runs timed ones.
A decode step's time is CUDA events around one forward (+ argmax), recorded without
synchronising; the figures are the median over every timed step. Prefill: the median of the
timed runs' prefill calls.

The bandwidth limit: every decode step reads every weight (the issue's anchors count all
of them, the input embedding too) and the key/value cache up to the current position;
bytes / the GPU's memory bandwidth (spec: 3.35 TB/s H100 SXM, 4.8 TB/s H200; a measured
device-to-device copy otherwise, and always reported beside it) is the fastest a step can be.

Tokens: each variant's first timed run against eager's (same batch): equal, or the first step
that differs with the eager logits' top-2 gap there (an fp16 near-tie looks like a gap of a
few hundredths), and the agreement: the fraction of (sequence, step) tokens equal to eager's
(after a first difference greedy decoding goes its own way, so this counts the steps before it).
"of limit" counts fp16 weight bytes for every variant (the quantized ones read fewer).

    python benchmarks/llm_decode.py                       # CUDA, fp16, batches 1 and 8 (bounded by --budget-s)
    python benchmarks/llm_decode.py --tiny --device cpu   # a smoke test of the same code on a tiny config (seconds)
    python benchmarks/llm_decode.py --family qwen2        # another decoder family's traits at the same size
                                                          # (llama3, qwen2, mistral, phi3, gemma: tests/llm_families.py)
    python benchmarks/llm_decode.py --family mistral --window 64   # a sliding window shorter than prompt + new tokens


--window sets a sliding-window family's window (Mistral's is 4096, longer than any run here: it never hides a key).
transformers 5.2x's StaticCache keeps a sliding layer's last min(window, cache) rows, rolled left each step once
full, and hands the layer's length to the model as a Python int (the positions, the mask's offset): with
dynamic=False every decode step recompiles and dynamo's recompile limit (8) ends the run, window crossed or not.
So a sliding-window family's static cache here gives every layer a row per position (as transformers 4.x's
StaticCache did; the window stays a mask over it, the tokens are the same), unless --sliding-layers. graphopt's decode kernel reads the rows the
mask proves visible (up to the query, within the window: graphopt/ops/fx_key_range.py). The graphopt variants
record, per decode_attention call of the last graph, the window it got ("decode_attention_windows": None where no
key range was proven, -1 for the causal bound alone); the KV bytes of the limit count min(window, position) rows.

Output: a table printed last; JSON at --out (a file, or a folder) or under $OUT when set.
--budget-s bounds the whole run: a (batch, variant) not started by then is recorded as skipped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("eager", "inductor-ro", "graphopt", "graphopt-ro", "graphopt-cg")
FAMILIES = ("llama", "llama3", "qwen2", "mistral", "phi3", "gemma")  # tests/llm_families.py
#: Weight-only quantized variants (issue 18): not in the default set (their compile quantizes the model).
WQ_VARIANTS = ("graphopt-int8-ro", "graphopt-int4-ro", "graphopt-int8-cg", "graphopt-int4-cg", "torchao-int4-ro")
#: graphopt's decode GEMV offered to inductor's autotuner (issue 17): not in the default set.
GEMV_VARIANTS = ("graphopt-gemv-ro",)
#: memory bandwidth by GPU name (bytes/s, the vendor's figure); others use the measured copy.
SPEC_BANDWIDTH = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("A100-SXM4-80GB", 2.039e12), ("A100", 1.555e12))


def llama_config(tiny: bool, family: str = "llama", window: int | None = None) -> Any:
    """The TinyLlama-shaped LlamaConfig (or the tiny one); another `family` (tests/llm_families.py: llama3, qwen2,
    mistral, phi3, gemma) is that family's config at the same size, with its traits; `window`: its sliding window."""
    import transformers

    if family != "llama":
        sys.path.insert(0, str(REPO / "tests"))
        from llm_families import config

        cfg = config(family, tiny=tiny)
        if window is not None:
            cfg.sliding_window = window
        return cfg
    if tiny:
        return transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                        intermediate_size=128, vocab_size=100, max_position_embeddings=512)
    return transformers.LlamaConfig(num_hidden_layers=22, hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
                                    intermediate_size=5632, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5)


def build_model(tiny: bool, device: str, dtype: Any, family: str = "llama", window: int | None = None) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = llama_config(tiny, family, window)
    with torch.device(device):  # random weights made on the device (a 1.1B model's init on the CPU takes long)
        model = getattr(transformers, type(cfg).__name__.replace("Config", "ForCausalLM"))(cfg)
    return model.to(dtype).eval()


def _cache_kwarg(model: Any) -> str:
    import inspect

    # transformers 5.2x renamed past_key_values to cache (the old name warns until 5.40).
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Timer:
    """CUDA events around a call, read after the run (no synchronisation per step); wall time on CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.pairs: list[Any] = []

    def __enter__(self) -> Timer:
        import torch

        self.start = torch.cuda.Event(enable_timing=True) if self.cuda else time.perf_counter()
        if self.cuda:
            self.start.record()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pairs.append((self.start, end))
        else:
            self.pairs.append((self.start, time.perf_counter()))

    def times_ms(self) -> list[float]:
        if self.cuda:
            return [a.elapsed_time(b) for a, b in self.pairs]
        return [(b - a) * 1e3 for a, b in self.pairs]


def generate(forward: Callable[..., Any], model: Any, ids: Any, new_tokens: int, cache: Any, device: str,
             mark_step: bool, gaps: bool = False, decode_context: Any = None) -> dict[str, Any]:
    """One greedy generation: the tokens, the prefill's and each decode step's time, and (gaps) the top-2 logit gap per step.
    decode_context: a context manager around the decode steps only (a profiler)."""
    import contextlib

    import torch

    key = _cache_kwarg(model)
    batch, prompt = ids.shape
    positions = torch.arange(prompt + new_tokens, device=device)
    prefill, steps = Timer(device), Timer(device)
    tokens, top2 = [], []

    def call(input_ids: Any, start: int, end: int) -> Any:
        if mark_step:  # inductor's CUDA graphs: each call a new step (the last outputs are read already)
            torch.compiler.cudagraph_mark_step_begin()
        return forward(input_ids=input_ids, cache_position=positions[start:end], use_cache=True, **{key: cache})

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with prefill:
            out = call(ids, 0, prompt)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        cache = _returned_cache(out) if cache is None else cache  # the dynamic cache comes back from the model
        with decode_context or contextlib.nullcontext():
            for step in range(new_tokens):
                tokens.append(token)
                if gaps:
                    top2.append(out.logits[:, -1].float().topk(2, dim=-1).values)
                if step == new_tokens - 1:
                    break
                with steps:
                    out = call(token, prompt + step, prompt + step + 1)
                    token = out.logits[:, -1].argmax(-1, keepdim=True)
            _sync(device)
    _sync(device)
    result: dict[str, Any] = {"tokens": torch.cat(tokens, 1).cpu(), "prefill_ms": prefill.times_ms()[0], "step_ms": steps.times_ms()}
    if gaps:
        values = torch.stack(top2, 1).cpu()  # [batch, steps, 2]
        result["gaps"] = (values[..., 0] - values[..., 1])
    return result


def _returned_cache(out: Any) -> Any:
    # transformers 5.2x's outputs name it cache (past_key_values still answers, with a deprecation notice)
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _static_cache(model: Any, batch: int, max_len: int, device: str, full: bool = False) -> Any:
    """A StaticCache made and filled once eagerly (so its tensors exist, at fixed addresses, before any compile), then reset.
    `full`: every layer keeps every position (a sliding window stays a mask over the whole cache, as transformers 4.x's
    StaticCache had it), not a sliding layer's last min(window, max_len) rows."""
    import copy

    import torch
    import transformers

    config = model.config
    if full:
        config = copy.deepcopy(config)
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    cache = transformers.StaticCache(config=config, max_cache_len=max_len)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        model(input_ids=ids, cache_position=torch.arange(1, device=device), use_cache=True, **{_cache_kwarg(model): cache})
    cache.reset()
    return cache


def _full_cache(model: Any, args: argparse.Namespace) -> bool:
    """A cache of every position for a sliding-window family unless --sliding-layers (see the module docstring)."""
    return getattr(model.config, "sliding_window", None) is not None and not getattr(args, "sliding_layers", False)


def _torchao_int4(model: Any, group: int) -> Any:
    """A bf16 copy of the model with torchao's int4 weight-only linears (tinygemm takes bf16)."""
    import copy

    import torch

    try:
        from torchao.quantization import quantize_
    except ImportError as error:
        raise _Skip(f"torchao not importable ({error})") from None
    try:
        from torchao.quantization import Int4WeightOnlyConfig

        config: Any = Int4WeightOnlyConfig(group_size=group)
    except ImportError:  # older torchao
        from torchao.quantization import int4_weight_only

        config = int4_weight_only(group_size=group)
    quantized = copy.deepcopy(model).to(torch.bfloat16)
    quantize_(quantized, config)
    return quantized


class _Skip(Exception):
    """A variant that cannot run here (recorded as skipped, not as an error)."""


def compiled_forward(model: Any, variant: str, block_size: int = 32) -> tuple[Callable[..., Any], bool]:
    """The forward a variant runs, and whether it runs under inductor's CUDA graphs (step marks)."""
    import torch

    if variant == "torchao-int4-ro":
        return torch.compile(_torchao_int4(model, block_size).forward, mode="reduce-overhead", fullgraph=True, dynamic=False), True
    if variant.startswith(("graphopt-int8", "graphopt-int4")):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from torch_compile import _ensure_backend_registered

        _ensure_backend_registered()
        weights = {"weights": variant.split("-")[1], "block_size": block_size}
        if variant.endswith("-ro"):
            return torch.compile(model.forward, backend="graphopt", options={"mode": "reduce-overhead", **weights},
                                 fullgraph=True, dynamic=False), True
        return torch.compile(model.forward, backend="graphopt", options={"inductor": False, "mode": "reduce-overhead", **weights},
                             fullgraph=True, dynamic=False), False

    if variant == "eager":
        return model.forward, False
    if variant.startswith("graphopt"):
        # a checkout on PYTHONPATH (the GPU machine) has no entry point: register the backend by name
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from torch_compile import _ensure_backend_registered

        _ensure_backend_registered()
    if variant == "inductor-ro":
        return torch.compile(model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False), True
    if variant == "graphopt":
        return torch.compile(model.forward, backend="graphopt", fullgraph=True, dynamic=False), False
    if variant == "graphopt-ro":
        return torch.compile(model.forward, backend="graphopt", mode="reduce-overhead", fullgraph=True, dynamic=False), True
    if variant == "graphopt-gemv-ro":
        return torch.compile(model.forward, backend="graphopt", options={"mode": "reduce-overhead", "gemv": True},
                             fullgraph=True, dynamic=False), True
    if variant == "graphopt-cg":
        return torch.compile(model.forward, backend="graphopt", options={"inductor": False, "mode": "reduce-overhead"},
                             fullgraph=True, dynamic=False), False
    raise ValueError(variant)


def step_bytes(model: Any, batch: int, prompt: int, new_tokens: int, dtype_bytes: int) -> dict[str, float]:
    """Bytes one decode step must read: every weight, and the key/value cache up to the mean position."""
    cfg = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    window = getattr(cfg, "sliding_window", None) or prompt + new_tokens  # the rows a step reads: up to min(window, position)
    mean_rows = statistics.mean(min(window, prompt + step) for step in range(new_tokens))  # the mean position, as without one
    kv = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * head_dim * mean_rows * dtype_bytes
    return {"weights": float(weights), "kv_cache": float(kv), "total": float(weights + kv)}


def bandwidth(device: str) -> dict[str, Any]:
    """The GPU's spec bandwidth (by name) and a measured device-to-device copy (bytes read + written / s)."""
    import torch

    if not device.startswith("cuda"):
        return {"spec": None, "measured": None, "used": None}
    name = torch.cuda.get_device_name()
    spec = next((bw for key, bw in SPEC_BANDWIDTH if key in name), None)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    timer = Timer(device)
    for _ in range(10):
        with timer:
            dst.copy_(src)
    _sync(device)
    measured = 2 * src.numel() / (statistics.median(timer.times_ms()) / 1e3)
    del src, dst
    return {"spec": spec, "measured": measured, "used": spec or measured}


def run_variant(model: Any, variant: str, batch: int, args: argparse.Namespace, bw: float | None,
                reference: dict[str, Any] | None) -> dict[str, Any]:
    import torch

    from graphopt.torch_backend import clear_reports, torch_reports

    torch._dynamo.reset()
    clear_reports()
    torch.manual_seed(batch)
    ids = torch.randint(0, model.config.vocab_size, (batch, args.prompt), device=args.device)
    max_len = args.prompt + args.new_tokens
    cache = None if variant == "eager" else _static_cache(model, batch, max_len, args.device, _full_cache(model, args))
    forward, mark_step = compiled_forward(model, variant, args.block_size)
    entry: dict[str, Any] = {"variant": variant, "batch": batch}
    t0 = time.perf_counter()
    runs = []
    warmup = min(args.warmup, 1) if variant == "eager" else args.warmup  # nothing to compile or record
    for i in range(warmup + args.runs):
        if cache is not None:
            cache.reset()  # in place: the addresses CUDA graphs captured stay
        result = generate(forward, model, ids, args.new_tokens, cache, args.device, mark_step,
                          gaps=variant == "eager" and i == warmup)
        if i == 0:
            entry["first_generation_s"] = time.perf_counter() - t0  # compiling included
        if i >= warmup:
            runs.append(result)
    if args.profile and args.device == "cuda":
        if cache is not None:
            cache.reset()
        entry["decode_profile"] = profile_decode(forward, model, ids, args.new_tokens, cache, args.device, mark_step, args.profile)
    steps = [t for r in runs for t in r["step_ms"]]
    decode_ms = statistics.median(steps)
    entry.update({
        "decode_ms": decode_ms,
        "decode_p10_ms": statistics.quantiles(steps, n=10)[0] if len(steps) >= 10 else min(steps),
        "decode_p90_ms": statistics.quantiles(steps, n=10)[-1] if len(steps) >= 10 else max(steps),
        "tokens_per_s": batch * 1e3 / decode_ms,
        "prefill_ms": statistics.median(r["prefill_ms"] for r in runs),
    })
    nbytes = step_bytes(model, batch, args.prompt, args.new_tokens, torch.finfo(model.dtype).bits // 8)
    entry["bytes_per_step"] = nbytes
    if bw:
        entry["limit_ms"] = nbytes["total"] / bw * 1e3
        entry["of_limit"] = entry["limit_ms"] / decode_ms
    tokens = runs[0]["tokens"]
    entry["tokens"] = tokens.tolist()
    if variant == "eager":
        entry["gaps"] = runs[0]["gaps"]  # for compare_tokens; written out as its minimum only
    elif reference is not None:
        entry.update(compare_tokens(tokens, reference))
    if variant.startswith("graphopt"):  # the key range each split-K attention of the last graph got (graphopt.ops.fx_key_range)
        from graphopt.torch_backend import last_graph

        graph = last_graph()
        calls = [n for n in graph.graph.nodes if str(n.target) == "graphopt.decode_attention.default"] if graph is not None else []
        entry["decode_attention_windows"] = [n.args[7] if len(n.args) > 7 else None for n in calls]
    reports = torch_reports()
    if reports:
        entry["graphs"] = [{name: s.applications for name, s in r.rules.items() if s.applications} for r in reports]
        entry["warnings"] = sorted({w for r in reports for w in r.warnings})
        weights = [{"graph": i, "site": d.site, "chosen": d.chosen, "reason": d.reason,
                    "measured_ms": {a.candidate: a.measured_ms for a in d.alternatives}}
                   for i, r in enumerate(reports) for d in r.decisions if d.kind == "weights"]
        kernels = [{"graph": i, "site": d.site, "chosen": d.chosen, "reason": d.reason,
                    "measured_ms": {a.candidate: a.measured_ms for a in d.alternatives}}
                   for i, r in enumerate(reports) for d in r.decisions
                   if d.kind == "kernel" and any(a.candidate == "graphopt::gemv_linear" for a in d.alternatives)]
        if kernels:
            entry["gemv_sites"] = kernels
            entry["gemv_kernels"] = {f"graph {i}": dict(sorted(Counter(k["chosen"] for k in kernels if k["graph"] == i).items()))
                                     for i in range(len(reports))}
        if weights:
            entry["weights"] = weights
            entry["weight_forms"] = {f"graph {i}": dict(sorted(Counter(w["chosen"] for w in weights if w["graph"] == i).items()))
                                     for i in range(len(reports))}
    return entry


def profile_decode(forward: Callable[..., Any], model: Any, ids: Any, new_tokens: int, cache: Any, device: str,
                   mark_step: bool, top: int) -> dict[str, Any]:
    """One more generation with the decode steps under torch.profiler: the GPU kernels per decode step (microseconds and
    launches per step, the `top` largest), their sum against the step's wall time (the rest: gaps between kernels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    result = generate(forward, model, ids, new_tokens, cache, device, mark_step, decode_context=prof)
    steps = max(new_tokens - 1, 1)
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        us = float(getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0) or 0.0)
        slot = kernels.setdefault(event.name, [0.0, 0])
        slot[0] += us
        slot[1] += 1
    gpu_us = sum(v[0] for v in kernels.values()) / steps
    wall_ms = statistics.median(result["step_ms"]) if result["step_ms"] else None
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    return {
        "steps": steps, "gpu_us_per_step": gpu_us, "wall_ms_per_step": wall_ms,
        "launches_per_step": sum(v[1] for v in kernels.values()) / steps,
        "kernels": [{"name": name[:160], "us_per_step": v[0] / steps, "launches_per_step": v[1] / steps} for name, v in ranked[:top]],
    }


def compare_tokens(tokens: Any, reference: dict[str, Any]) -> dict[str, Any]:
    import torch

    expected = torch.tensor(reference["tokens"])
    agreement = float((tokens == expected).float().mean())
    differ = (tokens != expected).any(0).nonzero()
    if not len(differ):
        return {"tokens_equal": True, "equal_steps": tokens.shape[1], "token_agreement": agreement}
    step = int(differ[0])
    gap = float(reference["gaps"][:, step].min())
    return {"tokens_equal": False, "equal_steps": step, "token_agreement": agreement,
            "first_difference": f"step {step}: eager's top-2 logit gap {gap:.4f}"}


def table(results: list[dict[str, Any]], gpu: str) -> str:
    lines = [f"GPU: {gpu}",
             f"{'batch':>5s} {'variant':16s} {'decode ms':>10s} {'tok/s':>9s} {'of limit':>9s} {'prefill ms':>11s} {'1st gen s':>9s} {'agree':>6s}  tokens"]
    for e in results:
        if "decode_ms" not in e:
            lines.append(f"{e['batch']:5d} {e['variant']:16s} {e.get('status', '')}")
            continue
        limit = f"{100 * e['of_limit']:8.1f}%" if "of_limit" in e else f"{'':>9s}"
        tokens = "reference" if e["variant"] == "eager" else ("equal" if e.get("tokens_equal") else e.get("first_difference", "?"))
        agree = f"{100 * e['token_agreement']:5.1f}%" if "token_agreement" in e else f"{'':>6s}"
        lines.append(f"{e['batch']:5d} {e['variant']:16s} {e['decode_ms']:10.3f} {e['tokens_per_s']:9.0f} {limit} {e['prefill_ms']:11.2f} "
                     f"{e['first_generation_s']:9.1f} {agree}  {tokens}")
    lines.append("decode ms: median over every timed step; of limit: (weights + KV bytes per step / bandwidth) / decode ms.")
    lines += speedups(results)
    for e in results:
        prof = e.get("decode_profile")
        if not prof:
            continue
        lines.append(f"\n{e['variant']} batch {e['batch']}: kernels per decode step {prof['gpu_us_per_step']:.0f} us "
                     f"({prof['launches_per_step']:.0f} launches) of {1e3 * (prof['wall_ms_per_step'] or 0):.0f} us wall")
        for k in prof["kernels"]:
            lines.append(f"  {k['us_per_step']:8.1f} us  x{k['launches_per_step']:5.1f}  {k['name'][:110]}")
    return "\n".join(lines)


def _fp16_baseline(variant: str) -> str:
    """The fp16 variant a weight-quantized one is compared with: same compile mode."""
    return "graphopt-cg" if variant.endswith("-cg") else "graphopt-ro"


def speedups(results: list[dict[str, Any]]) -> list[str]:
    """Per batch: each weight-quantized variant's decode speed over fp16's in the same mode (fp16 ms / its ms)."""
    lines = []
    for batch in dict.fromkeys(e["batch"] for e in results):
        timed = {e["variant"]: e for e in results if e["batch"] == batch and "decode_ms" in e}
        pairs = [(v, _fp16_baseline(v)) for v in timed if v in WQ_VARIANTS and _fp16_baseline(v) in timed]
        if pairs:
            lines.append(f"batch {batch}, decode speed over fp16 (its ms / the variant's): " + ", ".join(
                f"{v.replace('graphopt-', '').replace('-ro', '').replace('-cg', ' (cg)')}/fp16 "
                f"{timed[base]['decode_ms'] / timed[v]['decode_ms']:.2f}x" for v, base in pairs))
    return lines


def environment(device: str) -> dict[str, Any]:
    import torch
    import transformers

    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__, "platform": platform.platform(), "device": device,
           "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def write_json(data: dict[str, Any], out: str, tiny: bool, family: str = "llama") -> Path:
    folder = Path(out).is_dir() or out.endswith(("/", os.sep))
    name = f"llm_decode{'' if family == 'llama' else '-' + family}{'-tiny' if tiny else ''}.json"
    path = Path(out) / name if folder else Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    results = [{k: v for k, v in e.items() if k != "gaps"} for e in data["results"]]  # the gaps' minimum is kept
    staged.write_text(json.dumps({**data, "results": results}, indent=2, default=str))
    os.replace(staged, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=None, help=f"comma-separated: {', '.join(VARIANTS + WQ_VARIANTS + GEMV_VARIANTS)} "
                        "(default: the first five; eager,graphopt-cg with --tiny)")
    parser.add_argument("--block-size", type=int, default=32, choices=(32, 64, 128), help="quantization block of the int8/int4 variants")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8; 1,2 with --tiny)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 128; 8 with --tiny)")
    parser.add_argument("--new-tokens", type=int, default=None, help="greedy tokens (default 128; 8 with --tiny)")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--tiny", action="store_true", help="a tiny LlamaConfig (a smoke test, fp32 on the CPU)")
    parser.add_argument("--family", default="llama", choices=FAMILIES,
                        help="the decoder family (tests/llm_families.py): its traits at the TinyLlama size (or tiny)")
    parser.add_argument("--window", type=int, default=None, help="the sliding window of a family that has one (mistral)")
    parser.add_argument("--sliding-layers", action="store_true",
                        help="a sliding-window family's static cache as transformers makes it (rolled window-sized layers; "
                             "recompiles every step: see above), not a row per position with the window a mask over it")
    parser.add_argument("--warmup", type=int, default=2, help="untimed generations first (compiling, CUDA-graph recording)")
    parser.add_argument("--runs", type=int, default=3, help="timed generations")
    parser.add_argument("--budget-s", type=float, default=150.0, help="start no (batch, variant) after this many seconds")
    parser.add_argument("--profile", type=int, default=0, metavar="TOP",
                        help="CUDA: profile one more generation's decode steps, keep the TOP kernels by time per step")
    parser.add_argument("--out", default=None, help="JSON file, or a folder (default: $OUT when set)")
    args = parser.parse_args(argv)

    if str(REPO) not in sys.path:  # run as a script: graphopt from this checkout
        sys.path.insert(0, str(REPO))
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    variants = [v for v in (args.variants or ("eager,graphopt-cg" if args.tiny else ",".join(VARIANTS))).split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS + WQ_VARIANTS + GEMV_VARIANTS]
    if unknown:
        parser.error(f"unknown variant: {', '.join(unknown)} (known: {', '.join(VARIANTS + WQ_VARIANTS + GEMV_VARIANTS)})")
    try:
        batches = [int(b) for b in (args.batches or ("1,2" if args.tiny else "1,8")).split(",") if b]
    except ValueError:
        parser.error(f"--batches takes comma-separated ints, not {args.batches!r}")
    args.prompt = args.prompt if args.prompt is not None else (8 if args.tiny else 128)
    args.new_tokens = args.new_tokens if args.new_tokens is not None else (8 if args.tiny else 128)
    if min(batches, default=0) < 1 or args.prompt < 1 or args.new_tokens < 2 or args.runs < 1 or args.warmup < 0:
        parser.error("batches and --prompt must be >= 1, --new-tokens >= 2, --runs >= 1, --warmup >= 0")
    if args.window is not None and (args.window < 1 or getattr(llama_config(True, args.family), "sliding_window", None) is None):
        parser.error(f"--window takes a window >= 1 for a family with a sliding window (mistral), not {args.window} for {args.family}")
    if "eager" in variants:  # the reference first
        variants = ["eager"] + [v for v in variants if v != "eager"]
    out = args.out or os.environ.get("OUT")

    started = time.perf_counter()
    dtype = torch.float16 if args.device.startswith("cuda") and not args.tiny else torch.float32
    model = build_model(args.tiny, args.device, dtype, args.family, args.window)
    bw = bandwidth(args.device)
    env = environment(args.device)
    print(f"GPU: {env['gpu']}; bandwidth spec {bw['spec']}, measured copy {bw['measured']}", flush=True)
    results: list[dict[str, Any]] = []
    data = {"benchmark": "llm_decode", "environment": env, "bandwidth": bw, "settings": {
        "tiny": args.tiny, "dtype": str(dtype), "batches": batches, "prompt": args.prompt, "new_tokens": args.new_tokens,
        "warmup": args.warmup, "runs": args.runs, "variants": variants, "budget_s": args.budget_s,
        "family": args.family, "window": args.window,
        "cache": "sliding layers" if args.sliding_layers else "a row per position", "config": llama_config(args.tiny, args.family, args.window).to_dict()},
        "results": results}
    for batch in batches:
        reference = None
        for variant in variants:
            if time.perf_counter() - started > args.budget_s:
                results.append({"variant": variant, "batch": batch, "status": f"skipped: past the {args.budget_s:.0f} s budget"})
                continue
            try:
                entry = run_variant(model, variant, batch, args, bw["used"], reference)
                entry["status"] = "ok"
            except _Skip as why:
                entry = {"variant": variant, "batch": batch, "status": f"skipped: {why}"}
            except Exception as error:  # one variant failing must not stop the others
                traceback.print_exc()
                first = (str(error).strip().splitlines() or [""])[0]
                entry = {"variant": variant, "batch": batch, "status": f"error: {type(error).__name__}: {first}"[:300]}
            if variant == "eager" and "tokens" in entry:
                reference = entry
                entry["min_top2_gap"] = float(entry["gaps"].min())
            results.append(entry)
            short = {k: entry[k] for k in ("decode_ms", "tokens_per_s", "prefill_ms", "tokens_equal", "token_agreement", "weight_forms", "gemv_kernels",
                                           "decode_attention_windows", "status") if k in entry}
            print(f"batch {batch} {variant}: {short}", flush=True)
            if out:  # after every variant: a run stopped by a time limit keeps what it measured
                data["total_s"] = time.perf_counter() - started
                path = write_json(data, out, args.tiny, args.family)
    if out:
        print(f"wrote {path}")
    print()
    print(table(results, env["gpu"]))
    failed = [f"{e['batch']}/{e['variant']}" for e in results if str(e.get("status", "")).startswith("error")]
    differ = [f"{e['batch']}/{e['variant']}" for e in results if e.get("tokens_equal") is False]
    if differ:
        print(f"tokens differ from eager: {', '.join(differ)}")
    if failed:
        print(f"not ok: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
