"""Greedy generation with graphopt through both front doors, on a LLaMA-style decoder.

    python examples/generate.py                    # CPU, fp32, a small decoder built from a config
    python examples/generate.py --device cuda      # fp16 on a GPU (ort-cuda needs onnxruntime-gpu)

The decoder has random weights (no download), so its tokens mean nothing; what matters is that
each path gives the same tokens as transformers' eager model, and how fast it decodes.

* torch: ``torch.compile(model.forward, backend="graphopt")`` over a transformers StaticCache
  (graphopt fuses RMSNorm, rotary, SwiGLU, attention over the cache and packs q/k/v, then hands
  the graph to inductor).
* ONNX: the decoder exported by torch.onnx with past/present key/value inputs and outputs,
  ``graphopt.optimize_file(..., kv_buffer="shared", kv_max_length=N)`` (GroupQueryAttention reading
  and writing one max-length buffer per layer; the rotary tables made once for N positions), then
  onnxruntime with io-binding: each layer's buffer is bound as
  both its past input and its present output, so a decode step copies no cache.

Prints prefill and per-token times, tokens/s, the fraction of the memory-bandwidth limit (a decode step
must read every weight and the cache; the limit is those bytes over a measured copy's bandwidth on the
device), and how many of the tokens equal eager's.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

SIZES = {  # LlamaConfig fields; "tiny" is the tests' size
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=256),
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1408,
                  vocab_size=32000),
}


def build_decoder(size: str, device: str, dtype: torch.dtype) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(max_position_embeddings=1024, tie_word_embeddings=False, **SIZES[size])
    return transformers.LlamaForCausalLM(config).to(device, dtype).eval()


def _cache_kwarg(model: Any) -> str:
    """transformers 5.2x renamed past_key_values to cache (the old name warns)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def eager_tokens(model: Any, prompt: torch.Tensor, steps: int) -> np.ndarray:
    """The reference: transformers' eager model with its dynamic cache."""
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=steps, do_sample=False, min_new_tokens=steps)
    return out[:, prompt.shape[1]:].cpu().numpy()


def torch_path(model: Any, prompt: torch.Tensor, steps: int, device: str) -> dict[str, Any]:
    """torch.compile(backend="graphopt") over a StaticCache: greedy tokens and times (the first run compiles)."""
    import graphopt.torch_backend  # noqa: F401  (registers the backend where the package is not installed)

    forward = torch.compile(model.forward, backend="graphopt", fullgraph=True, dynamic=False)
    batch, length = prompt.shape
    cache = transformers.StaticCache(config=model.config, max_cache_len=length + steps)
    positions = torch.arange(length + steps, device=device)
    key = _cache_kwarg(model)
    with torch.no_grad():  # one eager call makes the cache's tensors before compiling (else the second run recompiles)
        model(input_ids=prompt[:, :1], cache_position=positions[:1], use_cache=True, **{key: cache})
    result: dict[str, Any] = {}
    for run in ("compile", "timed"):
        cache.reset()
        tokens, step_ms = [], []
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            start = time.perf_counter()
            out = forward(input_ids=prompt, cache_position=positions[:length], use_cache=True, **{key: cache})
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            _sync(device)
            prefill_ms = (time.perf_counter() - start) * 1e3
            for step in range(steps):
                tokens.append(token)
                if step == steps - 1:
                    break
                start = time.perf_counter()
                out = forward(input_ids=token, cache_position=positions[length + step:length + step + 1], use_cache=True, **{key: cache})
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                _sync(device)
                step_ms.append((time.perf_counter() - start) * 1e3)
        result[run] = {"tokens": torch.cat(tokens, 1).cpu().numpy(), "prefill_ms": prefill_ms, "step_ms": statistics.median(step_ms)}
    return result["timed"] | {"first_run_s": result["compile"]["prefill_ms"] / 1e3}


