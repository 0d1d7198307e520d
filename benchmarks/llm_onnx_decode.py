"""Decode steps of a LLaMA-style decoder exported with a KV cache, in onnxruntime with
io-binding: the export as it is against graphopt's output for the target (GroupQueryAttention
over the cache) and against graphopt's output without FuseGroupQueryAttention (the
attention as com.microsoft.MultiHeadAttention over Concat + repeat_kv).

    python benchmarks/llm_onnx_decode.py --out DIR                       # CUDA, float16, batch 1 and 8
    python benchmarks/llm_onnx_decode.py --out DIR --device cpu --dtype fp32 --layers 2 --hidden 256 --heads 8 --kv-heads 2 --prompt 32 --steps 8
    python benchmarks/llm_onnx_decode.py --out DIR --variants original,graphopt,graphopt-int4,graphopt-int8,original   # weight-only
    python benchmarks/llm_onnx_decode.py --out DIR --family qwen2 --layers 4   # another decoder family (tests/llm_families.py)

The model: transformers' LlamaModel (no LM head) from a LlamaConfig with random weights
(--layers, --hidden, --heads, --kv-heads, --intermediate, --vocab), cast to --dtype before the
export (so the KV cache inputs and outputs are in that type), exported by torch.onnx's dynamo
exporter with a DynamicCache: inputs input_ids (attention_mask with --attention-mask), past_k<i> / past_v<i>; outputs
the hidden states and present_k<i> / present_v<i>. With `--source block` it is one attention
block of tests/llm_decoders.py instead (no transformers needed).

Per variant and batch: prefill (--prompt tokens, empty past) once, then --steps decode steps of
one token, each step's presents bound as the next step's past (they stay on the device);
median ms per step over the steps after --warmup. The first decode step's outputs are compared
with the export's. Output: a table and DIR/llm_onnx_decode.json (device, versions, command).

--variants picks and orders the variants (repeats allowed: the original again at the end tells a
process-state effect from a graph's); graphopt-no-gqa-no-rope and graphopt-no-attention turn
graphopt's rules off one more at a time, to bisect a slow variant; graphopt-int4 and graphopt-int8 are
graphopt's output with `--weights int4|int8 --block-size B` (B: --block-size; every MatMul weight as
com.microsoft.MatMulNBits; the model has no LM head), compared by the cosine similarity of the first
decode step's outputs (the `cosine` column) as well as the largest difference. --profile runs each variant
once more with onnxruntime's profiler (DIR/ort_profile_*.json): per op type and provider, the
node time per timed step; on CUDA also the GPU kernels of one decode step (CUPTI), so a step
whose GPU time is far below its wall time is waiting on the host.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

VARIANTS = ("original", "graphopt", "graphopt-no-gqa")
# graphopt's rules each variant turns off; the last two bisect a slow graphopt variant
# (MultiHeadAttention without RotaryEmbedding; no attention rewrite at all)
DISABLED = {"graphopt": (), "graphopt-no-gqa": ("FuseGroupQueryAttention",),
            "graphopt-no-gqa-no-rope": ("FuseGroupQueryAttention", "FuseRotaryEmbedding"),
            "graphopt-no-attention": ("FuseGroupQueryAttention", "FuseRotaryEmbedding", "FuseAttention"),
            "graphopt-int4": (), "graphopt-int8": ()}
def _empty_table() -> object:
    from graphopt.decisions import CostTable

    return CostTable()


# weight-only quantization (graphopt optimize --weights; block size from --block-size): com.microsoft.MatMulNBits
WEIGHTS = {"graphopt-int4": "int4", "graphopt-int8": "int8"}


def export_llama(path: Path, args: argparse.Namespace) -> None:
    import torch
    import transformers
    from architectures import _cache_from, _cache_tensors, _module
    from llm_families import config, head_dim, model_class

    family = getattr(args, "family", "llama")  # callers that build their own Namespace (tests) predate it
    if family == "llama":
        cfg = transformers.LlamaConfig(num_hidden_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
                                       num_key_value_heads=args.kv_heads, intermediate_size=args.intermediate, vocab_size=args.vocab,
                                       max_position_embeddings=4096, attn_implementation="sdpa")
    else:  # the family's own full-size shape (tests/llm_families.py), --layers of it
        cfg = config(family, tiny=False)
        cfg.num_hidden_layers = args.layers
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    model = getattr(transformers, model_class(family, causal_lm=False))(cfg).eval().to(dtype)
    layers, head, kv_heads = args.layers, head_dim(cfg), cfg.num_key_value_heads

    def forward(m: Any, input_ids: Any, attention_mask: Any, *past: Any) -> Any:
        # a cache of every token: a sliding-window family's own crops it to the window inside the graph, which graphopt
        # lowers only for a growing cache (graphopt/passes/sliding_window_cache.py), not the shared buffer timed here
        out = m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=_cache_from(layers, list(past), cfg, full=True),
                use_cache=True, return_dict=True)
        return (out.last_hidden_state, *_cache_tensors(out.past_key_values))

    def forward_causal(m: Any, input_ids: Any, *past: Any) -> Any:
        return forward(m, input_ids, None, *past)

    names = ["input_ids", "attention_mask"] + [f"past_{kv}{i}" for i in range(layers) for kv in "kv"]
    batch, seq, past = 2, 3, 4
    example = [torch.randint(0, args.vocab, (batch, seq)), torch.ones(batch, past + seq, dtype=torch.int64)]
    if not args.attention_mask:  # transformers builds a causal mask from the cache position alone
        names.pop(1)
        example.pop(1)
    example += [torch.randn(batch, kv_heads, past, head, dtype=dtype) for _ in range(2 * layers)]
    dims = {d: torch.export.Dim(d) for d in ("batch", "seq", "total", "past")}
    shapes: dict[str, Any] = {"input_ids": {0: dims["batch"], 1: dims["seq"]}}
    if args.attention_mask:
        shapes["attention_mask"] = {0: dims["batch"], 1: dims["total"]}
    shapes |= {n: {0: dims["batch"], 2: dims["past"]} for n in names if n.startswith("past")}
    outputs = ["hidden"] + [f"present_{kv}{i}" for i in range(layers) for kv in "kv"]
    with torch.no_grad():
        torch.onnx.export(_module(forward if args.attention_mask else forward_causal, model, names), tuple(example), str(path), dynamo=True, input_names=names,
                          output_names=outputs, dynamic_shapes=shapes, optimize=True)


def build(args: argparse.Namespace, folder: Path, variants: tuple[str, ...] = VARIANTS) -> tuple[Path, dict[str, str]]:
    """The model file, and the variants' files."""
    import onnx

    import graphopt

    source = folder / "original.onnx"
    if args.source == "block":
        from llm_decoders import decoder_block

        onnx.save(decoder_block(hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                                dtype=np.float16 if args.dtype == "fp16" else np.float32), str(source))
    else:
        export_llama(source, args)
    files = {"original": str(source)}
    target = "ort-cuda" if args.device == "cuda" else "ort-cpu"
    for variant in variants:
        if variant == "original":
            continue
        disable = DISABLED[variant]
        # The quantized variants measure the quantized form itself (what the `weights` cost entries are made
        # from): an empty cost table, so graphopt's weights decision predicts nothing and quantizes as asked.
        weights = {"weights": WEIGHTS[variant], "block_size": args.block_size, "cost_table": _empty_table()} if variant in WEIGHTS else {}
        report = graphopt.optimize_file(source, folder / f"{variant}.onnx", target=target, disable=list(disable), **weights)
        files[variant] = str(folder / f"{variant}.onnx")
        fused = report.rules["FuseGroupQueryAttention"].applications if "FuseGroupQueryAttention" in report.rules else 0
        quantized = report.weight_quantization
        extra = f", --weights {quantized.weights} --block-size {quantized.block_size}: {quantized.quantized} of {len(quantized.layers)} MatMuls" if quantized else ""
        print(f"{variant}: --target {target}, FuseGroupQueryAttention x{fused}{extra}", flush=True)
    return source, files


