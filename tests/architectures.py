"""Real transformer architectures, exported as other people export them: the torture set.

Each entry builds a transformers model from a small config with random weights (no
hub), wraps it so that its inputs and outputs are plain tensors (KV caches as
tensors too), exports it with the dynamo and/or TorchScript exporter, and caches the
file under ``<repo>/.cache/torture/<name>-<exporter>-<torch>/model.onnx``. They cover
the structures that broke graphopt on real exports: pre-LN encoders whose residual sum
feeds the next block (Whisper, BART is post-LN), decoders with a KV cache (Whisper,
LLaMA/SmolLM, Phi-2), parallel attention+MLP residuals (Phi-2, GPT-NeoX), T5's
relative-position bias and cross-attention.

``build(name, exporter)`` returns (path, feeds): the model and deterministic numpy
inputs for onnxruntime. ``ARCHITECTURES`` maps a name to its exporters.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_families import FAMILIES  # noqa: E402
from models import _perturb_1d_params  # noqa: E402  (same seeded noise as the zoo)

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED = 0
BATCH, SEQ, PAST = int(os.environ.get("TORTURE_BATCH", 2)), 6, 5  # export sizes; the past is the KV cache length
CACHE_DIR = Path(os.environ.get("GRAPHOPT_MODEL_CACHE", REPO_ROOT / ".cache" / "models")).parent / ("torture" if BATCH == 2 else f"torture-b{BATCH}")


@dataclass
class _Arch:
    make: Callable[[], tuple[Any, dict[str, Any]]]  # -> (module, {input name: torch tensor})
    outputs: list[str]
    dynamic: dict[str, dict[int, str]]  # input name -> {axis: dim name}
    exporters: tuple[str, ...] = ("dynamo", "torchscript")


def _ids(vocab: int, batch: int = BATCH, seq: int = SEQ) -> Any:
    import torch

    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(SEED + 1))


def _randn(*shape: int, seed: int = 2) -> Any:
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(SEED + seed))


def _mask(batch: int, length: int) -> Any:
    import torch

    mask = torch.ones(batch, length, dtype=torch.int64)
    if batch > 1:
        mask[-1, : length // 4] = 0  # left padding on the last row (decoders pad on the left)
    return mask


def _module(forward: Callable[..., Any], inner: Any, names: list[str]) -> Any:
    """A torch module whose forward takes `names` positionally (export keys dynamic shapes by name)."""
    import torch

    args = ", ".join(names)
    namespace: dict[str, Any] = {}
    exec(f"def forward(self, {args}):\n    return self._forward(self.inner, {args})", namespace)  # noqa: S102
    cls = type("Wrapped", (torch.nn.Module,), {"forward": namespace["forward"]})
    module = cls()
    module.inner = inner
    module._forward = forward
    return module.eval()


def _cache_from(layers: int, past: list[Any], config: Any, full: bool = False) -> Any:
    """A DynamicCache holding `past`; made from the config (a sliding-window model's layers then keep window - 1
    tokens, cropping the past and the present), or `full`: every layer keeps every token."""
    from transformers import DynamicCache

    cache = DynamicCache() if full else DynamicCache(config=config)
    for i in range(layers):
        cache.update(past[2 * i], past[2 * i + 1], i)
    return cache


def _cache_tensors(cache: Any) -> list[Any]:
    out = []
    for layer in cache.layers:
        out += [layer.keys, layer.values]
    return out


# ---------------------------------------------------------------- encoders


def _whisper_encoder() -> tuple[Any, dict[str, Any]]:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(encoder_layers=2, d_model=64, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16,
                        max_source_positions=12, attn_implementation="sdpa")
    inner = _perturb_1d_params(WhisperEncoder(cfg)).eval()
    return _module(lambda m, input_features: m(input_features=input_features, return_dict=False)[0], inner, ["input_features"]), {
        "input_features": _randn(BATCH, 16, 24)
    }


def _bart_encoder() -> tuple[Any, dict[str, Any]]:
    from transformers import BartConfig
    from transformers.models.bart.modeling_bart import BartEncoder

    cfg = BartConfig(encoder_layers=2, d_model=64, encoder_attention_heads=4, encoder_ffn_dim=128, vocab_size=97,
                     max_position_embeddings=64, attn_implementation="sdpa")
    inner = _perturb_1d_params(BartEncoder(cfg)).eval()
    return _module(
        lambda m, input_ids, attention_mask: m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0],
        inner, ["input_ids", "attention_mask"],
    ), {"input_ids": _ids(97), "attention_mask": _mask(BATCH, SEQ).flip(1)}


def _t5() -> tuple[Any, dict[str, Any]]:
    """Encoder and decoder (cross-attention, relative position bias, no cache)."""
    from transformers import T5Config, T5Model

    cfg = T5Config(num_layers=2, num_decoder_layers=2, d_model=64, num_heads=4, d_kv=16, d_ff=128, vocab_size=97,
                   use_cache=False, attn_implementation="eager")
    inner = _perturb_1d_params(T5Model(cfg)).eval()

    def forward(m: Any, input_ids: Any, attention_mask: Any, decoder_input_ids: Any) -> Any:
        return m(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False,
                 return_dict=False)[0]

    return _module(forward, inner, ["input_ids", "attention_mask", "decoder_input_ids"]), {
        "input_ids": _ids(97), "attention_mask": _mask(BATCH, SEQ).flip(1), "decoder_input_ids": _ids(97, seq=SEQ - 2),
    }


# ---------------------------------------------------------------- decoders


def _whisper_decoder(cache: bool) -> Callable[[], tuple[Any, dict[str, Any]]]:
    def make() -> tuple[Any, dict[str, Any]]:
        from transformers import DynamicCache, EncoderDecoderCache, WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperDecoder

        cfg = WhisperConfig(decoder_layers=2, d_model=64, decoder_attention_heads=4, decoder_ffn_dim=128, vocab_size=97,
                            max_target_positions=32, max_source_positions=12, attn_implementation="sdpa", use_cache=cache,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        inner = _perturb_1d_params(WhisperDecoder(cfg)).eval()
        enc = _randn(BATCH, 12, 64, seed=3)
        if not cache:
            return _module(
                lambda m, input_ids, encoder_hidden_states: m(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                                                              use_cache=False, return_dict=False)[0],
                inner, ["input_ids", "encoder_hidden_states"],
            ), {"input_ids": _ids(97, seq=1), "encoder_hidden_states": enc}

        def forward(m: Any, input_ids: Any, encoder_hidden_states: Any, *past: Any) -> Any:
            self_cache = _cache_from(2, list(past), cfg)
            out = m(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                    past_key_values=EncoderDecoderCache(self_cache, DynamicCache(config=cfg)), use_cache=True, return_dict=True)
            return (out.last_hidden_state, *_cache_tensors(out.past_key_values.self_attention_cache))

        names = ["input_ids", "encoder_hidden_states", "past_k0", "past_v0", "past_k1", "past_v1"]
        past = {n: _randn(BATCH, 4, PAST, 16, seed=10 + i) for i, n in enumerate(names[2:])}
        return _module(forward, inner, names), {"input_ids": _ids(97, seq=1), "encoder_hidden_states": enc, **past}

    return make


def _causal_lm_with_cache(config_fn: Callable[[], Any], model_cls: str, heads_kv: int, head_dim: int,
                          mask: bool = True, half: bool = False, full: bool = False) -> Callable[[], tuple[Any, dict[str, Any]]]:
    """A decoder stack (no LM head) with its KV cache as inputs and outputs; without `mask` no
    attention_mask input (transformers builds the causal mask from the cache position alone); `half`:
    the model and its cache in float16; `full`: a cache that keeps every token (_cache_from)."""

    def make() -> tuple[Any, dict[str, Any]]:
        import transformers

        cfg = config_fn()
        inner = _perturb_1d_params(getattr(transformers, model_cls)(cfg)).eval()
        inner = inner.half() if half else inner
        layers = cfg.num_hidden_layers

        def forward(m: Any, input_ids: Any, attention_mask: Any, *past: Any) -> Any:
            out = m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=_cache_from(layers, list(past), cfg, full),
                    use_cache=True, return_dict=True)
            return (out.last_hidden_state, *_cache_tensors(out.past_key_values))

        def forward_causal(m: Any, input_ids: Any, *past: Any) -> Any:
            return forward(m, input_ids, None, *past)

        names = ["input_ids", "attention_mask"] + [f"past_{kv}{i}" for i in range(layers) for kv in "kv"]
        past = {n: _randn(BATCH, heads_kv, PAST, head_dim, seed=10 + i) for i, n in enumerate(names[2:])}
        past = {n: t.half() for n, t in past.items()} if half else past
        if not mask:
            return _module(forward_causal, inner, names[:1] + names[2:]), {"input_ids": _ids(cfg.vocab_size, seq=SEQ), **past}
        return _module(forward, inner, names), {
            "input_ids": _ids(cfg.vocab_size, seq=SEQ), "attention_mask": _mask(BATCH, PAST + SEQ), **past,
        }

    return make


def _causal_lm(config_fn: Callable[[], Any], model_cls: str) -> Callable[[], tuple[Any, dict[str, Any]]]:
    """A decoder stack (no LM head), no cache."""

    def make() -> tuple[Any, dict[str, Any]]:
        import transformers

        cfg = config_fn()
        inner = _perturb_1d_params(getattr(transformers, model_cls)(cfg)).eval()
        return _module(
            lambda m, input_ids, attention_mask: m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                                                   return_dict=False)[0],
            inner, ["input_ids", "attention_mask"],
        ), {"input_ids": _ids(cfg.vocab_size), "attention_mask": _mask(BATCH, SEQ)}

    return make


def _phi_config() -> Any:
    from transformers import PhiConfig

    return PhiConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=97,
                     max_position_embeddings=64, partial_rotary_factor=0.5, attn_implementation="sdpa")


def _smollm_config() -> Any:
    from transformers import LlamaConfig

    # SmolLM-style: GQA (4 query heads share 2 KV heads), tied embeddings, rotary, RMSNorm, SwiGLU
    return LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                       vocab_size=97, max_position_embeddings=64, tie_word_embeddings=True, attn_implementation="sdpa")


def _neox_config() -> Any:
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=97,
                         max_position_embeddings=64, rotary_pct=0.25, use_parallel_residual=True, attn_implementation="sdpa")


_KV = ("past_k", "past_v")


def _decoder_dynamic(layers: int, cache: bool) -> dict[str, dict[int, str]]:
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"}}
    if cache:
        for i in range(layers):
            for kv in _KV:
                dynamic[f"{kv}{i}"] = {0: "batch", 2: "past"}
    return dynamic


ARCHITECTURES: dict[str, _Arch] = {
    "whisper-encoder": _Arch(_whisper_encoder, ["hidden"], {"input_features": {0: "batch"}}),
    "bart-encoder": _Arch(_bart_encoder, ["hidden"], {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}),
    "t5": _Arch(_t5, ["hidden"], {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                                  "decoder_input_ids": {0: "batch", 1: "dec"}}),
    # TorchScript cannot export transformers' decoder mask helpers (aten::diff)
    "whisper-decoder": _Arch(_whisper_decoder(False), ["hidden"], {"input_ids": {0: "batch"}, "encoder_hidden_states": {0: "batch"}},
                             exporters=("dynamo",)),
    "whisper-decoder-kv": _Arch(
        _whisper_decoder(True), ["hidden", "present_k0", "present_v0", "present_k1", "present_v1"],
        {"input_ids": {0: "batch"}, "encoder_hidden_states": {0: "batch"},
         **{f"{kv}{i}": {0: "batch", 2: "past"} for i in range(2) for kv in _KV}},
        exporters=("dynamo",),
    ),
    "smollm": _Arch(_causal_lm(_smollm_config, "LlamaModel"), ["hidden"], _decoder_dynamic(2, False) | {"attention_mask": {0: "batch", 1: "seq"}}),
    "smollm-kv": _Arch(
        _causal_lm_with_cache(_smollm_config, "LlamaModel", 2, 16), ["hidden"] + [f"present_{kv}{i}" for i in range(2) for kv in "kv"],
        _decoder_dynamic(2, True), exporters=("dynamo",),
    ),
    "phi2-kv": _Arch(
        _causal_lm_with_cache(_phi_config, "PhiModel", 4, 16), ["hidden"] + [f"present_{kv}{i}" for i in range(2) for kv in "kv"],
        _decoder_dynamic(2, True), exporters=("dynamo",),
    ),
    "gpt-neox": _Arch(_causal_lm(_neox_config, "GPTNeoXModel"), ["hidden"], _decoder_dynamic(2, False) | {"attention_mask": {0: "batch", 1: "seq"}}),
}


def _family_arch(family: str, mask: bool, half: bool, full: bool) -> _Arch:
    from llm_families import config, head_dim, model_class

    cfg = config(family)
    make = _causal_lm_with_cache(lambda: config(family), model_class(family, causal_lm=False), cfg.num_key_value_heads, head_dim(cfg), mask, half, full)
    dynamic = _decoder_dynamic(2, True)
    if not mask:
        dynamic.pop("attention_mask")
    return _Arch(make, ["hidden"] + [f"present_{kv}{i}" for i in range(2) for kv in "kv"], dynamic, exporters=("dynamo",))


def _arch(name: str) -> _Arch:
    if name in ARCHITECTURES:
        return ARCHITECTURES[name]
    # the decoder families of tests/llm_families.py with their KV cache: "<family>-kv" with an attention_mask
    # input, and with "-causal" without one (the mask from the cache position alone), "-fp16" in float16,
    # "-full" with a cache that keeps every token (a sliding-window model's crops to the window); not torture cases
    family, *tokens = name.split("-")
    if family not in FAMILIES or not tokens or tokens[0] != "kv" or not set(tokens[1:]) <= {"causal", "fp16", "full"}:
        raise KeyError(name)
    return _family_arch(family, mask="causal" not in tokens, half="fp16" in tokens, full="full" in tokens)


def _key(name: str, exporter: str) -> str:
    import torch
    import transformers

    return f"{name}-{exporter}-torch{torch.__version__.split('+')[0]}-tf{transformers.__version__}"


def build(name: str, exporter: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The exported model (cached) and its example inputs."""
    import torch

    arch = _arch(name)
    torch.manual_seed(SEED)
    module, example = arch.make()
    feeds = {k: v.numpy() for k, v in example.items()}
    folder = CACHE_DIR / _key(name, exporter)
    path = folder / "model.onnx"
    if path.exists():
        return path, feeds
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    args = tuple(example.values())
    names = list(example)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes: dict[str, dict[int, str]] = dict(arch.dynamic)
            torch.onnx.export(module, args, str(tmp / "model.onnx"), dynamo=False, opset_version=17, input_names=names,
                              output_names=arch.outputs, dynamic_axes=axes)
        else:
            dims: dict[str, Any] = {}
            shapes = {n: {axis: dims.setdefault(d, torch.export.Dim(d)) for axis, d in arch.dynamic.get(n, {}).items()} for n in names}
            torch.onnx.export(module, args, str(tmp / "model.onnx"), dynamo=True, input_names=names, output_names=arch.outputs,
                              dynamic_shapes=shapes, verbose=False, optimize=exporter == "dynamo")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return path, feeds


def cases() -> list[tuple[str, str]]:
    return [(name, exporter) for name, arch in ARCHITECTURES.items() for exporter in arch.exporters]
