"""What graphopt's LLM rewrites do on each decoder family (issue 17), on both paths, on the CPU.

The families are tests/llm_families.py's tiny configs (2 layers, random weights): llama (the
config the rewrites were developed on), llama3, qwen2, mistral, phi3, gemma.

ONNX: each family's decoder stack (no LM head) exported by torch.onnx's dynamo exporter with a
DynamicCache (tests/architectures.py: "<family>-kv" with an attention_mask input, "<family>-kv-causal"
without, as benchmarks/llm_onnx_decode.py exports it), then graphopt for ort-cpu (the export with the
mask, the cache as it grows) and for ort-cuda (the causal export in float16, "-kv-causal-fp16",
--kv-buffer shared: the only way GroupQueryAttention is written there). Counted: GroupQueryAttention (and with do_rotary), SkipSimplifiedLayerNormalization,
SimplifiedLayerNormalization, RotaryEmbedding, MultiHeadAttention, a packed QKV (GroupQueryAttention
without separate key / value), FastGelu / Gelu; the near-misses of the LLM rules that did not
fire. Equal: a prefill of 6 tokens and 4 one-token steps at batch 2 in onnxruntime's CPU provider
(graph optimizations off), each step's outputs against the export's (ort-cpu: presents fed back;
ort-cuda, fp16, shared buffer: one max-length buffer per past/present, at batch 1: the CPU kernel
prefills over a shared buffer only there).

torch: the family's CausalLM over a StaticCache, forward compiled with backend="graphopt",
options={"inductor": False} (graphopt's own kernels; CPU references), prefill of 8 and 5 decode
steps at batch 2: the rule applications on the decode step's graph, and greedy tokens against eager.

    PYTHONPATH=$PWD python benchmarks/llm_family_survey.py [--families llama,qwen2] [--paths onnx,torch] [--out DIR]

Output: a markdown table per path, JSON at --out (or $OUT) as llm_family_survey.json.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

FAMILIES = ("llama", "llama3", "qwen2", "mistral", "phi3", "gemma")
#: ONNX rows beyond the families' own exports: Mistral with a cache that keeps every token (transformers' own
#: DynamicCache crops a sliding-window layer's to window - 1 tokens in the graph: graphopt/passes/sliding_window_cache.py
#: proves the crop idle for a growing cache; a shared buffer keeps it, the reason in the table)
ONNX_EXTRA = {"mistral-full": ("mistral", "-full")}
#: the LLM rules whose near-misses the table reports where they did not fire
LLM_RULES = ("FuseGroupQueryAttention", "FoldRotaryIntoGroupQueryAttention", "FuseRotaryEmbedding", "FuseAttention",
             "FuseRMSNorm", "FuseRMSNormUpcast", "FuseRMSNormDowncast", "FuseSkipRMSNorm", "FuseSwiGLU", "FuseGatedGelu", "FuseGeGLU", "FuseGroupedKV",
             "FuseScaledDotProductAttention")
ONNX_COUNTS = {"GQA": "com.microsoft.GroupQueryAttention", "SkipSLN": "com.microsoft.SkipSimplifiedLayerNormalization",
               "SLN": "SimplifiedLayerNormalization", "Rotary": "com.microsoft.RotaryEmbedding",
               "MHA": "com.microsoft.MultiHeadAttention", "FastGelu": "com.microsoft.FastGelu", "Gelu": "Gelu",
               "Softmax": "Softmax"}
BATCH = 2


def _ops(model: Any) -> Counter[str]:
    return Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in model.graph.node)


def _misses(report: Any, rules: tuple[str, ...] = LLM_RULES) -> dict[str, str]:
    """The deepest near-miss of each listed rule that was tried and never applied."""
    out = {}
    for name in rules:
        stats = report.rules.get(name)
        if stats is not None and not stats.applications and stats.near_misses:
            reason = stats.near_misses[0].reason
            if "has no lowering for" not in reason:  # a rule for the other path (SwiGLU on onnxruntime)
                out[name] = reason
    return out


def onnx_family(family: str, suffix: str = "") -> dict[str, Any]:
    import onnx
    from architectures import build
    from llm_families import config, max_step_difference

    import graphopt

    vocab = config(family).vocab_size
    entry: dict[str, Any] = {"family": family + suffix}
    # ort-cuda has no float32 GroupQueryAttention: the model in fp16 there, as benchmarks/llm_onnx_decode.py
    # exports it for the GPU (and without an attention_mask input: the CUDA kernel takes no padding mask)
    for target, kv_buffer, name in (("ort-cpu", "growing", f"{family}-kv{suffix}"), ("ort-cuda", "shared", f"{family}-kv-causal-fp16{suffix}")):
        path, _ = build(name, "dynamo")
        model = onnx.load(str(path))
        optimized, report = graphopt.optimize(model, target=target, kv_buffer=kv_buffer)
        ops = _ops(optimized)
        counts = {short: ops[op] for short, op in ONNX_COUNTS.items()}
        gqa = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
        counts["GQA rotary"] = sum(any(a.name == "do_rotary" and a.i == 1 for a in n.attribute) for n in gqa)
        counts["GQA packed"] = sum(len(n.input) > 2 and n.input[1] == "" for n in gqa)
        counts["GQA window"] = sum(any(a.name == "local_window_size" and a.i > 0 for a in n.attribute) for n in gqa)
        # a pass's refusal (the sliding-window cache crop kept for a shared buffer) says why before the rules' near-misses
        kept = [w.split(": ", 1)[1] for w in report.warnings if w.startswith("sliding-window cache crop")]
        result: dict[str, Any] = {"counts": counts, "applied": {n: s.applications for n, s in report.rules.items() if s.applications},
                                  "misses": ({"sliding_window_cache": kept[0]} if kept else {}) | _misses(report)}
        try:
            # the shared buffer is written only with GroupQueryAttention; without it the cache grows as exported
            result["max_diff"] = max_step_difference(model, optimized, vocab, shared=kv_buffer == "shared" and bool(gqa))
        except Exception as error:  # noqa: BLE001  (a survey: the failure is the finding)
            result["max_diff"] = None
            result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        entry[target] = result
    return entry


def torch_family(family: str, prompt: int = 8, new_tokens: int = 6, cache_len: int = 32, half: bool = False) -> dict[str, Any]:
    """The decode step's rewrites and greedy tokens against eager (`half`: the model in float16, as on a GPU)."""
    import torch
    import transformers
    from llm_families import config, model_class

    from graphopt import torch_backend

    _GEMMS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.matmul.default)
    torch.manual_seed(0)
    model = getattr(transformers, model_class(family))(config(family)).eval()
    with torch.no_grad():  # a visible (1 + weight) and biases: the zero / one inits would hide a wrong fold
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model = model.half() if half else model
    ids = torch.randint(0, model.config.vocab_size, (BATCH, prompt))
    key = "cache" if "cache" in __import__("inspect").signature(type(model).forward).parameters else "past_key_values"

    def greedy(forward: Any) -> tuple[Any, Any]:
        cache = transformers.StaticCache(config=model.config, max_cache_len=cache_len)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = forward(input_ids=ids, cache_position=torch.arange(prompt), use_cache=True, **{key: cache})
            tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
            for step in range(new_tokens - 1):
                out = forward(input_ids=tokens[-1], cache_position=torch.tensor([prompt + step]), use_cache=True, **{key: cache})
                tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat(tokens, 1), out.logits

    expected, expected_logits = greedy(model.forward)
    torch._dynamo.reset()
    torch_backend.clear_reports()
    got, logits = greedy(torch.compile(model.forward, backend="graphopt", fullgraph=True, options={"inductor": False}))
    reports = torch_backend.torch_reports()
    graphs = [{n: s.applications for n, s in r.rules.items() if s.applications} for r in reports]
    calls: Counter[str] = Counter()
    decode = torch_backend.last_graph()
    if decode is not None:  # graphopt's ops, and the GEMMs (q/k/v and gate/up packed: fx_pack)
        calls = Counter(str(n.target) for n in decode.graph.nodes if n.op == "call_function"
                        and (str(n.target).startswith("graphopt.") or n.target in _GEMMS))
    return {"family": family, "graphs": graphs, "decode_misses": _misses(reports[-1]) if reports else {},
            "decode_calls": dict(calls), "tokens_equal": bool(torch.equal(got, expected)),
            "logits_max_diff": float((logits - expected_logits).abs().max()), "warnings": sorted({w for r in reports for w in r.warnings})}


