"""Per-model accuracy of graphopt's low-precision forms (issue 18 item 4): logits cosine and greedy-token
agreement over --steps decode steps (default 128) of a LLaMA-shaped decoder, each variant against the
reference in the model's own type (fp32 on the CPU, fp16 on CUDA).

Model: random weights (seed 0), transformers.LlamaConfig: by default 2 layers, hidden 256, 4 heads (2
key/value heads), intermediate 512, vocab 1000 (runs on the CPU in seconds); --tinyllama: the
TinyLlama-1.1B shape of benchmarks/llm_decode.py (for the GPU).

Variants (--variants, comma-separated):
  fp16 / bf16   the eager model cast to that type (on the CPU: against fp32)
  int8, int4    torch.compile(backend="graphopt", options={"weights": ..., "block_size": --block-size}),
                graphopt's weight-only path (inductor off on the CPU: it compiles C++ here), with the forms'
                timing pinned so that every eligible layer is quantized (graphopt otherwise keeps a layer
                in full precision where it times the quantized forms no faster: this measures accuracy)
  fp8           options={"precision": "fp8"} (CUDA with compute capability >= 8.9 only)
  identity      the reference model itself, compiled by graphopt without quantization (a check:
                cosine 1, agreement 100 %)
  onnx, onnx-int8, onnx-int4
                the ONNX path (CPU, fp32 only): the model exported by torch.onnx (input_ids -> logits, no
                KV cache), graphopt.optimize_file for ort-cpu, with --weights int8|int4 for the last two
                (MatMulNBits), run in onnxruntime's CPU provider; teacher forcing is one run over the
                prompt and the reference's tokens, free-running one run per step over the growing sequence

Each variant decodes twice from the same random prompt (--prompt tokens), through a StaticCache one
token a step, greedily:
  teacher-forced  fed the reference's tokens, so every step's logits are compared (not only until the
                  first difference): per step the cosine of the logits with the reference's (min,
                  median), and the top-1 agreement rate; also the agreement on the "decided" steps
                  only, where the reference's top-2 logit gap exceeds --min-gap (random weights make
                  the logits nearly flat, so many steps are near-ties that any rounding flips)
  free-running    fed its own tokens: the first step whose token differs from the reference's (None:
                  none did), the reference's top-2 logit gap at that step, and the share of equal tokens.

Writes a JSON (--out: a file or a folder; default benchmarks/results/) and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("identity", "fp16", "bf16", "int8", "int4", "fp8", "onnx", "onnx-int8", "onnx-int4")
DEFAULT_MIN_GAP = 0.05


def small_config() -> Any:
    import transformers

    return transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                    intermediate_size=512, vocab_size=1000, max_position_embeddings=512)


def build_model(tinyllama: bool, device: str, dtype: Any) -> Any:
    import torch
    import transformers
    from llm_decode import llama_config

    torch.manual_seed(0)
    cfg = llama_config(tiny=False) if tinyllama else small_config()
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def decode(forward: Callable[..., Any], model: Any, prompt: Any, steps: int, forced: Any = None, cache: Any = None) -> tuple[Any, Any]:
    """Greedy decode through a StaticCache: (tokens [steps], logits [steps, vocab] float32 on the CPU);
    logits[i] is the distribution token i was chosen from. With `forced` ([steps] tokens), step i+1
    is fed forced[i] instead of the argmax (teacher forcing). A `cache` given is reset and reused (the
    compiled graph's guards then hold: no second compile)."""
    import torch
    from llm_decode import _cache_kwarg, _static_cache

    device = prompt.device
    length = prompt.shape[1]
    if cache is None:
        cache = _static_cache(model, 1, length + steps, str(device))
    cache.reset()
    key = _cache_kwarg(model)
    tokens, logits = [], []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = forward(input_ids=prompt, cache_position=torch.arange(length, device=device), use_cache=True, **{key: cache})
        for step in range(steps):
            last = out.logits[0, -1].float()
            logits.append(last.cpu())
            tokens.append(int(last.argmax()))
            if step == steps - 1:
                break
            fed = tokens[-1] if forced is None else int(forced[step])
            out = forward(input_ids=torch.tensor([[fed]], device=device), cache_position=torch.tensor([length + step], device=device),
                          use_cache=True, **{key: cache})
    return torch.tensor(tokens), torch.stack(logits)


def top2_gap(logits: Any) -> Any:
    """Per row: the largest logit minus the second largest."""
    values = logits.float().topk(2, dim=-1).values
    return values[..., 0] - values[..., 1]


def compare(reference_logits: Any, forced_logits: Any, free_tokens: Any, min_gap: float = DEFAULT_MIN_GAP) -> dict[str, Any]:
    """The accuracy figures of one variant (see the module's doc). `reference_logits` [steps, vocab]
    (the reference's free-running decode: its tokens are their argmax), `forced_logits` the variant's
    teacher-forced ones, `free_tokens` [steps] the variant's free-running tokens."""
    import torch

    reference_tokens = reference_logits.argmax(-1)
    cosine = torch.nn.functional.cosine_similarity(forced_logits.double(), reference_logits.double(), dim=-1)
    agree = forced_logits.argmax(-1) == reference_tokens
    gaps = top2_gap(reference_logits)
    decided = gaps > min_gap
    equal = free_tokens == reference_tokens
    first = int((~equal).nonzero()[0, 0]) if not bool(equal.all()) else None
    return {
        "steps": int(reference_logits.shape[0]),
        "cosine_min": float(cosine.min()),
        "cosine_median": float(cosine.median()),
        "top1_agreement": float(agree.double().mean()),
        "min_gap": min_gap,
        "decided_steps": int(decided.sum()),
        "top1_agreement_decided": float(agree[decided].double().mean()) if bool(decided.any()) else None,
        "reference_gap_median": float(gaps.median()),
        "max_abs_logit_error": float((forced_logits - reference_logits).abs().max()),
        "free_first_divergence": first,
        "free_gap_at_divergence": None if first is None else float(gaps[first]),
        "free_token_agreement": float(equal.double().mean()),
    }


@contextlib.contextmanager
def every_layer_quantized() -> Iterator[None]:
    """The weight forms' timing pinned: every quantized form "faster" than the matmul, so each eligible layer is
    quantized (the first form listed runs) and its accuracy measured; the clock restored after."""
    from graphopt.passes import fx_weight_quant_forms

    saved = fx_weight_quant_forms.TIMER
    fx_weight_quant_forms.TIMER = lambda name, fn: 2.0 if name == "unquantized" else 1.0
    fx_weight_quant_forms._TIMES.clear()
    try:
        yield
    finally:
        fx_weight_quant_forms.TIMER = saved
        fx_weight_quant_forms._TIMES.clear()


def variant_forward(model: Any, variant: str, args: argparse.Namespace) -> tuple[Any, Callable[..., Any]]:
    """(the model the variant runs, its forward)."""
    import torch

    if variant in ("fp16", "bf16"):
        cast = model.to(torch.float16 if variant == "fp16" else torch.bfloat16)
        return cast, cast.forward
    options: dict[str, Any] = {"inductor": args.inductor}
    if variant in ("int8", "int4"):
        options.update(weights=variant, block_size=args.block_size)
    elif variant == "fp8":
        options.update(precision="fp8")
    elif variant != "identity":
        raise ValueError(variant)
    return model, torch.compile(model.forward, backend="graphopt", fullgraph=True, options=options)


def weight_summary() -> dict[str, Any] | None:
    """The last compiled graph's weight_quantization (per-layer SNR, forms, kept layers), short."""
    from graphopt import torch_backend

    report = torch_backend.last_report()
    summary = getattr(report, "weight_quantization", None)
    if summary is None:
        return None
    snrs = [layer.snr_db for layer in summary.layers if layer.quantized and layer.snr_db is not None]
    return {"quantized": summary.quantized, "kept": [f"{layer.node}: {layer.reason}" for layer in summary.layers if not layer.quantized],
            "snr_db_min": min(snrs) if snrs else None, "snr_db_median": statistics.median(snrs) if snrs else None,
            "forms": sorted({layer.layer_form for layer in summary.layers if layer.quantized})}


def export_logits(model: Any, path: Path) -> None:
    """The causal LM as ONNX: input_ids [1, seq] -> logits [1, seq, vocab] (no cache)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any) -> Any:
            return self.model(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits().eval(), (ids,), str(path), dynamo=True, input_names=["input_ids"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {1: torch.export.Dim("seq", min=2, max=4096)}}, optimize=True)


def onnx_decode(variant: str, args: argparse.Namespace, reference_logits: Any, prompt: Any, folder: Path) -> tuple[Any, Any, Any]:
    """(teacher-forced logits, free-running tokens, graphopt's report) of an ONNX variant."""
    import numpy as np
    import onnxruntime as ort
    import torch

    import graphopt

    source = folder / "export.onnx"
    if not source.exists():
        export_logits(build_model(args.tinyllama, "cpu", torch.float32), source)
    weights = {"weights": variant.split("-")[1], "block_size": args.block_size} if "-" in variant else {}
    target = folder / f"{variant}.onnx"
    report = graphopt.optimize_file(source, target, target="ort-cpu", **weights)
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    length = prompt.shape[1]
    reference_tokens = reference_logits.argmax(-1)
    ids = torch.cat([prompt[0].cpu(), reference_tokens[:-1]]).numpy()[None]
    logits = session.run(["logits"], {"input_ids": ids.astype(np.int64)})[0][0]
    forced = torch.from_numpy(np.ascontiguousarray(logits[length - 1:])).float()
    sequence = prompt[0].cpu().tolist()
    free = []
    for _ in range(args.steps):
        out = session.run(["logits"], {"input_ids": np.array([sequence], dtype=np.int64)})[0][0, -1]
        free.append(int(out.argmax()))
        sequence.append(free[-1])
    return forced, torch.tensor(free), report


def _onnx_weights(report: Any) -> dict[str, Any] | None:
    summary = report.weight_quantization
    if summary is None:
        return None
    snrs = [layer.snr_db for layer in summary.layers if layer.quantized and layer.snr_db is not None]
    return {"quantized": summary.quantized, "kept": [f"{layer.node}: {layer.reason}" for layer in summary.layers if not layer.quantized],
            "snr_db_min": min(snrs) if snrs else None, "snr_db_median": statistics.median(snrs) if snrs else None, "forms": [summary.form]}


def run_variant(variant: str, args: argparse.Namespace, reference_logits: Any, prompt: Any) -> dict[str, Any]:
    import tempfile

    import torch

    entry: dict[str, Any] = {"variant": variant}
    try:
        if variant.startswith("onnx"):
            if args.device != "cpu":
                raise ValueError("the ONNX variants run on the CPU (--device cpu)")
            args.onnx_folder = getattr(args, "onnx_folder", None) or tempfile.mkdtemp(prefix="quant_accuracy_")
            forced_logits, free_tokens, report = onnx_decode(variant, args, reference_logits, prompt, Path(args.onnx_folder))
            entry.update(compare(reference_logits, forced_logits, free_tokens, args.min_gap))
            weights = _onnx_weights(report)
            if weights is not None:
                entry["weights"] = weights
            entry["status"] = "ok"
            return entry
        from llm_decode import _static_cache

        model = build_model(args.tinyllama, args.device, args.dtype)  # a fresh copy: casts and freezing change it
        torch._dynamo.reset()
        run, forward = variant_forward(model, variant, args)
        cache = _static_cache(run, 1, prompt.shape[1] + args.steps, args.device)
        with every_layer_quantized():  # (the compile happens at the first call)
            _, forced_logits = decode(forward, run, prompt, args.steps, forced=reference_logits.argmax(-1), cache=cache)
            free_tokens, _ = decode(forward, run, prompt, args.steps, cache=cache)
        entry.update(compare(reference_logits, forced_logits, free_tokens, args.min_gap))
        weights = weight_summary() if variant in ("int8", "int4", "fp8") else None
        if weights is not None:
            entry["weights"] = weights
        entry["status"] = "ok"
    except Exception as error:  # noqa: BLE001 - one variant failing does not stop the table
        entry["status"] = f"error: {type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
        if args.verbose:
            traceback.print_exc()
    return entry


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: list[dict[str, Any]], header: str) -> str:
    lines = [header, f"{'variant':9s} {'cos min':>9s} {'cos med':>9s} {'top1':>7s} {'decided':>13s} {'1st diff':>8s} {'gap there':>9s} "
             f"{'free eq':>7s} {'max|dlogit|':>11s} {'layer SNR min/med dB':>20s}"]
    for e in results:
        if e.get("status") != "ok":
            lines.append(f"{e['variant']:9s} {e.get('status')}")
            continue
        decided = f"{_fmt(e['top1_agreement_decided'] and 100 * e['top1_agreement_decided'], '.1f')}% of {e['decided_steps']}"
        weights = e.get("weights") or {}
        snr = f"{_fmt(weights.get('snr_db_min'), '.1f')}/{_fmt(weights.get('snr_db_median'), '.1f')}" if weights else ""
        lines.append(f"{e['variant']:9s} {e['cosine_min']:9.5f} {e['cosine_median']:9.5f} {100 * e['top1_agreement']:6.1f}% {decided:>13s} "
                     f"{_fmt(e['free_first_divergence'], 'd'):>8s} {_fmt(e['free_gap_at_divergence'], '.4f'):>9s} "
                     f"{100 * e['free_token_agreement']:6.1f}% {e['max_abs_logit_error']:11.4f} {snr:>20s}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="identity,fp16,int8,int4", help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=8, help="prompt tokens (random, seed 0)")
    parser.add_argument("--block-size", type=int, default=32, choices=(32, 64, 128))
    parser.add_argument("--min-gap", type=float, default=DEFAULT_MIN_GAP, help="the reference's top-2 logit gap above which a step counts as decided")
    parser.add_argument("--tinyllama", action="store_true", help="the TinyLlama-1.1B shape (for the GPU)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda where there is one)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="a JSON file, or a folder for quant_accuracy[-tinyllama].json")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants or args.steps < 1 or args.prompt < 1:
        print(f"error: expected --variants from {', '.join(VARIANTS)} and positive --steps/--prompt, got {args.variants!r}", file=sys.stderr)
        return 2

    import torch
    import transformers

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = torch.float16 if args.device.startswith("cuda") else torch.float32
    args.inductor = args.device.startswith("cuda")  # on the CPU inductor compiles C++: graphopt's graph runs as it is
    model = build_model(args.tinyllama, args.device, args.dtype)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(args.device)
    _, reference_logits = decode(model.forward, model, prompt, args.steps)
    del model
    results = [run_variant(v, args, reference_logits, prompt) for v in variants]

    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
           "machine": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or platform.machine(),
           "reference": str(args.dtype).removeprefix("torch."), "model": "TinyLlama-1.1B shape" if args.tinyllama else "LLaMA 2x256, vocab 1000",
           "command": "python benchmarks/quant_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    header = (f"{env['model']}, random weights, {args.steps} greedy steps after a {args.prompt}-token prompt, against {env['reference']} "
              f"on {env['machine']} ({args.device}); decided: steps whose reference top-2 gap > {args.min_gap:g} "
              f"(median gap {statistics.median([e['reference_gap_median'] for e in results if 'reference_gap_median' in e] or [0]):.4f})")
    if getattr(args, "onnx_folder", None):
        import shutil

        shutil.rmtree(args.onnx_folder, ignore_errors=True)
    print(table(results, header))
    out = Path(args.out)
    path = out / f"quant_accuracy{'-tinyllama' if args.tinyllama else ''}.json" if out.is_dir() or args.out.endswith(("/", os.sep)) else out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": env, "args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2))
    print(f"wrote {path}")
    return 0 if all(e.get("status") == "ok" for e in results) else 1


if __name__ == "__main__":
    sys.exit(main())
