"""The decoder families graphopt's LLM rewrites are held to (issue 17), as transformers configs.

One config per family, tiny (2 layers, hidden 64-128, random weights: the tests and the CPU
survey) or full-size (the TinyLlama-1.1B shape with the family's traits: GPU benchmarks). What
each family adds over the LLaMA/TinyLlama config the rewrites were developed on:

  llama    LLaMA-2 / TinyLlama / SmolLM: GQA, rotary (rotate_half), RMSNorm, SwiGLU
  llama3   rope_scaling "llama3" (inv_freq rescaled per band), 8 kv heads at full size, vocab 128k
  qwen2    bias on the q / k / v projections (none on o), tied embeddings
  mistral  sliding-window attention (the mask hides keys more than `sliding_window` behind)
  phi3     fused qkv_proj and gate_up_proj in the checkpoint (split by Slice / chunk in the graph),
           partial rotary (0.75 of the head, as Phi-4-mini)
  gemma    RMSNorm scaled by (1 + weight), GeGLU (gelu_pytorch_tanh), head_dim != hidden / heads,
           multi-query attention (1 kv head), embeddings scaled by sqrt(hidden)

`config(family, tiny)` builds the config; `model_class(family, causal_lm)` names the class;
`decode_steps` / `max_step_difference` run an export with past / present over a prefill and decode
steps in onnxruntime's CPU provider.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FAMILIES = ("llama", "llama3", "qwen2", "mistral", "phi3", "gemma")

_CLASSES = {"llama": "Llama", "llama3": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "phi3": "Phi3", "gemma": "Gemma"}

#: tiny shapes: (hidden, heads, kv heads, intermediate, vocab); Gemma's head_dim is set apart. Phi-3's head of 64:
#: its partial rotary (48 dims) is one onnxruntime's GroupQueryAttention rotates (half of it a multiple of 8)
_TINY = {"llama": (64, 4, 2, 128, 97), "llama3": (128, 8, 2, 256, 256), "qwen2": (64, 4, 2, 128, 97),
         "mistral": (64, 4, 2, 128, 97), "phi3": (128, 2, 1, 256, 97), "gemma": (64, 4, 1, 128, 97)}
#: the sliding window of the tiny Mistral: shorter than the tests' caches, so it hides keys
TINY_WINDOW = 8


def model_class(family: str, causal_lm: bool = True) -> str:
    return _CLASSES[family] + ("ForCausalLM" if causal_lm else "Model")


def config(family: str, tiny: bool = True) -> Any:
    """The family's transformers config (SDPA attention); unknown families raise KeyError."""
    import transformers

    prefix = _CLASSES[family]
    cls = getattr(transformers, prefix + "Config")
    if tiny:
        hidden, heads, kv_heads, intermediate, vocab = _TINY[family]
        common: dict[str, Any] = {"num_hidden_layers": 2, "hidden_size": hidden, "num_attention_heads": heads,
                                  "num_key_value_heads": kv_heads, "intermediate_size": intermediate, "vocab_size": vocab,
                                  "max_position_embeddings": 128}
    else:  # the TinyLlama-1.1B shape (issue 17's anchor) with the family's traits
        common = {"num_hidden_layers": 22, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
                  "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 4096}
    extra: dict[str, Any] = {}
    if family == "llama3":
        max_pos = common["max_position_embeddings"]
        extra = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": max_pos // 4}}
        if not tiny:
            extra |= {"num_key_value_heads": 8, "vocab_size": 128256}
    elif family == "qwen2":
        extra = {"tie_word_embeddings": True}
    elif family == "mistral":
        extra = {"sliding_window": TINY_WINDOW if tiny else 4096}
    elif family == "phi3":  # Phi-4-mini's partial rotary (Phi-3-mini rotates the whole head)
        extra = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}}
    elif family == "gemma":
        extra = {"head_dim": 32 if tiny else 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh"}
        if not tiny:
            extra |= {"num_attention_heads": 8, "num_key_value_heads": 1, "vocab_size": 256000, "intermediate_size": 16384,
                      "num_hidden_layers": 18}
    cfg = cls(**(common | extra), attn_implementation="sdpa")
    return cfg


def head_dim(cfg: Any) -> int:
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


# ----------------------------------------------------------------------------- decode steps in onnxruntime

SEQS = (6, 1, 1, 1, 1)  # a prefill of 6, then 4 one-token steps
BATCH, MAX_LENGTH = 2, 16


def decode_steps(model: Any, vocab: int, shared: bool, seqs: tuple[int, ...] = SEQS, batch: int = BATCH,
                 seed: int = 5) -> list[list[np.ndarray]]:
    """Each step's outputs (the hidden states, then the caches' valid part), in onnxruntime's CPU provider
    with graph optimizations off. shared: one MAX_LENGTH buffer per past/present pair, bound as both;
    else each step's presents are the next step's past."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    pasts = [n for n in inputs if n.startswith("past")]
    presents = {p: "present" + p[len("past"):] for p in pasts}
    meta = inputs[pasts[0]]
    kv_heads, head = meta.shape[1], meta.shape[3]
    float_type = np.float16 if "float16" in meta.type else np.float32
    cache = {p: ort.OrtValue.ortvalue_from_numpy(np.zeros((batch, kv_heads, MAX_LENGTH if shared else 0, head), float_type))
             for p in pasts}
    rng = np.random.default_rng(seed)
    results, total = [], 0
    for seq in seqs:
        total += seq
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", rng.integers(0, vocab, (batch, seq)).astype(np.int64))
        if "attention_mask" in inputs:
            binding.bind_cpu_input("attention_mask", np.ones((batch, total), np.int64))
        for past in pasts:
            binding.bind_ortvalue_input(past, cache[past])
        by_present = {presents[p]: cache[p] for p in pasts} if shared else {}
        for name in outputs:
            if name in by_present:
                binding.bind_ortvalue_output(name, by_present[name])
            else:
                binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        values = dict(zip(outputs, binding.get_outputs(), strict=True))
        if not shared:
            cache = {p: values[presents[p]] for p in pasts}
        step = [np.array(values[outputs[0]].numpy())] + [np.array(cache[p].numpy()[:, :, :total]) for p in pasts]
        results.append(step)
    return results


def max_step_difference(original: Any, optimized: Any, vocab: int, shared: bool) -> float:
    # onnxruntime's CPU kernel prefills over a shared buffer (past context given) at batch 1 only
    batch = 1 if shared else BATCH
    expected = decode_steps(original, vocab, shared=False, batch=batch)
    actual = decode_steps(optimized, vocab, shared=shared, batch=batch)
    return max(float(np.max(np.abs(a.astype(np.float32) - e.astype(np.float32)))) for es, as_ in zip(expected, actual, strict=True) for e, a in zip(es, as_, strict=True))