class Stepper:
    """One onnxruntime session with io-binding; the presents of a step are the next step's past."""

    def __init__(self, path: str, device: str, threads: int, profile_prefix: str | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if profile_prefix:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        if threads:
            options.intra_op_num_threads = threads
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(path, options, providers=providers)
        self.device = device
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.ort = ort

    def value(self, array: np.ndarray) -> Any:
        return self.ort.OrtValue.ortvalue_from_numpy(array, self.device, 0)

    def step(self, feeds: dict[str, Any]) -> tuple[dict[str, Any], float]:
        binding = self.session.io_binding()
        for name, value in feeds.items():
            if name in self.inputs:
                binding.bind_ortvalue_input(name, value)
        for name in self.outputs:
            binding.bind_output(name, self.device)
        start = time.perf_counter()
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        elapsed = time.perf_counter() - start
        return dict(zip(self.outputs, binding.get_outputs(), strict=True)), elapsed


def _past_names(stepper: Stepper) -> list[tuple[str, str]]:
    """(past input, present output) pairs, in order."""
    pasts = [n for n in stepper.inputs if n.startswith("past")]
    presents = [n for n in stepper.outputs if n.startswith("present")]
    return list(zip(pasts, presents, strict=True))


def run_variant(path: str, args: argparse.Namespace, batch: int, profile_prefix: str | None = None) -> dict[str, Any]:
    stepper = Stepper(path, args.device, args.threads, profile_prefix)
    rng = np.random.default_rng(0)
    pairs = _past_names(stepper)
    past_meta = stepper.inputs[pairs[0][0]]
    kv_heads, head = past_meta.shape[1], past_meta.shape[3]
    float_type = np.float16 if "float16" in past_meta.type else np.float32
    first_input = "input_ids" if "input_ids" in stepper.inputs else "hidden"

    def tokens(seq: int) -> np.ndarray:
        if first_input == "input_ids":
            return rng.integers(0, args.vocab, (batch, seq)).astype(np.int64)
        return rng.standard_normal((batch, seq, args.hidden)).astype(float_type)

    empty = np.zeros((batch, kv_heads, 0, head), float_type)
    feeds = {first_input: stepper.value(tokens(args.prompt)), "attention_mask": stepper.value(np.ones((batch, args.prompt), np.int64))}
    feeds |= {p: stepper.value(empty) for p, _ in pairs}
    outs, prefill_s = stepper.step(feeds)
    times: list[float] = []
    first = None
    total = args.prompt
    for i in range(args.steps):
        total += 1
        feeds = {first_input: stepper.value(tokens(1)), "attention_mask": stepper.value(np.ones((batch, total), np.int64))}
        feeds |= {p: outs[o] for p, o in pairs}
        outs, elapsed = stepper.step(feeds)
        if i == 0:
            first = outs[stepper.outputs[0]].numpy()
        if i >= args.warmup:
            times.append(elapsed)
    result = {"prefill_ms": prefill_s * 1e3, "decode_ms": statistics.median(times) * 1e3 if times else None,
              "first_output": first}
    if profile_prefix:
        result["profile"] = summarize_profile(stepper.session.end_profiling(), len(times))
        if args.device == "cuda":  # GPU time against wall time: a device-bound step, or one that waits on the host
            try:
                from gpu_profile import kernel_profile

                result["profile"]["kernels"] = kernel_profile(lambda: stepper.step(feeds), runs=5, top=10)
            except Exception as error:  # noqa: BLE001 - the kernel list is extra information, never fatal
                result["profile"]["kernels"] = {"error": str(error).splitlines()[0][:200]}
    return result


def summarize_profile(path: str, last_runs: int, top: int = 12) -> dict[str, Any]:
    """onnxruntime's profile of the session, over its last `last_runs` runs (the timed decode
    steps): per op type and provider, the node time per step (host-side on CUDA: a kernel
    launch, unless the node waits for the device or copies to the host) and nodes per step."""
    events = json.loads(Path(path).read_text())
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    windows = runs[-last_runs:] if last_runs else []
    per_op: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if not any(lo <= e["ts"] <= hi for lo, hi in windows):
            continue
        key = f"{e['args'].get('op_name', '?')}@{e['args'].get('provider', '?').replace('ExecutionProvider', '')}"
        slot = per_op.setdefault(key, [0.0, 0])
        slot[0] += e["dur"]
        slot[1] += 1
    steps = max(len(windows), 1)
    ops = sorted(({"op": k, "us_per_step": v[0] / steps, "nodes_per_step": v[1] / steps} for k, v in per_op.items()),
                 key=lambda r: -r["us_per_step"])
    return {"file": path, "steps": len(windows), "run_us_per_step": sum(hi - lo for lo, hi in windows) / steps,
            "node_us_per_step": sum(r["us_per_step"] for r in ops), "top": ops[:top]}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Of the first decode step's outputs (quantized weights change every element a little)."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norms = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y / norms) if norms else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--source", choices=("export", "block"), default="export")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--family", default="llama", choices=("llama", "llama3", "qwen2", "mistral", "phi3", "gemma"),
                        help="llama: the LlamaConfig of --hidden, --heads, ...; another family (tests/llm_families.py): its own "
                             "full-size config with --layers layers")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=32, help="block size of the graphopt-int4/-int8 variants (default: %(default)s)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of original,{','.join(DISABLED)} (default: %(default)s)")
    parser.add_argument("--profile", action="store_true",
                        help="run each variant once more with onnxruntime's profiler; its top ops per decode step go to the table and the JSON")
    parser.add_argument("--attention-mask", action="store_true",
                        help="export with an attention_mask input (a padding mask: no GroupQueryAttention on ort-cuda, whose kernel takes no attention_bias)")
    args = parser.parse_args(argv)
    variants = tuple(v.strip() for v in args.variants.split(","))
    unknown = [v for v in variants if v != "original" and v not in DISABLED]
    if unknown or "original" not in variants:
        print(f"error: --variants must include original and name only original,{','.join(DISABLED)} (in any order, repeats allowed); "
              f"got {args.variants}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)

    import onnxruntime as ort

    device_name = platform.processor() or platform.machine()
    if args.device == "cuda":
        try:
            import subprocess

            device_name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            pass
    source, files = build(args, args.out, variants)
    rows = []
    for batch in [int(b) for b in args.batch.split(",")]:
        outputs: list[tuple[dict[str, Any], np.ndarray]] = []
        for index, variant in enumerate(variants):
            try:
                result = run_variant(files[variant], args, batch)
            except Exception as error:  # noqa: BLE001 - a variant that fails is a row with its error
                rows.append({"variant": variant, "batch": batch, "error": str(error).splitlines()[0][:200]})
                print(f"{variant} batch {batch}: {rows[-1]['error']}", flush=True)
                continue
            out = result.pop("first_output")
            rows.append({"variant": variant, "batch": batch, **result})
            outputs.append((rows[-1], out))
            print(f"{variant} batch {batch}: prefill {result['prefill_ms']:.2f} ms, decode {result['decode_ms']:.3f} ms/step", flush=True)
            if args.profile:  # a second run: the profiler's own cost stays out of the timed one
                profile = run_variant(files[variant], args, batch, str(args.out / f"ort_profile_{index}_{variant}_b{batch}"))["profile"]
                rows[-1]["profile"] = profile
                print(f"  profiled: run {profile['run_us_per_step']:.0f} us/step, nodes {profile['node_us_per_step']:.0f} us/step; top ops:")
                for op in profile["top"][:8]:
                    print(f"    {op['op']:<40}{op['us_per_step']:>10.0f} us/step{op['nodes_per_step']:>6.0f} nodes")
                kernels = profile.get("kernels", {})
                if "gpu_ms_per_run" in kernels:
                    print(f"  GPU kernels: {kernels['kernels_per_run']} per step, {kernels['gpu_ms_per_run']:.3f} ms per step; top:")
                    for k in kernels["top"][:5]:
                        print(f"    {k['ms_per_run']:>8.3f} ms x{k['calls_per_run']:<5} {k['name'][:90]}")
                elif kernels:
                    print(f"  GPU kernels: {kernels.get('error')}")
        reference = next((out for row, out in outputs if row["variant"] == "original"), None)
        for row, out in outputs:  # against the original's first decode step; none when the original failed
            row["max_abs_diff_vs_original"] = (float(np.max(np.abs(out.astype(np.float64) - reference.astype(np.float64))))
                                               if reference is not None else float("nan"))
            row["cosine_vs_original"] = _cosine(out, reference) if reference is not None else float("nan")
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": device_name, "onnxruntime": ort.__version__,
        "command": " ".join(["python", "benchmarks/llm_onnx_decode.py", *(argv if argv is not None else sys.argv[1:])]),
        "args": {k: str(v) for k, v in vars(args).items()}, "results": rows,
    }
    (args.out / "llm_onnx_decode.json").write_text(json.dumps(record, indent=1))
    print(f"\n{device_name}, onnxruntime {ort.__version__}, {args.source} {args.dtype}, prompt {args.prompt}, {args.steps} steps")
    print(f"{'variant':<26}{'batch':>6}{'prefill ms':>12}{'decode ms/step':>16}{'diff':>10}{'cosine':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<26}{r['batch']:>6}  error: {r['error'][:80]}")
        else:
            print(f"{r['variant']:<26}{r['batch']:>6}{r['prefill_ms']:>12.2f}{r['decode_ms']:>16.3f}{r['max_abs_diff_vs_original']:>10.2g}"
                  f"{r['cosine_vs_original']:>10.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