def onnx_table(entries: list[dict[str, Any]]) -> str:
    cols = ["GQA", "GQA rotary", "GQA packed", "GQA window", "SkipSLN", "SLN", "Rotary", "MHA", "Softmax", "FastGelu"]
    lines = ["| family | target | " + " | ".join(cols) + " | max diff (CPU EP, 5 steps) | not fired (first near-miss) |",
             "|---|---|" + "---|" * (len(cols) + 2)]
    for e in entries:
        for target in ("ort-cpu", "ort-cuda"):
            r = e.get(target)
            if r is None:
                lines.append(f"| {e['family']} | {target} | error: {e.get('error', '?')} |")
                continue
            diff = f"{r['max_diff']:.1e}" if r.get("max_diff") is not None else f"error: {r.get('error')}"
            misses = "; ".join(f"{k}: {v[:110]}" for k, v in r["misses"].items())
            lines.append(f"| {e['family']} | {target} | " + " | ".join(str(r["counts"][c]) for c in cols) + f" | {diff} | {misses} |")
    return "\n".join(lines)


def torch_table(entries: list[dict[str, Any]]) -> str:
    rules = ["FuseRMSNorm", "FuseRMSNormUpcast", "FuseRMSNormDowncast", "FuseSkipRMSNorm", "FuseRotaryEmbedding", "FuseScaledDotProductAttention",
             "FuseGroupedKV", "FuseSwiGLU", "FuseGatedGelu"]
    lines = ["| family | " + " | ".join(rules) + " | GEMMs (matmul + addmm) | tokens = eager | not fired (first near-miss) |",
             "|---|" + "---|" * (len(rules) + 3)]
    for e in entries:
        if "graphs" not in e:
            lines.append(f"| {e['family']} | error: {e.get('error', '?')} |")
            continue
        decode = e["graphs"][-1] if e["graphs"] else {}
        misses = "; ".join(f"{k}: {v[:110]}" for k, v in e["decode_misses"].items())
        gemms = sum(e["decode_calls"].get(f"aten.{g}.default", 0) for g in ("mm", "addmm", "matmul"))
        lines.append(f"| {e['family']} | " + " | ".join(str(decode.get(r, 0)) for r in rules) + f" | {gemms} | {e['tokens_equal']} | {misses} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--paths", default="onnx,torch")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        print(f"error: unknown families {', '.join(unknown)} (known: {', '.join(FAMILIES)})", file=sys.stderr)
        return 2
    paths = set(args.paths.split(","))
    warnings.simplefilter("ignore")
    data: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.platform(),
                            "command": " ".join(["python", "benchmarks/llm_family_survey.py", *(argv or sys.argv[1:])]), "onnx": [], "torch": []}
    for family in families:
        for path, fn in (("onnx", onnx_family), ("torch", torch_family)):
            if path not in paths:
                continue
            try:
                data[path].append(fn(family))
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                data[path].append({"family": family, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"})
            print(f"{family} {path} done", file=sys.stderr, flush=True)
    for row, (family, suffix) in ONNX_EXTRA.items():
        if "onnx" in paths and family in families:
            data["onnx"].append(onnx_family(family, suffix))
            print(f"{row} onnx done", file=sys.stderr, flush=True)
    if data["onnx"]:
        print(onnx_table(data["onnx"]) + "\n")
    if data["torch"]:
        print(torch_table(data["torch"]))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "llm_family_survey.json").write_text(json.dumps(data, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
