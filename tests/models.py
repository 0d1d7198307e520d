"""Shared builders for the ONNX test and benchmark models.

Every builder constructs a torch model with seeded random weights (no model hub),
exports it to ONNX, checks the export against torch with onnxruntime, and caches
the result under ``<repo>/.cache/models/<key>/``::

    model.onnx          the exported model (plus ``model.onnx.data`` when the
                        exporter writes external data, see below)
    meta.json           how it was built: parameters, exporter, opset, export
                        time, files, node count, input specs, numeric check,
                        warnings the exporter raised

Builders return the Path of ``model.onnx``. A cached model is reused when its
``meta.json`` exists and was written by the same ``BUILDER_VERSION`` with the
same torch version; pass ``rebuild=True`` to force a rebuild.
Set ``GRAPHOPT_MODEL_CACHE`` to use another cache folder.

Exporters (``exporter=``):

* ``"torchscript"`` -- ``torch.onnx.export(dynamo=False)``, opset 17, dynamic
  axes for batch (and sequence). One self-contained file. Constant folding is on
  (the default), which already folds Conv+BatchNormalization (but not
  ConvTranspose+BatchNormalization).
* ``"dynamo"`` -- ``torch.onnx.export(dynamo=True)`` with the exporter's
  default opset (20 with torch 2.13) and ``dynamic_shapes`` for batch/seq. It
  writes its weights as external data (``model.onnx.data`` beside the model)
  by default, whatever the model size; we keep that. It also runs onnxscript's
  optimizer (``optimize=True``), which folds BatchNormalization into
  Conv/ConvTranspose and Pad into Conv, folds constants, and drops all-zero
  biases (see ``_perturb_1d_params``).
* ``"dynamo-noopt"`` -- the same without the exporter's optimizer
  (``optimize=False``): the raw graph with BatchNormalization, Pad, etc. still
  in it, which is what the CNN fusions need to be tested on. Note: a bias-free
  Conv gets a computed zero bias there, ``Expand(CastLike(0, x), Shape(w)[0:1])``
  (CastLike takes the activation ``x`` for its dtype), so a fusion that wants a
  constant bias must fold that first.

Random weights: transformers initializes biases to 0 and LayerNorm to (1, 0);
the transformers builders (BERT, GPT-2, ViT, LLaMA, T5 encoder, Whisper encoder)
add seeded noise to every 1-D parameter so that no exporter or optimizer can
exploit the zeros. BatchNorm layers (ResNet, MobileNet, small CNN) get
non-trivial running statistics and affine parameters.

Families: ``bert``, ``gpt2``, ``vit``, ``llama``, ``t5_encoder``,
``whisper_encoder`` (transformers, attention implementation per exporter in
``ATTN_IMPLEMENTATION``), ``resnet50_like``, ``mobilenet_like``, ``small_cnn``
(plain torch). Each has a ``*_tiny`` variant that builds in seconds; the
defaults are the base sizes. ``ZOO`` lists the tiny variant of every family for
both exporters (and "dynamo-noopt" for the CNNs), ``BENCH_MODELS`` the base-size
models of the GPU benchmarks, ``TINY_MODELS`` the original quick set.

``example_inputs(path)`` gives deterministic numpy feeds for any cached model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BUILDER_VERSION",
    "CACHE_DIR",
    "EXPORTERS",
    "ATTN_IMPLEMENTATION",
    "ExportFailed",
    "BENCH_MODELS",
    "bert",
    "bert_tiny",
    "example_inputs",
    "gpt2",
    "gpt2_tiny",
    "llama",
    "llama_tiny",
    "load_meta",
    "mobilenet_like",
    "mobilenet_tiny",
    "resnet50_like",
    "resnet_tiny",
    "single_file",
    "small_cnn",
    "t5_encoder",
    "t5_encoder_tiny",
    "TINY_MODELS",
    "vit",
    "vit_tiny",
    "whisper_encoder",
    "whisper_encoder_tiny",
    "ZOO",
]

BUILDER_VERSION = 2
REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = Path(os.environ.get("GRAPHOPT_MODEL_CACHE", REPO_ROOT / ".cache" / "models"))
EXPORTERS = ("dynamo", "torchscript", "dynamo-noopt")
TORCHSCRIPT_OPSET = 17
SEED = 0


class ExportFailed(RuntimeError):
    """The exporter raised, or the exported model disagrees with torch."""


# --------------------------------------------------------------------------- public builders


def bert(
    layers: int = 12,
    exporter: str = "dynamo",
    hidden: int = 768,
    heads: int = 12,
    seq: int = 128,
    batch: int = 1,
    *,
    intermediate: int | None = None,
    vocab: int = 30522,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """BertModel (encoder + pooler) from ``transformers.BertConfig``, random weights.

    Inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64,
    [batch, seq], both axes dynamic); outputs ``last_hidden_state``, ``pooler_output``.
    Attention implementation: transformers' default (sdpa).
    """
    intermediate = intermediate or 4 * hidden
    params = dict(layers=layers, hidden=hidden, heads=heads, intermediate=intermediate,
                  vocab=vocab, seq=seq, batch=batch)

    def make_module() -> Any:
        from transformers import BertConfig, BertModel

        cfg = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         intermediate_size=intermediate, vocab_size=vocab)
        inner = _perturb_1d_params(BertModel(cfg)).eval()
        return _hf_wrapper(inner, 2)

    spec = _Spec(
        family="bert",
        params=params,
        make_module=make_module,
        inputs=[
            _Input("input_ids", "int64", ["batch", "seq"], "ids", vocab),
            _Input("attention_mask", "int64", ["batch", "seq"], "mask"),
            _Input("token_type_ids", "int64", ["batch", "seq"], "zeros"),
        ],
        outputs=["last_hidden_state", "pooler_output"],
        output_axes={"last_hidden_state": ["batch", "seq"], "pooler_output": ["batch"]},
        dims={"batch": batch, "seq": seq},
        check_dims={"batch": 2, "seq": max(seq // 2 + 3, 5)},
    )
    return _build(spec, exporter, opset, rebuild)


def gpt2(
    layers: int = 12,
    exporter: str = "dynamo",
    hidden: int = 768,
    heads: int = 12,
    seq: int = 128,
    batch: int = 1,
    *,
    vocab: int = 50257,
    positions: int = 1024,
    lm_head: bool = True,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """GPT2LMHeadModel (or GPT2Model with ``lm_head=False``) from GPT2Config, use_cache=False.

    Inputs ``input_ids``, ``attention_mask`` (int64, [batch, seq], dynamic);
    output ``logits`` [batch, seq, vocab] (or ``last_hidden_state``).
    """
    params = dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, positions=positions,
                  lm_head=lm_head, seq=seq, batch=batch)
    out = "logits" if lm_head else "last_hidden_state"

    def make_module() -> Any:
        from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

        cfg = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab,
                         n_positions=positions, use_cache=False,
                         bos_token_id=min(50256, vocab - 1), eos_token_id=min(50256, vocab - 1))
        inner = _perturb_1d_params((GPT2LMHeadModel if lm_head else GPT2Model)(cfg)).eval()
        return _hf_wrapper(inner, 1)

    spec = _token_model_spec("gpt2", params, make_module, vocab, batch, seq, out)
    return _build(spec, exporter, opset, rebuild)


def resnet50_like(
    exporter: str = "dynamo",
    batch: int = 1,
    image: int = 224,
    *,
    blocks: tuple[int, ...] = (3, 4, 6, 3),
    width: int = 64,
    classes: int = 1000,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """A ResNet-50 (bottleneck blocks [3, 4, 6, 3]) in plain torch, eval mode.

    Conv+BN+ReLU everywhere, BatchNorm with non-trivial running statistics and
    affine parameters. Input ``pixel_values`` float32 [batch, 3, image, image]
    (batch dynamic); output ``logits`` [batch, classes].
    Note: ``exporter="dynamo"`` already folds every BN into its Conv, and
    ``"torchscript"`` folds Conv+BN too; use ``"dynamo-noopt"`` for a graph with BN.
    """
    params = dict(blocks=list(blocks), width=width, classes=classes, image=image, batch=batch)
    spec = _Spec(
        family="resnet50_like",
        params=params,
        make_module=lambda: _randomize_bn(_ResNet(blocks, width, classes)).eval(),
        inputs=[_Input("pixel_values", "float32", ["batch", 3, image, image], "normal")],
        outputs=["logits"],
        output_axes={"logits": ["batch"]},
        dims={"batch": batch},
        check_dims={"batch": 2},
    )
    return _build(spec, exporter, opset, rebuild)


def small_cnn(
    exporter: str = "dynamo-noopt",
    batch: int = 1,
    image: int = 32,
    *,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """A small CNN with the patterns CNN fusions care about, builds in seconds.

    Conv+BN+ReLU, grouped Conv+BN, depthwise Conv+BN+ReLU, ConvTranspose+BN,
    an explicit Pad followed by an unpadded Conv, and a MatMul+Add head
    (``flatten(x) @ W + b``, not nn.Linear, so it is not exported as Gemm).
    Default exporter is ``"dynamo-noopt"`` because both other exporters already
    fold some of these patterns (see the module docstring).
    Input ``x`` float32 [batch, 3, image, image] (batch dynamic); output ``y`` [batch, 10].
    """
    params = dict(image=image, batch=batch)
    spec = _Spec(
        family="small_cnn",
        params=params,
        make_module=lambda: _randomize_bn(_SmallCNN(image)).eval(),
        inputs=[_Input("x", "float32", ["batch", 3, image, image], "normal")],
        outputs=["y"],
        output_axes={"y": ["batch"]},
        dims={"batch": batch},
        check_dims={"batch": 2},
    )
    return _build(spec, exporter, opset, rebuild)


#: transformers' attention implementation ("sdpa" or "eager") each exporter gets by default,
#: per family (the builders' ``attn=None``). sdpa (transformers' default) wherever the
#: exporter copes. It is recorded in meta.json's params and ends the cache key.
#: T5 + dynamo: torch.onnx's decomposition of SDPA with T5's float bias yields strides
#: that the following ``reshape`` (traced as ``view``) rejects ("Cannot view a tensor
#: with shape [b, s, h, d] and strides ..."), with static shapes too -> eager.
ATTN_IMPLEMENTATION: dict[str, dict[str, str]] = {
    "vit": {"dynamo": "sdpa", "dynamo-noopt": "sdpa", "torchscript": "sdpa"},
    "llama": {"dynamo": "sdpa", "dynamo-noopt": "sdpa", "torchscript": "sdpa"},
    "t5_encoder": {"dynamo": "eager", "dynamo-noopt": "eager", "torchscript": "sdpa"},
    "whisper_encoder": {"dynamo": "sdpa", "dynamo-noopt": "sdpa", "torchscript": "sdpa"},
}


def _attn(family: str, exporter: str, attn: str | None) -> str:
    attn = attn or ATTN_IMPLEMENTATION[family].get(exporter, "sdpa")
    if attn not in ("sdpa", "eager"):
        raise ValueError(f"attn must be 'sdpa' or 'eager', not {attn!r}")
    return attn


def vit(
    layers: int = 12,
    exporter: str = "dynamo",
    hidden: int = 768,
    heads: int = 12,
    image: int = 224,
    patch: int = 16,
    batch: int = 1,
    *,
    intermediate: int | None = None,
    pooler: bool = True,
    attn: str | None = None,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """ViTModel (patch embedding + encoder + pooler) from ``transformers.ViTConfig``, random weights.

    Input ``pixel_values`` float32 [batch, 3, image, image] (batch dynamic); outputs
    ``last_hidden_state`` [batch, (image/patch)^2 + 1, hidden] and ``pooler_output``
    [batch, hidden] (dropped with ``pooler=False``). No attention mask.
    ``attn``: transformers' attention implementation, default from
    ``ATTN_IMPLEMENTATION`` (sdpa for every exporter).
    """
    intermediate = intermediate or 4 * hidden
    attn = _attn("vit", exporter, attn)
    params = dict(layers=layers, hidden=hidden, heads=heads, intermediate=intermediate,
                  image=image, patch=patch, pooler=pooler, batch=batch, attn=attn)
    outputs = ["last_hidden_state", "pooler_output"] if pooler else ["last_hidden_state"]

    def make_module() -> Any:
        from transformers import ViTConfig, ViTModel

        cfg = ViTConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                        intermediate_size=intermediate, image_size=image, patch_size=patch,
                        attn_implementation=attn)
        inner = _perturb_1d_params(ViTModel(cfg, add_pooling_layer=pooler)).eval()
        return _hf_wrapper(inner, len(outputs), inputs=("pixel_values",))

    spec = _Spec(
        family="vit",
        params=params,
        make_module=make_module,
        inputs=[_Input("pixel_values", "float32", ["batch", 3, image, image], "normal")],
        outputs=outputs,
        output_axes={o: ["batch"] for o in outputs},
        dims={"batch": batch},
        check_dims={"batch": 2},
    )
    return _build(spec, exporter, opset, rebuild)


def llama(
    layers: int = 4,
    exporter: str = "dynamo",
    hidden: int = 1024,
    heads: int = 16,
    kv_heads: int = 4,
    seq: int = 128,
    batch: int = 1,
    *,
    intermediate: int = 2816,
    vocab: int = 32000,
    positions: int = 2048,
    attn: str | None = None,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """LlamaModel (no LM head) from ``transformers.LlamaConfig``, use_cache=False, random weights.

    Grouped-query attention (``kv_heads`` < ``heads``: repeat_kv), rotary position
    embeddings, RMSNorm, SwiGLU MLP, no biases. Inputs ``input_ids``,
    ``attention_mask`` (int64, [batch, seq], both dynamic); output
    ``last_hidden_state`` [batch, seq, hidden]. The mask is always passed
    explicitly (without it transformers' mask helpers use ``aten::diff``, which
    the TorchScript exporter cannot export).
    ``attn``: transformers' attention implementation, default from
    ``ATTN_IMPLEMENTATION`` (sdpa for every exporter: with the explicit mask,
    the TorchScript exporter copes with sdpa too).
    """
    attn = _attn("llama", exporter, attn)
    params = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                  intermediate=intermediate, vocab=vocab, positions=positions, seq=seq,
                  batch=batch, attn=attn)

    def make_module() -> Any:
        from transformers import LlamaConfig, LlamaModel

        cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, intermediate_size=intermediate,
                          vocab_size=vocab, max_position_embeddings=positions, use_cache=False,
                          attn_implementation=attn)
        inner = _perturb_1d_params(LlamaModel(cfg)).eval()
        return _hf_wrapper(inner, 1, inputs=("input_ids", "attention_mask"), use_cache=False)

    spec = _token_model_spec("llama", params, make_module, vocab, batch, seq, "last_hidden_state")
    return _build(spec, exporter, opset, rebuild)


def t5_encoder(
    layers: int = 6,
    exporter: str = "dynamo",
    hidden: int = 512,
    heads: int = 8,
    seq: int = 128,
    batch: int = 1,
    *,
    d_ff: int = 2048,
    d_kv: int | None = None,
    vocab: int = 32128,
    attn: str | None = None,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """T5EncoderModel from ``transformers.T5Config`` (t5-small-like by default), random weights.

    Relative position bias (computed from the sequence length, added to the
    scores together with the mask), RMS-style T5LayerNorm, ReLU MLP, no biases,
    and no 1/sqrt(d) scaling of the scores. Inputs ``input_ids``,
    ``attention_mask`` (int64, [batch, seq], dynamic); output ``last_hidden_state``.
    ``attn``: transformers' attention implementation, default from
    ``ATTN_IMPLEMENTATION``: sdpa for "torchscript", eager for "dynamo" and
    "dynamo-noopt" (torch.onnx's dynamo exporter fails on T5 with sdpa, see there).
    """
    d_kv = d_kv or hidden // heads
    attn = _attn("t5_encoder", exporter, attn)
    params = dict(layers=layers, hidden=hidden, heads=heads, d_kv=d_kv, d_ff=d_ff, vocab=vocab,
                  seq=seq, batch=batch, attn=attn)

    def make_module() -> Any:
        from transformers import T5Config, T5EncoderModel

        cfg = T5Config(num_layers=layers, d_model=hidden, num_heads=heads, d_kv=d_kv, d_ff=d_ff,
                       vocab_size=vocab, use_cache=False, attn_implementation=attn)
        inner = _perturb_1d_params(T5EncoderModel(cfg)).eval()
        return _hf_wrapper(inner, 1, inputs=("input_ids", "attention_mask"))

    spec = _token_model_spec("t5_encoder", params, make_module, vocab, batch, seq, "last_hidden_state")
    return _build(spec, exporter, opset, rebuild)


def whisper_encoder(
    layers: int = 6,
    exporter: str = "dynamo",
    hidden: int = 512,
    heads: int = 8,
    batch: int = 1,
    *,
    ffn: int | None = None,
    mels: int = 80,
    positions: int = 1500,
    attn: str | None = None,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """WhisperModel's encoder (``WhisperEncoder``) from ``transformers.WhisperConfig`` (whisper-base-like).

    Two Conv1d+GELU (the second with stride 2), sinusoidal positions, pre-LN
    encoder layers (k_proj without bias), no attention mask. WhisperEncoder
    requires exactly ``2 * positions`` input frames, so only the batch is
    dynamic. Input ``input_features`` float32 [batch, mels, 2*positions];
    output ``last_hidden_state`` [batch, positions, hidden].
    ``attn``: transformers' attention implementation, default from
    ``ATTN_IMPLEMENTATION`` (sdpa for every exporter).
    """
    ffn = ffn or 4 * hidden
    frames = 2 * positions
    attn = _attn("whisper_encoder", exporter, attn)
    params = dict(layers=layers, hidden=hidden, heads=heads, ffn=ffn, mels=mels,
                  positions=positions, batch=batch, attn=attn)

    def make_module() -> Any:
        from transformers import WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = WhisperConfig(encoder_layers=layers, d_model=hidden, encoder_attention_heads=heads,
                            encoder_ffn_dim=ffn, num_mel_bins=mels, max_source_positions=positions,
                            use_cache=False, attn_implementation=attn)  # the decoder is never built
        inner = _perturb_1d_params(WhisperEncoder(cfg)).eval()
        return _hf_wrapper(inner, 1, inputs=("input_features",))

    spec = _Spec(
        family="whisper_encoder",
        params=params,
        make_module=make_module,
        inputs=[_Input("input_features", "float32", ["batch", mels, frames], "normal")],
        outputs=["last_hidden_state"],
        output_axes={"last_hidden_state": ["batch"]},
        dims={"batch": batch},
        check_dims={"batch": 2},
    )
    return _build(spec, exporter, opset, rebuild)


def mobilenet_like(
    exporter: str = "dynamo",
    batch: int = 1,
    image: int = 224,
    *,
    width_mult: float = 1.0,
    classes: int = 1000,
    opset: int | None = None,
    rebuild: bool = False,
) -> Path:
    """A MobileNetV2 (torchvision's topology) in plain torch, eval mode.

    Stem Conv3x3/2+BN+ReLU6, 17 inverted residual blocks (1x1 expand
    Conv+BN+ReLU6 -- absent in the first, expand-ratio-1 block --, depthwise
    3x3 Conv+BN+ReLU6, 1x1 project Conv+BN, residual Add where stride 1 and
    channels match), 1x1 Conv+BN+ReLU6 to 1280, global average pool, Linear.
    Channels are ``width_mult`` times torchvision's, rounded to multiples of 8.
    BatchNorm with non-trivial statistics (``_randomize_bn``). ReLU6 exports as Clip(0, 6).
    Input ``pixel_values`` float32 [batch, 3, image, image] (batch dynamic);
    output ``logits`` [batch, classes]. As for ``resnet50_like``, use
    ``"dynamo-noopt"`` for a graph that still has BatchNormalization.
    """
    params = dict(width_mult=width_mult, classes=classes, image=image, batch=batch)
    spec = _Spec(
        family="mobilenetv2_like",
        params=params,
        make_module=lambda: _randomize_bn(_MobileNetV2(width_mult, classes)).eval(),
        inputs=[_Input("pixel_values", "float32", ["batch", 3, image, image], "normal")],
        outputs=["logits"],
        output_axes={"logits": ["batch"]},
        dims={"batch": batch},
        check_dims={"batch": 2},
    )
    return _build(spec, exporter, opset, rebuild)


def bert_tiny(exporter: str = "dynamo", **kw: Any) -> Path:
    """2-layer BERT, hidden 64, 2 heads, vocab 1000, seq 16 (a few seconds to build)."""
    kw = {"layers": 2, "hidden": 64, "heads": 2, "seq": 16, "vocab": 1000, **kw}
    return bert(exporter=exporter, **kw)


def gpt2_tiny(exporter: str = "dynamo", **kw: Any) -> Path:
    """2-layer GPT-2, hidden 64, 2 heads, vocab 1000, 128 positions, seq 16."""
    kw = {"layers": 2, "hidden": 64, "heads": 2, "seq": 16, "vocab": 1000, "positions": 128, **kw}
    return gpt2(exporter=exporter, **kw)


def resnet_tiny(exporter: str = "dynamo-noopt", **kw: Any) -> Path:
    """ResNet-50 topology at width 8, 32x32 images, 10 classes."""
    kw = {"width": 8, "image": 32, "classes": 10, **kw}
    return resnet50_like(exporter=exporter, **kw)


def vit_tiny(exporter: str = "dynamo", **kw: Any) -> Path:
    """2-layer ViT, hidden 64, 2 heads, 32x32 images, patch 8 (16 patches + CLS)."""
    kw = {"layers": 2, "hidden": 64, "heads": 2, "image": 32, "patch": 8, **kw}
    return vit(exporter=exporter, **kw)


def llama_tiny(exporter: str = "dynamo", **kw: Any) -> Path:
    """2-layer LLaMA, hidden 64, 4 heads, 2 kv heads, intermediate 128, vocab 1000, 128 positions, seq 16."""
    kw = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128,
          "vocab": 1000, "positions": 128, "seq": 16, **kw}
    return llama(exporter=exporter, **kw)


def t5_encoder_tiny(exporter: str = "dynamo", **kw: Any) -> Path:
    """2-layer T5 encoder, d_model 64, 4 heads (d_kv 16), d_ff 128, vocab 1000, seq 16."""
    kw = {"layers": 2, "hidden": 64, "heads": 4, "d_ff": 128, "vocab": 1000, "seq": 16, **kw}
    return t5_encoder(exporter=exporter, **kw)


def whisper_encoder_tiny(exporter: str = "dynamo", **kw: Any) -> Path:
    """2-layer Whisper encoder, d_model 64, 2 heads, ffn 256, 80 mels, 32 positions (input [batch, 80, 64])."""
    kw = {"layers": 2, "hidden": 64, "heads": 2, "mels": 80, "positions": 32, **kw}
    return whisper_encoder(exporter=exporter, **kw)


def mobilenet_tiny(exporter: str = "dynamo-noopt", **kw: Any) -> Path:
    """MobileNetV2 topology at width 0.25, 32x32 images, 10 classes."""
    kw = {"width_mult": 0.25, "image": 32, "classes": 10, **kw}
    return mobilenet_like(exporter=exporter, **kw)


#: name -> builder (keyword arguments such as rebuild=True pass through), for the tests and ``--quick`` benchmarks.
TINY_MODELS: dict[str, Callable[..., Path]] = {
    "bert-tiny-dynamo": lambda **kw: bert_tiny("dynamo", **kw),
    "bert-tiny-torchscript": lambda **kw: bert_tiny("torchscript", **kw),
    "gpt2-tiny-dynamo": lambda **kw: gpt2_tiny("dynamo", **kw),
    "gpt2-tiny-torchscript": lambda **kw: gpt2_tiny("torchscript", **kw),
    "small-cnn-dynamo-noopt": lambda **kw: small_cnn("dynamo-noopt", **kw),
    "small-cnn-dynamo": lambda **kw: small_cnn("dynamo", **kw),
    "small-cnn-torchscript": lambda **kw: small_cnn("torchscript", **kw),
    "resnet-tiny-dynamo-noopt": lambda **kw: resnet_tiny("dynamo-noopt", **kw),
}


def _zoo() -> dict[str, Callable[..., Path]]:
    tiny = {"bert": bert_tiny, "gpt2": gpt2_tiny, "llama": llama_tiny, "vit": vit_tiny,
            "t5-encoder": t5_encoder_tiny, "whisper-encoder": whisper_encoder_tiny,
            "resnet": resnet_tiny, "mobilenet": mobilenet_tiny}
    zoo: dict[str, Callable[..., Path]] = {}
    for name, fn in tiny.items():
        exporters = EXPORTERS if name in ("resnet", "mobilenet") else ("dynamo", "torchscript")
        for exp in exporters:
            zoo[f"{name}-tiny-{exp}"] = lambda fn=fn, exp=exp, **kw: fn(exp, **kw)
    return zoo


#: tiny version of every model family, for every exporter it supports (plus "dynamo-noopt"
#: for the CNNs): name -> builder, like TINY_MODELS. Each builds in seconds on a CPU.
ZOO: dict[str, Callable[..., Path]] = _zoo()


def _bench() -> dict[str, Callable[..., Path]]:
    base: dict[str, tuple[Callable[..., Path], dict[str, Any], tuple[str, ...]]] = {
        "bert-base-b8-s128": (bert, dict(batch=8, seq=128), ("dynamo", "torchscript")),
        "gpt2-b1-s512": (gpt2, dict(batch=1, seq=512), ("dynamo", "torchscript")),
        "llama-L4-H1024-b8-s128": (llama, dict(batch=8, seq=128), ("dynamo", "torchscript")),
        "vit-base-b8": (vit, dict(batch=8), ("dynamo", "torchscript")),
        "resnet50-b32": (resnet50_like, dict(batch=32), EXPORTERS),
    }
    return {f"{name}-{exp}": (lambda fn=fn, p=p, exp=exp, **kw: fn(exporter=exp, **{**p, **kw}))
            for name, (fn, p, exps) in base.items() for exp in exps}


#: the base-size models of the GPU benchmarks: name -> builder (keywords pass through).
#: BERT-base b8 s128, GPT-2 (124M, LM head) b1 s512, LLaMA (4 layers, hidden 1024, 16 heads,
#: 4 kv heads) b8 s128, ViT-base/16 224x224 b8, ResNet-50 224x224 b32. Batch and sequence
#: axes are dynamic; these sizes are the export sizes and ``example_inputs``' defaults.
BENCH_MODELS: dict[str, Callable[..., Path]] = _bench()


# --------------------------------------------------------------------------- helpers for users


def load_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The meta.json written beside a built model."""
    return json.loads((Path(path).parent / "meta.json").read_text())


def example_inputs(
    path: str | os.PathLike[str], *, seed: int = SEED, **dims: int
) -> dict[str, np.ndarray]:
    """Deterministic onnxruntime feeds for a built model.

    Dynamic dimensions default to the sizes the model was exported with; override
    them by name, e.g. ``example_inputs(p, batch=2, seq=40)``. Attention masks
    are all ones except that, when batch > 1, the last row pads its final quarter.
    """
    meta = load_meta(path)
    sizes = {**meta["dims"], **dims}
    return _make_feeds(meta["inputs"], sizes, np.random.default_rng(seed))


def single_file(path: str | os.PathLike[str]) -> Path:
    """A copy of the model with all weights inline (``model.single.onnx``), < 2 GB only.

    Returns ``path`` itself when it has no external data already.
    """
    path = Path(path)
    if not load_meta(path)["external_data"]:
        return path
    out = path.with_name("model.single.onnx")
    if not out.exists():
        import onnx

        with _lock(path.parent.name + ".single"):
            if not out.exists():
                model = onnx.load(str(path))
                tmp = out.with_name(out.name + f".tmp{os.getpid()}")
                onnx.save(model, str(tmp))
                os.replace(tmp, out)
    return out


# --------------------------------------------------------------------------- internals


@dataclasses.dataclass(frozen=True)
class _Input:
    name: str
    dtype: str
    shape: list[int | str]
    fill: str  # "ids" (uniform in [0, high)), "mask", "zeros", "normal"
    high: int = 0


@dataclasses.dataclass
class _Spec:
    family: str
    params: dict[str, Any]
    make_module: Callable[[], Any]
    inputs: list[_Input]
    outputs: list[str]
    output_axes: dict[str, list[str]]
    dims: dict[str, int]  # sizes used for the export
    check_dims: dict[str, int]  # other sizes, to check that dynamic axes really are dynamic

    def key(self, exporter: str, opset: int | None) -> str:
        p = self.params
        if self.family in ("bert", "gpt2"):
            k = f"{self.family}-L{p['layers']}-H{p['hidden']}-A{p['heads']}-V{p['vocab']}-S{p['seq']}-B{p['batch']}"
            if self.family == "bert" and p["intermediate"] != 4 * p["hidden"]:
                k += f"-I{p['intermediate']}"
            if self.family == "gpt2" and not p["lm_head"]:
                k += "-nohead"
        elif self.family == "resnet50_like":
            k = f"resnet50like-W{p['width']}-{''.join(map(str, p['blocks']))}-C{p['classes']}-R{p['image']}-B{p['batch']}"
        elif self.family == "vit":
            k = f"vit-L{p['layers']}-H{p['hidden']}-A{p['heads']}-P{p['patch']}-R{p['image']}-B{p['batch']}"
            if p["intermediate"] != 4 * p["hidden"]:
                k += f"-I{p['intermediate']}"
            if not p["pooler"]:
                k += "-nopool"
            k += f"-{p['attn']}"
        elif self.family == "llama":
            k = (f"llama-L{p['layers']}-H{p['hidden']}-A{p['heads']}-KV{p['kv_heads']}-I{p['intermediate']}"
                 f"-V{p['vocab']}-P{p['positions']}-S{p['seq']}-B{p['batch']}-{p['attn']}")
        elif self.family == "t5_encoder":
            k = (f"t5enc-L{p['layers']}-H{p['hidden']}-A{p['heads']}-D{p['d_kv']}-F{p['d_ff']}"
                 f"-V{p['vocab']}-S{p['seq']}-B{p['batch']}-{p['attn']}")
        elif self.family == "whisper_encoder":
            k = (f"whisperenc-L{p['layers']}-H{p['hidden']}-A{p['heads']}-F{p['ffn']}-M{p['mels']}"
                 f"-P{p['positions']}-B{p['batch']}-{p['attn']}")
        elif self.family == "mobilenetv2_like":
            k = f"mobilenetv2like-W{p['width_mult']:g}-C{p['classes']}-R{p['image']}-B{p['batch']}"
        else:
            k = f"{self.family}-R{p['image']}-B{p['batch']}"
        return f"{k}-{exporter}" + (f"-op{opset}" if opset else "")



def _token_model_spec(family: str, params: dict[str, Any], make_module: Callable[[], Any], vocab: int,
                      batch: int, seq: int, output: str) -> _Spec:
    """The spec of a model fed input_ids and attention_mask [batch, seq] with one [batch, seq, ...] output."""
    return _Spec(
        family=family,
        params=params,
        make_module=make_module,
        inputs=[
            _Input("input_ids", "int64", ["batch", "seq"], "ids", vocab),
            _Input("attention_mask", "int64", ["batch", "seq"], "mask"),
        ],
        outputs=[output],
        output_axes={output: ["batch", "seq"]},
        dims={"batch": batch, "seq": seq},
        check_dims={"batch": 2, "seq": max(seq // 2 + 3, 5)},
    )


def _make_feeds(inputs: list[dict[str, Any]], sizes: dict[str, int],
                rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in inputs:
        shape = [sizes[d] if isinstance(d, str) else d for d in spec["shape"]]
        dtype = np.dtype(spec["dtype"])
        fill = spec["fill"]
        if fill == "ids":
            arr = rng.integers(0, spec["high"], size=shape).astype(dtype)
        elif fill == "mask":
            arr = np.ones(shape, dtype=dtype)
            if shape[0] > 1 and shape[-1] > 3:
                arr[-1, shape[-1] - shape[-1] // 4:] = 0
        elif fill == "zeros":
            arr = np.zeros(shape, dtype=dtype)
        else:
            arr = rng.standard_normal(shape).astype(dtype)
        feeds[spec["name"]] = arr
    return feeds


def _hf_wrapper(inner: Any, n_out: int, inputs: tuple[str, ...] | None = None, **call_kw: Any) -> Any:
    """Wrap a transformers model: explicit positional inputs, a tuple of tensors out.

    The forward signature names the inputs (torch.export's ``dynamic_shapes`` is
    keyed by argument name). Without ``inputs``: BERT (``n_out == 2``) takes
    ``input_ids, attention_mask, token_type_ids``, GPT-2 ``input_ids,
    attention_mask``. Otherwise ``inputs`` is one of ``("input_ids",
    "attention_mask")``, ``("pixel_values",)``, ``("input_features",)``;
    ``call_kw`` (e.g. ``use_cache=False``) is passed to the model on every call.
    """
    import torch

    def pick(out: Any) -> Any:
        return tuple(out[:n_out]) if n_out > 1 else out[0]

    if inputs == ("pixel_values",):

        class PixelWrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, pixel_values: Any) -> Any:
                return pick(self.inner(pixel_values=pixel_values, return_dict=False, **call_kw))

        return PixelWrapper().eval()

    if inputs == ("input_features",):

        class AudioWrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_features: Any) -> Any:
                return pick(self.inner(input_features=input_features, return_dict=False, **call_kw))

        return AudioWrapper().eval()

    if inputs is not None and inputs != ("input_ids", "attention_mask"):
        raise ValueError(f"no wrapper for inputs {inputs}")

    if inputs is None and n_out == 2:  # BertModel

        class BertWrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                return pick(self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                       token_type_ids=token_type_ids, return_dict=False))

        return BertWrapper().eval()

    class GPT2Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return pick(self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                   return_dict=False, **call_kw))

    return GPT2Wrapper().eval()


def _versions() -> dict[str, str]:
    import onnx
    import torch

    v = {"torch": torch.__version__, "onnx": onnx.__version__}
    with contextlib.suppress(ImportError):
        import transformers

        v["transformers"] = transformers.__version__
    return v


@contextlib.contextmanager
def _lock(key: str) -> Iterator[None]:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _cached(meta_path: Path) -> bool:
    if not meta_path.exists():
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        return False
    if meta.get("builder_version") != BUILDER_VERSION:
        return False
    import torch  # versions checked lazily: only torch's (transformers is cheap to ask)

    return meta.get("versions", {}).get("torch") == torch.__version__


def _build(spec: _Spec, exporter: str, opset: int | None, rebuild: bool) -> Path:
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, not {exporter!r}")
    key = spec.key(exporter, opset)
    final = CACHE_DIR / key
    if not rebuild and _cached(final / "meta.json"):
        return final / "model.onnx"
    with _lock(key):
        if not rebuild and _cached(final / "meta.json"):
            return final / "model.onnx"
        tmp = CACHE_DIR / f".{key}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            meta = _export_and_check(spec, exporter, opset, tmp / "model.onnx")
            meta["key"] = key
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final / "model.onnx"


def _warning_lines(caught: list[warnings.WarningMessage]) -> list[str]:
    seen: dict[str, None] = {}
    for w in caught:
        first = str(w.message).strip().splitlines()[0] if str(w.message).strip() else ""
        seen.setdefault(f"{w.category.__name__}: {first[:300]}", None)
    return list(seen)


def _export_and_check(spec: _Spec, exporter: str, opset: int | None, out: Path) -> dict[str, Any]:
    import onnx
    import torch

    t_start = time.perf_counter()
    torch.manual_seed(SEED)
    module = spec.make_module()
    rng = np.random.default_rng(SEED)
    in_dicts = [dataclasses.asdict(i) for i in spec.inputs]
    feeds = _make_feeds(in_dicts, spec.dims, rng)
    args = tuple(torch.from_numpy(feeds[i.name]) for i in spec.inputs)
    input_names = [i.name for i in spec.inputs]
    t_model = time.perf_counter() - t_start

    meta: dict[str, Any] = {
        "builder_version": BUILDER_VERSION,
        "family": spec.family,
        "exporter": exporter,
        "params": spec.params,
        "dims": spec.dims,
        "inputs": in_dicts,
        "outputs": spec.outputs,
        "versions": _versions(),
        "model_build_seconds": round(t_model, 3),
    }

    dynamic_error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        if exporter == "torchscript":
            opset_used = opset or TORCHSCRIPT_OPSET
            axes: dict[str, dict[int, str]] = {}
            for i in spec.inputs:
                axes[i.name] = {k: d for k, d in enumerate(i.shape) if isinstance(d, str)}
            for name, dnames in spec.output_axes.items():
                axes[name] = dict(enumerate(dnames))
            try:
                torch.onnx.export(module, args, str(out), dynamo=False, opset_version=opset_used,
                                  input_names=input_names, output_names=spec.outputs,
                                  dynamic_axes=axes)
            except Exception as e:  # noqa: BLE001 - re-raised with context
                raise ExportFailed(f"{spec.family} torchscript export failed: {_first_line(e)}") from e
            dynamic = True
        else:
            dyn_names = sorted({d for i in spec.inputs for d in i.shape if isinstance(d, str)})
            dim_objs = {d: torch.export.Dim(d) for d in dyn_names}
            # keyed by forward()'s argument names, which are the ONNX input names
            dyn_shapes = {i.name: {k: dim_objs[d] for k, d in enumerate(i.shape) if isinstance(d, str)}
                          for i in spec.inputs}
            kwargs = dict(dynamo=True, opset_version=opset, input_names=input_names,
                          output_names=spec.outputs, optimize=(exporter == "dynamo"), verbose=False)
            try:
                torch.onnx.export(module, args, str(out), dynamic_shapes=dyn_shapes, **kwargs)
                dynamic = True
            except Exception as e:  # noqa: BLE001 - recorded, then retried with static shapes
                dynamic_error = _first_line(e)
                print(f"[models] {spec.family} {exporter}: dynamic-shape export failed "
                      f"({dynamic_error}); exporting with static shapes", file=sys.stderr)
                for p in out.parent.iterdir():
                    p.unlink()
                try:
                    torch.onnx.export(module, args, str(out), **kwargs)
                except Exception as e2:  # noqa: BLE001
                    raise ExportFailed(f"{spec.family} {exporter} export failed: {_first_line(e2)}") from e2
                dynamic = False
        t_export = time.perf_counter() - t0
    meta["export_seconds"] = round(t_export, 3)
    meta["export_warnings"] = _warning_lines(caught)
    meta["dynamic"] = dynamic
    meta["dynamic_error"] = dynamic_error

    files = sorted(p.name for p in out.parent.iterdir())
    meta["files"] = {f: (out.parent / f).stat().st_size for f in files}
    meta["external_data"] = any(f != "model.onnx" for f in files)
    proto = onnx.load(str(out), load_external_data=False)
    meta["opset"] = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    meta["node_count"] = len(proto.graph.node)
    meta["op_counts"] = dict(Counter(n.op_type for n in proto.graph.node).most_common())
    meta["initializers"] = len(proto.graph.initializer)
    meta["parameters"] = int(sum(p.numel() for p in module.parameters()))
    meta["graph_inputs"] = [_vi(v) for v in proto.graph.input]
    meta["graph_outputs"] = [_vi(v) for v in proto.graph.output]
    del proto

    t0 = time.perf_counter()
    meta["check"] = _check(module, out, in_dicts, spec, dynamic)
    meta["check_seconds"] = round(time.perf_counter() - t0, 3)
    meta["build_seconds"] = round(time.perf_counter() - t_start, 3)
    if not meta["check"]["export_shape"]["ok"]:
        raise ExportFailed(f"{spec.family} {exporter}: ONNX output differs from torch: "
                           f"{meta['check']['export_shape']}")
    return meta


def _check(module: Any, path: Path, in_dicts: list[dict[str, Any]], spec: _Spec,
           dynamic: bool) -> dict[str, Any]:
    """Run the export in onnxruntime against torch, at the export sizes and others."""
    import onnxruntime as ort
    import torch

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    result: dict[str, Any] = {}
    cases = {"export_shape": spec.dims}
    if dynamic:
        cases["other_shape"] = {**spec.dims, **spec.check_dims}
    for case, sizes in cases.items():
        feeds = _make_feeds(in_dicts, sizes, np.random.default_rng(SEED + 1))
        with torch.no_grad():
            ref = module(*(torch.from_numpy(feeds[i["name"]]) for i in in_dicts))
        ref = ref if isinstance(ref, tuple) else (ref,)
        try:
            got = sess.run(None, feeds)
        except Exception as e:  # noqa: BLE001 - recorded: a dynamic axis that is not dynamic
            result[case] = {"ok": False, "sizes": sizes, "error": _first_line(e)}
            continue
        diffs = []
        ok = True
        for r, g in zip(ref, got):
            r = r.numpy()
            if r.shape != g.shape:
                ok = False
                diffs.append(f"shape {g.shape} != {r.shape}")
                continue
            d = float(np.max(np.abs(r - g))) if r.size else 0.0
            diffs.append(d)
            ok = ok and bool(np.allclose(g, r, rtol=1e-3, atol=1e-4))
        result[case] = {"ok": ok, "sizes": sizes, "max_abs_diff": diffs}
    return result


def _vi(v: Any) -> dict[str, Any]:
    t = v.type.tensor_type
    return {"name": v.name, "elem_type": t.elem_type,
            "shape": [d.dim_param or d.dim_value for d in t.shape.dim]}


def _first_line(e: BaseException) -> str:
    """First line of the error; for a wrapped error (torch.onnx's), also its root cause's."""
    def one(x: BaseException) -> str:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(x)).strip()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return f"{type(x).__name__}: {lines[0][:400] if lines else ''}"

    root = e
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    return one(e) if root is e else f"{one(e)} <- caused by {one(root)}"


# --------------------------------------------------------------------------- torch models


def _perturb_1d_params(model: Any) -> Any:
    """Add seeded noise (std 0.02) to every 1-D parameter: biases and LayerNorm scales/shifts.

    transformers initializes biases to 0 and LayerNorm to (1, 0). Exported as is,
    exporters and optimizers may drop the zero biases (the dynamo exporter turns
    GPT-2's addmm into a Gemm without C), which trained models never allow.
    """
    import torch

    g = torch.Generator().manual_seed(SEED + 11)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def _randomize_bn(model: Any) -> Any:
    """Give every BatchNorm non-trivial running stats and affine params (seeded)."""
    import torch

    g = torch.Generator().manual_seed(SEED + 7)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return model


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> Any:
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout))