class _WithPastInputs(torch.nn.Module):
    """The decoder as an exportable function: (input_ids, [past_k0, past_v0, ...]) -> (logits, [present_k0, ...])."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, past: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        cache = transformers.DynamicCache(config=self.model.config)
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=input_ids, use_cache=True, **{_cache_kwarg(self.model): cache})
        return out.logits, [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]


def export_with_past(model: Any, path: Path) -> None:
    """torch.onnx (dynamo) export with past_k<i>/past_v<i> inputs and present_k<i>/present_v<i> outputs."""
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head = config.hidden_size // config.num_attention_heads
    past = [torch.zeros(2, kv_heads, 4, head, dtype=model.dtype, device=model.device) for _ in range(2 * layers)]
    ids = torch.zeros(2, 3, dtype=torch.long, device=model.device)
    batch, seq, past_len = torch.export.Dim("batch"), torch.export.Dim("seq"), torch.export.Dim("past")
    names = [f"past_{kv}{i}" for i in range(layers) for kv in "kv"]
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # its notes on optional packages (torchvision)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_WithPastInputs(model), (ids, past), str(path), dynamo=True, external_data=True, verbose=False,
                          input_names=["input_ids", *names], output_names=["logits", *[n.replace("past", "present") for n in names]],
                          dynamic_shapes={"input_ids": {0: batch, 1: seq}, "past": [{0: batch, 2: past_len}] * len(past)})


def onnx_path(model: Any, prompt: torch.Tensor, steps: int, device: str, folder: Path) -> dict[str, Any]:
    """Export, graphopt with shared KV buffers, then onnxruntime with io-binding."""
    import onnxruntime as ort

    import graphopt

    exported, optimized = folder / "decoder.onnx", folder / "decoder.opt.onnx"
    start = time.perf_counter()
    export_with_past(model, exported)
    target = "ort-cuda" if device == "cuda" else "ort-cpu"
    config = model.config
    batch, length = prompt.shape
    max_length = length + steps  # the buffers' length: the rotary tables are made once for it (--kv-max-length)
    report = graphopt.optimize_file(exported, optimized, target=target, kv_buffer="shared", kv_max_length=max_length)
    prepare_s = time.perf_counter() - start
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(optimized), providers=providers)

    head = config.hidden_size // config.num_attention_heads
    float_type = np.float16 if model.dtype == torch.float16 else np.float32
    pairs = [(f"past_{kv}{i}", f"present_{kv}{i}") for i in range(config.num_hidden_layers) for kv in "kv"]

    def on_device(array: np.ndarray) -> Any:
        return ort.OrtValue.ortvalue_from_numpy(array, device, 0)

    # one [batch, kv_heads, max_length, head] buffer per past/present pair, for the whole generation
    buffers = {past: on_device(np.zeros((batch, config.num_key_value_heads, max_length, head), float_type)) for past, _ in pairs}
    ids, total, tokens, step_ms = prompt.cpu().numpy(), length, [], []
    for step in range(steps):
        binding = session.io_binding()
        binding.bind_ortvalue_input("input_ids", on_device(ids.astype(np.int64)))
        binding.bind_ortvalue_input("attention_mask", on_device(np.ones((batch, total), np.int64)))  # the valid length
        binding.bind_output("logits", "cpu")  # first: get_outputs() lists outputs in the order they were bound
        for past, present in pairs:
            binding.bind_ortvalue_input(past, buffers[past])
            binding.bind_ortvalue_output(present, buffers[past])  # written in place
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()
        elapsed = (time.perf_counter() - start) * 1e3
        if step == 0:
            prefill_ms = elapsed
        else:
            step_ms.append(elapsed)
        tokens.append(logits[:, -1].argmax(-1))
        ids, total = tokens[-1][:, None], total + 1
    fused = {name: rule.applications for name, rule in report.rules.items() if rule.applications and name.startswith("Fuse")}
    return {"tokens": np.stack(tokens, 1), "prefill_ms": prefill_ms, "step_ms": statistics.median(step_ms), "prepare_s": prepare_s,
            "fused": fused}


def copy_bandwidth(device: str) -> float:
    """Bytes read + written per second by a large device copy (the memory bandwidth a step can reach)."""
    nbytes = (1 << 30) if device == "cuda" else (256 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times[1:])


def step_bytes(model: Any, prompt_tokens: int, steps: int) -> float:
    """What one decode step reads at batch 1: every weight, and the key/value cache at the mean position."""
    config = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    head = config.hidden_size // config.num_attention_heads
    mean_rows = prompt_tokens + steps / 2
    return weights + 2 * config.num_hidden_layers * config.num_key_value_heads * head * mean_rows * model.dtype.itemsize


def run_paths(size: str, device: str, prompt_tokens: int, steps: int, paths: str) -> tuple[Any, np.ndarray, dict[str, dict[str, Any]]]:
    """(the model, eager's tokens, each path's result with its "equal_to_eager": leading tokens equal to eager's)."""
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = build_decoder(size, device, dtype)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), generator=torch.Generator().manual_seed(0)).to(device)
    reference = eager_tokens(model, prompt, steps)
    results: dict[str, dict[str, Any]] = {}
    if "torch" in paths:
        results["torch.compile(backend='graphopt')"] = torch_path(model, prompt, steps, device)
    if "onnx" in paths:
        with tempfile.TemporaryDirectory() as folder:
            results["graphopt --kv-buffer shared + onnxruntime"] = onnx_path(model, prompt, steps, device, Path(folder))
    limit_ms = step_bytes(model, prompt_tokens, steps) / copy_bandwidth(device) * 1e3
    for r in results.values():
        r["equal_to_eager"] = int((r["tokens"] == reference).all(0).cumprod().sum())
        r["of_limit"] = limit_ms / r["step_ms"]
    return model, reference, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens (random)")
    parser.add_argument("--steps", type=int, default=32, help="tokens to generate")
    parser.add_argument("--paths", default="torch,onnx", help="torch, onnx or both")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    model, _, results = run_paths(args.size, args.device, args.prompt, args.steps, args.paths)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"{args.size} LLaMA-style decoder ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {model.dtype}) "
          f"on {name}; prompt {args.prompt}, {args.steps} greedy tokens")
    print(f"{'path':45s} {'prefill ms':>10s} {'ms/token':>9s} {'tokens/s':>9s} {'of limit':>8s}  tokens equal to eager")
    for path, r in results.items():
        print(f"{path:45s} {r['prefill_ms']:10.2f} {r['step_ms']:9.3f} {1e3 / r['step_ms']:9.1f} {100 * r['of_limit']:7.1f}%  "
              f"{r['equal_to_eager']}/{args.steps}")
    print("of limit: (weights + KV cache bytes a step reads) / a measured device copy's bandwidth, over ms/token "
          "(on the CPU a copy understates what a stream of reads reaches, and caches help: above 100 % is possible there)")
    for path, r in results.items():
        extra = f"first run (compiling) {r['first_run_s']:.1f} s" if "first_run_s" in r else f"export + optimize {r['prepare_s']:.1f} s; fused {r['fused']}"
        print(f"  {path}: {extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
