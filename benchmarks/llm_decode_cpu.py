"""Weight-only int8/int4 decode on the CPU, torch path (issue 18): graphopt against fp32 and torchao.

A LLaMA decoder built from a config with random weights (--size small: hidden 512, 4 layers,
8 heads, 2 key/value heads, intermediate 1408, vocab 32000, an untied LM head: the model of
llm_genai_int4.py; medium: hidden 1024, 8 layers, 16/4 heads, intermediate 2816), a static
cache, a random prompt, then greedy decode. Variants, each compiled with fullgraph=True after
torch._dynamo.reset():

  eager            the model as it is (the token reference)
  inductor         torch.compile, inductor, fp32
  graphopt         backend="graphopt", fp32
  graphopt-int8    options={"weights": "int8"}: per layer the form timed fastest at compile time
  graphopt-int4    options={"weights": "int4", "block_size": --block-size}  (CPU forms: int8pack,
                   int4pack or the fp32 matmul: graphopt/passes/fx_weight_quant_forms.py)
  graphopt-int4-head, graphopt-int8-head   the same with weights_keep=[] (the LM head quantized
                   too, as torchao and the onnxruntime-genai builder do; graphopt keeps it by default)
  inductor-bf16    a bf16 copy of the model under inductor (torchao's activation type)
  torchao-int8     torchao's Int8WeightOnlyConfig on the bf16 copy, then inductor
  torchao-int4     torchao's CPU int4 (PrototypeInt4WeightOnlyConfig, group --block-size: the same
                   tinygemm CPU kernel as graphopt's int4pack) on the bf16 copy, then inductor
                   (both quantize every Linear, the LM head included)

Timing: one torch thread, and each decode step timed by the calling thread's CPU clock
(time.thread_time: with one thread the model runs in it, so what other jobs take from a shared
core is not counted); the median step over --runs generations after one warm-up generation.
Tokens: the fraction of greedy tokens equal to eager's over the run, and the first step that
differs (random weights give near-flat logits: greedy paths part at the first near-tie), plus
the teacher-forced logits' cosine against eager's (every variant fed eager's tokens).

    python benchmarks/llm_decode_cpu.py --out benchmarks/results/llm_decode_cpu.json
    python benchmarks/llm_decode_cpu.py --variants eager,graphopt,graphopt-int4 --size small --runs 2
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("eager", "inductor", "graphopt", "graphopt-int8", "graphopt-int4", "graphopt-int8-head", "graphopt-int4-head",
            "inductor-bf16", "torchao-int8", "torchao-int4")
SIZES = {"tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128),
         "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1408),
         "medium": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816)}


class Skip(Exception):
    """A variant that cannot run here (torchao not importable)."""


def build_model(size: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    vocab = 256 if size == "tiny" else 32000  # tiny: the tests' smoke run
    cfg = transformers.LlamaConfig(vocab_size=vocab, max_position_embeddings=1024, tie_word_embeddings=False, **SIZES[size])
    return transformers.LlamaForCausalLM(cfg).eval()


def _torchao(model: Any, variant: str, group: int) -> Any:
    import torch

    try:
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as error:
        raise Skip(f"torchao not importable ({error})") from None
    quantized = copy.deepcopy(model).to(torch.bfloat16)
    quantize_(quantized, Int8WeightOnlyConfig() if variant == "torchao-int8" else PrototypeInt4WeightOnlyConfig(group_size=group))
    return quantized


def prepare(model: Any, variant: str, group: int) -> tuple[Any, Any]:
    """(the model the variant runs, its forward)."""
    import torch

    if variant == "eager":
        return model, model.forward
    if variant.startswith("graphopt"):
        sys.path.insert(0, str(REPO / "benchmarks"))
        from torch_compile import _ensure_backend_registered

        _ensure_backend_registered()
        options: dict[str, Any] = {}
        if "-int" in variant:
            options = {"weights": variant.split("-")[1], "block_size": group}
            if variant.endswith("-head"):
                options["weights_keep"] = []
        return model, torch.compile(model.forward, backend="graphopt", options=options, fullgraph=True, dynamic=False)
    if variant == "inductor":
        return model, torch.compile(model.forward, fullgraph=True, dynamic=False)
    runs = copy.deepcopy(model).to(torch.bfloat16) if variant == "inductor-bf16" else _torchao(model, variant, group)
    return runs, torch.compile(runs.forward, fullgraph=True, dynamic=False)


def generate(forward: Any, model: Any, ids: Any, new_tokens: int, forced: Any = None) -> dict[str, Any]:
    """Greedy decode over a fresh StaticCache: tokens, each step's thread CPU ms, each step's last logits
    (float32); `forced`: feed these tokens instead (teacher forcing)."""
    import inspect

    import torch
    import transformers

    prompt = ids.shape[1]
    cache = transformers.StaticCache(config=model.config, max_cache_len=prompt + new_tokens)
    # transformers 5.2x renamed past_key_values to cache (the old name warns)
    key = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    tokens, logits, steps = [], [], []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = forward(input_ids=ids, cache_position=torch.arange(prompt), use_cache=True, **{key: cache})
        for step in range(new_tokens):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
            logits.append(out.logits[:, -1].float())
            if step == new_tokens - 1:
                break
            fed = token if forced is None else forced[:, step:step + 1]
            t0 = time.thread_time()
            out = forward(input_ids=fed, cache_position=torch.tensor([prompt + step]), use_cache=True, **{key: cache})
            steps.append((time.thread_time() - t0) * 1e3)
    return {"tokens": torch.cat(tokens, 1), "logits": torch.stack(logits, 1), "step_ms": steps}


def run_variant(model: Any, variant: str, args: argparse.Namespace, reference: dict[str, Any] | None) -> dict[str, Any]:
    import torch

    from graphopt.torch_backend import clear_reports, torch_reports

    torch._dynamo.reset()
    clear_reports()
    ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    runs_model, forward = prepare(model, variant, args.block_size)
    first = generate(forward, runs_model, ids, args.new_tokens)  # compiles
    entry: dict[str, Any] = {"variant": variant, "first_generation_s": time.perf_counter() - t0}
    timed = [generate(forward, runs_model, ids, args.new_tokens) for _ in range(args.runs)]
    steps = [ms for r in timed for ms in r["step_ms"]]
    entry.update({"decode_ms": statistics.median(steps), "decode_p10_ms": statistics.quantiles(steps, n=10)[0],
                  "decode_p90_ms": statistics.quantiles(steps, n=10)[-1], "step_ms_per_run": [statistics.median(r["step_ms"]) for r in timed]})
    tokens = first["tokens"]
    entry["tokens"] = tokens.tolist()
    if reference is not None:
        expected = reference["tokens_tensor"]
        differ = (tokens != expected).any(0).nonzero()
        entry["token_agreement"] = float((tokens == expected).float().mean())
        entry["equal_steps"] = int(differ[0]) if len(differ) else tokens.shape[1]
        forced = generate(forward, runs_model, ids, args.new_tokens, forced=expected)
        cosine = torch.nn.functional.cosine_similarity(forced["logits"][0], reference["logits"][0], dim=-1)
        entry["logits_cosine_min"], entry["logits_cosine_median"] = float(cosine.min()), float(cosine.median())
        entry["teacher_forced_top1"] = float((forced["logits"].argmax(-1) == reference["logits"].argmax(-1)).float().mean())
    else:
        entry["tokens_tensor"], entry["logits"] = tokens, first["logits"]
    weights = [(i, d) for i, r in enumerate(torch_reports()) for d in r.decisions if d.kind == "weights"]
    if weights:
        entry["weight_forms"] = {f"graph {g}": dict(sorted(Counter(d.chosen for i, d in weights if i == g).items()))
                                 for g in sorted({i for i, _ in weights})}
        entry["weights"] = [{"graph": i, "site": d.site, "chosen": d.chosen, "reason": d.reason,
                             "measured_ms": {a.candidate: a.measured_ms for a in d.alternatives}} for i, d in weights]
    entry["bytes"] = sum(t.numel() * t.element_size() for t in [*runs_model.parameters(), *runs_model.buffers()])
    return entry


def table(results: list[dict[str, Any]]) -> str:
    base = next((e["decode_ms"] for e in results if e["variant"] == "inductor" and "decode_ms" in e), None)
    lines = [f"{'variant':20s} {'decode ms':>10s} {'vs inductor':>11s} {'agree':>6s} {'cos min':>8s} {'top-1 tf':>8s}  forms (decode graph)"]
    for e in results:
        if "decode_ms" not in e:
            lines.append(f"{e['variant']:20s} {e.get('status', '')}")
            continue
        ratio = f"{e['decode_ms'] / base:10.3f}x" if base else f"{'':>11s}"
        agree = f"{100 * e['token_agreement']:5.1f}%" if "token_agreement" in e else "  ref "
        cos = f"{e['logits_cosine_min']:8.5f}" if "logits_cosine_min" in e else f"{'':>8s}"
        top1 = f"{100 * e['teacher_forced_top1']:7.1f}%" if "teacher_forced_top1" in e else f"{'':>8s}"
        forms = list(e.get("weight_forms", {}).values())
        lines.append(f"{e['variant']:20s} {e['decode_ms']:10.3f} {ratio} {agree} {cos} {top1}  {forms[-1] if forms else ''}")
    lines.append("decode ms: median thread CPU time of a decode step, one torch thread; vs inductor: fp32 inductor = 1.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--size", default="small", choices=tuple(SIZES))
    parser.add_argument("--block-size", type=int, default=32, choices=(32, 64, 128))
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="timed generations per variant")
    parser.add_argument("--out", default=None, help="JSON file")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant: {', '.join(unknown)}")
    variants = ["eager"] + [v for v in variants if v != "eager"]  # the token reference first
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import torch

    torch.set_num_threads(1)
    model = build_model(args.size)
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
           "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "threads": 1,
           "cpu_model": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                              if line.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None}
    try:
        import torchao

        env["torchao"] = torchao.__version__
    except ImportError:
        env["torchao"] = None
    results: list[dict[str, Any]] = []
    reference = None
    for variant in variants:
        try:
            entry = run_variant(model, variant, args, reference)
            entry["status"] = "ok"
        except Skip as why:
            entry = {"variant": variant, "status": f"skipped: {why}"}
        if variant == "eager":
            reference = entry
        results.append(entry)
        print(f"{variant}: " + ", ".join(f"{k} {entry[k]}" for k in ("decode_ms", "token_agreement", "logits_cosine_min", "weight_forms", "status")
                                         if k in entry), flush=True)
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"benchmark": "llm_decode_cpu", "environment": env, "settings": {**vars(args), "variants": variants},
                "results": [{k: v for k, v in e.items() if k not in ("tokens_tensor", "logits")} for e in results]}
        staged = path.with_name(f".{path.name}.tmp")
        staged.write_text(json.dumps(data, indent=2, default=str))
        os.replace(staged, path)
        print(f"wrote {path}")
    print()
    print(f"CPU: {env['cpu_model']}, torch {env['torch']}, torchao {env['torchao']}, size {args.size}, block {args.block_size}")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