def _ResNet(blocks: tuple[int, ...], width: int, classes: int) -> Any:
    import torch
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, stride: int) -> None:
            super().__init__()
            cout = mid * 4
            self.a = _conv_bn(cin, mid, 1)
            self.b = _conv_bn(mid, mid, 3, stride)
            self.c = _conv_bn(mid, cout, 1)
            self.down = _conv_bn(cin, cout, 1, stride) if (stride != 1 or cin != cout) else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.a(x))
            y = torch.relu(self.b(y))
            y = self.c(y)
            return torch.relu(y + (self.down(x) if self.down is not None else x))

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = _conv_bn(3, width, 7, 2)
            self.pool = nn.MaxPool2d(3, 2, 1)
            layers, cin = [], width
            for i, n in enumerate(blocks):
                mid = width * 2**i
                for j in range(n):
                    layers.append(Bottleneck(cin, mid, 2 if (j == 0 and i > 0) else 1))
                    cin = mid * 4
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, classes)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            x = self.pool(torch.relu(self.stem(pixel_values)))
            x = self.layers(x)
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return ResNet()


def _SmallCNN(image: int) -> Any:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class SmallCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(3, 16, 3, padding=1)  # with bias
            self.b1 = nn.BatchNorm2d(16)
            self.g2 = nn.Conv2d(16, 32, 3, padding=1, groups=4, bias=False)  # grouped
            self.b2 = nn.BatchNorm2d(32)
            self.d3 = nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32)  # depthwise
            self.b3 = nn.BatchNorm2d(32)
            self.t4 = nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.b4 = nn.BatchNorm2d(16)
            self.c5 = nn.Conv2d(16, 8, 3, padding=0)  # after an explicit Pad
            self.w = nn.Parameter(torch.randn(8 * image * image, 10) * 0.02)
            self.bias = nn.Parameter(torch.randn(10) * 0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.relu(self.b1(self.c1(x)))
            x = self.b2(self.g2(x))
            x = F.relu(self.b3(self.d3(x)))
            x = F.relu(self.b4(self.t4(x)))
            x = F.relu(self.c5(F.pad(x, (1, 1, 1, 1))))
            return torch.matmul(torch.flatten(x, 1), self.w) + self.bias

    return SmallCNN()


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: nearest multiple of ``divisor``, never below 90% of ``v``."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _MobileNetV2(width_mult: float, classes: int) -> Any:
    import torch
    import torch.nn as nn

    def conv_bn_relu6(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> Any:
        return nn.Sequential(*_conv_bn(cin, cout, k, stride, groups), nn.ReLU6())

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
            super().__init__()
            mid = cin * expand
            layers = [conv_bn_relu6(cin, mid, 1)] if expand != 1 else []
            layers += [conv_bn_relu6(mid, mid, 3, stride, groups=mid), _conv_bn(mid, cout, 1)]
            self.block = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.block(x) if self.residual else self.block(x)

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # expand ratio t, channels c, repeats n, first stride s
            settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                        (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
            cin = _make_divisible(32 * width_mult)
            last = _make_divisible(1280 * max(1.0, width_mult))
            layers = [conv_bn_relu6(3, cin, 3, 2)]
            for t, c, n, s in settings:
                cout = _make_divisible(c * width_mult)
                for i in range(n):
                    layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                    cin = cout
            layers.append(conv_bn_relu6(cin, last, 1))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(last, classes)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            x = self.features(pixel_values)
            return self.classifier(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return MobileNetV2()


if __name__ == "__main__":  # python tests/models.py [name ...]: build and print meta summaries
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=list(TINY_MODELS),
                    help=f"from TINY_MODELS, ZOO or BENCH_MODELS: {sorted({**TINY_MODELS, **ZOO, **BENCH_MODELS})}")
    ap.add_argument("--rebuild", action="store_true")
    a = ap.parse_args()
    for name in a.names:
        p = {**TINY_MODELS, **ZOO, **BENCH_MODELS}[name](rebuild=a.rebuild)
        m = load_meta(p)
        print(f"{name}: {p} nodes={m['node_count']} export={m['export_seconds']}s "
              f"build={m['build_seconds']}s external_data={m['external_data']} "
              f"dynamic={m['dynamic']} check={m['check']}")
