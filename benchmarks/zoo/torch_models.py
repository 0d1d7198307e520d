"""Zoo models exported with torch.onnx.export: the dynamo exporter and the TorchScript one.

Transformers models are made from small configs (random weights, no hub); a diffusion
UNet block and an LSTM/GRU tagger are written here in torch. Sizes are small so that the
whole zoo builds in minutes on two cores, but each keeps its architecture: layer types,
attention form (GQA, rotary, relative positions), normalization and activations, and
thus the export forms a real model of the family has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TORCH_MODELS", "TorchModel", "export_torch"]

SEED = 14
TEXT_SEQ = 128
VOCAB = 256
# One small transformer shape for every text family: 2 layers, hidden 64, 2 heads of 32
# (GQA: 1 key/value head), feed-forward 4 x hidden. Small enough that the zoo's files stay
# near 40 MB (they travel to the GPU machine); the export forms are those of full size.
H, HEADS, FF, LAYERS = 64, 2, 256, 2


@dataclass(frozen=True)
class TorchModel:
    name: str
    exporter: str                      # "dynamo" or "torchscript"
    family: str
    make: Callable[[], tuple[Any, dict[str, np.ndarray]]]   # -> (eval module, ordered inputs)
    opset: int | None = None           # None: the exporter's default


# ----------------------------------------------------------------------------- inputs

def _ids(batch: int = 1, seq: int = TEXT_SEQ, vocab: int = VOCAB) -> np.ndarray:
    return np.random.default_rng(SEED).integers(3, vocab, (batch, seq)).astype(np.int64)


def _mask(batch: int = 1, seq: int = TEXT_SEQ) -> np.ndarray:
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - seq // 8:] = 0       # some padding, so masks matter
    return mask


def _pixels(size: int, channels: int = 3, batch: int = 1) -> np.ndarray:
    return np.random.default_rng(SEED).standard_normal((batch, channels, size, size)).astype(np.float32)


# ----------------------------------------------------------------------------- wrappers

def _wrap(inner: Any, names: tuple[str, ...], **call_kw: Any) -> Any:
    """A module taking the inputs positionally and returning the model's first output."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> Any:
            out = self.inner(**dict(zip(names, args)), return_dict=False, **call_kw)
            return out[0]

    return Wrapped().eval()


def _text(model_cls: str, config_cls: str, names: tuple[str, ...] = ("input_ids", "attention_mask"),
          call_kw: dict[str, Any] | None = None, **config: Any) -> Callable[[], tuple[Any, dict[str, np.ndarray]]]:
    def make() -> tuple[Any, dict[str, np.ndarray]]:
        import torch
        import transformers

        torch.manual_seed(SEED)
        cfg = getattr(transformers, config_cls)(**config)
        inner = getattr(transformers, model_cls)(cfg).eval()
        feeds = {"input_ids": _ids(), "attention_mask": _mask(), "token_type_ids": np.zeros((1, TEXT_SEQ), np.int64),
                 "decoder_input_ids": _ids(seq=TEXT_SEQ // 2)}
        return _wrap(inner, names, **(call_kw or {})), {n: feeds[n] for n in names}
    return make


def _vision(model_cls: str, config_cls: str, size: int, channels: int = 3, **config: Any) -> Callable[[], tuple[Any, dict[str, np.ndarray]]]:
    def make() -> tuple[Any, dict[str, np.ndarray]]:
        import torch
        import transformers

        torch.manual_seed(SEED)
        inner = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config)).eval()
        _randomize_norm_stats(inner)
        return _wrap(inner, ("pixel_values",)), {"pixel_values": _pixels(size, channels)}
    return make


def _randomize_norm_stats(module: Any) -> None:
    """Fresh BatchNorm statistics are 0 and 1, which hides a wrong fold: give them values."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)


_BERT_LIKE = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=FF, max_position_embeddings=TEXT_SEQ + 4)
_LLM = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            num_key_value_heads=1, intermediate_size=FF, max_position_embeddings=2 * TEXT_SEQ)
_NO_CACHE = {"use_cache": False}
_IDS = ("input_ids", "attention_mask")


# ----------------------------------------------------------------------------- hand-written torch models

def _unet_block() -> tuple[Any, dict[str, np.ndarray]]:
    """A Stable-Diffusion-style UNet block: ResNet block (GroupNorm + SiLU + Conv, time
    embedding), then a spatial transformer (GroupNorm, self- and cross-attention, GEGLU FF)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class ResBlock(nn.Module):
        def __init__(self, c: int, t: int) -> None:
            super().__init__()
            self.n1, self.c1 = nn.GroupNorm(8, c), nn.Conv2d(c, c, 3, padding=1)
            self.t = nn.Linear(t, c)
            self.n2, self.c2 = nn.GroupNorm(8, c), nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x: Any, temb: Any) -> Any:
            h = self.c1(F.silu(self.n1(x))) + self.t(F.silu(temb))[:, :, None, None]
            return x + self.c2(F.silu(self.n2(h)))

    class GEGLU(nn.Module):
        def __init__(self, d: int, inner: int) -> None:
            super().__init__()
            self.proj = nn.Linear(d, inner * 2)

        def forward(self, x: Any) -> Any:
            a, gate = self.proj(x).chunk(2, dim=-1)
            return a * F.gelu(gate)

    class Transformer(nn.Module):
        def __init__(self, c: int, ctx: int, heads: int) -> None:
            super().__init__()
            self.norm, self.proj_in, self.proj_out = nn.GroupNorm(8, c), nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)
            self.ln1, self.ln2, self.ln3 = nn.LayerNorm(c), nn.LayerNorm(c), nn.LayerNorm(c)
            self.attn1 = nn.MultiheadAttention(c, heads, batch_first=True)
            self.attn2 = nn.MultiheadAttention(c, heads, kdim=ctx, vdim=ctx, batch_first=True)
            self.ff = nn.Sequential(GEGLU(c, 4 * c), nn.Linear(4 * c, c))

        def forward(self, x: Any, context: Any) -> Any:
            b, c, hh, ww = x.shape
            h = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)
            n = self.ln1(h)
            h = h + self.attn1(n, n, n, need_weights=False)[0]
            n = self.ln2(h)
            h = h + self.attn2(n, context, context, need_weights=False)[0]
            h = h + self.ff(self.ln3(h))
            return x + self.proj_out(h.transpose(1, 2).reshape(b, c, hh, ww))

    class UNetBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.res = ResBlock(64, 128)
            self.tr = Transformer(64, 96, 4)
            self.down = nn.Conv2d(64, 64, 3, stride=2, padding=1)

        def forward(self, sample: Any, temb: Any, context: Any) -> Any:
            return self.down(self.tr(self.res(sample, temb), context))

    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    feeds = {"sample": rng.standard_normal((1, 64, 32, 32)).astype(np.float32),
             "temb": rng.standard_normal((1, 128)).astype(np.float32),
             "context": rng.standard_normal((1, 16, 96)).astype(np.float32)}
    return UNetBlock().eval(), feeds


def _rnn_tagger() -> tuple[Any, dict[str, np.ndarray]]:
    """A speech/text tagger: Conv1d front end, 2-layer bidirectional LSTM, GRU, Linear."""
    import torch
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(40, 64, 3, padding=1)
            self.lstm = nn.LSTM(64, 64, num_layers=2, bidirectional=True, batch_first=True)
            self.gru = nn.GRU(128, 64, batch_first=True)
            self.out = nn.Linear(64, 32)

        def forward(self, features: Any) -> Any:
            h = torch.relu(self.conv(features)).transpose(1, 2)
            h, _ = self.lstm(h)
            h, _ = self.gru(h)
            return self.out(h).log_softmax(-1)

    torch.manual_seed(SEED)
    return Tagger().eval(), {"features": np.random.default_rng(SEED).standard_normal((1, 40, 100)).astype(np.float32)}


def _whisper(part: str) -> Callable[[], tuple[Any, dict[str, np.ndarray]]]:
    def make() -> tuple[Any, dict[str, np.ndarray]]:
        import torch
        import transformers

        torch.manual_seed(SEED)
        cfg = transformers.WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                         encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FF,
                                         decoder_ffn_dim=FF, max_source_positions=100, max_target_positions=64,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        model = transformers.WhisperModel(cfg).eval()
        rng = np.random.default_rng(SEED)
        if part == "encoder":
            return _wrap(model.encoder, ("input_features",)), {"input_features": rng.standard_normal((1, 80, 200)).astype(np.float32)}
        return (_wrap(model.decoder, ("input_ids", "encoder_hidden_states"), use_cache=False),
                {"input_ids": _ids(seq=32), "encoder_hidden_states": rng.standard_normal((1, 100, H)).astype(np.float32)})
    return make


def _segformer() -> tuple[Any, dict[str, np.ndarray]]:
    import torch
    import transformers

    torch.manual_seed(SEED)
    cfg = transformers.SegformerConfig(num_encoder_blocks=4, depths=[1, 1, 1, 1], sr_ratios=[8, 4, 2, 1], hidden_sizes=[16, 32, 48, 96],
                                       num_attention_heads=[1, 2, 4, 8], decoder_hidden_size=64, num_labels=8)
    inner = transformers.SegformerForSemanticSegmentation(cfg).eval()
    _randomize_norm_stats(inner)
    return _wrap(inner, ("pixel_values",)), {"pixel_values": _pixels(128)}


def _clip(part: str) -> Callable[[], tuple[Any, dict[str, np.ndarray]]]:
    def make() -> tuple[Any, dict[str, np.ndarray]]:
        import torch
        import transformers

        torch.manual_seed(SEED)
        common = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF, hidden_act="quick_gelu")
        if part == "text":
            cfg = transformers.CLIPTextConfig(vocab_size=VOCAB, max_position_embeddings=77, **common)
            ids = _ids(seq=77)
            return _wrap(transformers.CLIPTextModel(cfg).eval(), ("input_ids",)), {"input_ids": ids}
        cfg = transformers.CLIPVisionConfig(image_size=96, patch_size=16, **common)
        return _wrap(transformers.CLIPVisionModel(cfg).eval(), ("pixel_values",)), {"pixel_values": _pixels(96)}
    return make


def _wav2vec2() -> tuple[Any, dict[str, np.ndarray]]:
    import torch
    import transformers

    torch.manual_seed(SEED)
    cfg = transformers.Wav2Vec2Config(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
                                      conv_dim=(64, 64, 64, 64, 64), conv_stride=(5, 2, 2, 2, 2), conv_kernel=(10, 3, 3, 2, 2),
                                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32)
    wave = np.random.default_rng(SEED).standard_normal((1, 16000)).astype(np.float32)
    return _wrap(transformers.Wav2Vec2Model(cfg).eval(), ("input_values",)), {"input_values": wave}


_SMALL_VIT = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF, image_size=96, patch_size=16)

TORCH_MODELS: list[TorchModel] = [
    # encoders
    TorchModel("bert-dynamo", "dynamo", "BERT", _text("BertModel", "BertConfig", ("input_ids", "attention_mask", "token_type_ids"), **_BERT_LIKE)),
    TorchModel("bert-torchscript", "torchscript", "BERT", _text("BertModel", "BertConfig", ("input_ids", "attention_mask", "token_type_ids"), **_BERT_LIKE)),
    TorchModel("roberta-torchscript", "torchscript", "RoBERTa", _text("RobertaModel", "RobertaConfig", pad_token_id=1, **_BERT_LIKE)),
    TorchModel("distilbert-dynamo", "dynamo", "DistilBERT",
               _text("DistilBertModel", "DistilBertConfig", vocab_size=VOCAB, dim=H, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FF)),
    TorchModel("deberta-v2-torchscript", "torchscript", "DeBERTa-v2", _text("DebertaV2Model", "DebertaV2Config", **_BERT_LIKE)),
    TorchModel("electra-dynamo", "dynamo", "ELECTRA", _text("ElectraModel", "ElectraConfig", embedding_size=32, **_BERT_LIKE)),
    # decoders
    TorchModel("gpt2-dynamo", "dynamo", "GPT-2", _text("GPT2Model", "GPT2Config", call_kw=_NO_CACHE, vocab_size=VOCAB, n_embd=H,
                                                     n_layer=LAYERS, n_head=HEADS, n_positions=TEXT_SEQ)),
    TorchModel("gpt2-torchscript", "torchscript", "GPT-2", _text("GPT2Model", "GPT2Config", call_kw=_NO_CACHE, vocab_size=VOCAB, n_embd=H,
                                                               n_layer=LAYERS, n_head=HEADS, n_positions=TEXT_SEQ)),
    TorchModel("opt-torchscript", "torchscript", "OPT", _text("OPTModel", "OPTConfig", call_kw=_NO_CACHE, vocab_size=VOCAB, hidden_size=H,
                                                            num_hidden_layers=LAYERS, ffn_dim=FF, num_attention_heads=HEADS,
                                                            word_embed_proj_dim=H, max_position_embeddings=TEXT_SEQ)),
    TorchModel("llama-dynamo", "dynamo", "LLaMA (GQA, rotary)", _text("LlamaModel", "LlamaConfig", call_kw=_NO_CACHE, **_LLM)),
    TorchModel("llama-torchscript", "torchscript", "LLaMA (GQA, rotary)", _text("LlamaModel", "LlamaConfig", call_kw=_NO_CACHE, **_LLM)),
    TorchModel("qwen2-dynamo", "dynamo", "Qwen2 (GQA, rotary, qkv bias)", _text("Qwen2Model", "Qwen2Config", call_kw=_NO_CACHE, **_LLM)),
    TorchModel("mistral-torchscript", "torchscript", "Mistral (GQA, rotary)", _text("MistralModel", "MistralConfig", call_kw=_NO_CACHE, **_LLM)),
    TorchModel("phi3-dynamo", "dynamo", "Phi-3 (fused qkv, rotary)", _text("Phi3Model", "Phi3Config", call_kw=_NO_CACHE, pad_token_id=0, **_LLM)),
    TorchModel("gemma-dynamo", "dynamo", "Gemma (GQA, rotary, GeGLU)", _text("GemmaModel", "GemmaConfig", call_kw=_NO_CACHE, head_dim=H // HEADS, **_LLM)),
    # encoder-decoders
    TorchModel("t5-dynamo", "dynamo", "T5 (encoder+decoder)", _text("T5Model", "T5Config", ("input_ids", "attention_mask", "decoder_input_ids"),
                                                                   call_kw=_NO_CACHE, vocab_size=VOCAB, d_model=H, d_kv=H // HEADS, d_ff=FF,
                                                                   num_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0)),
    TorchModel("t5-torchscript", "torchscript", "T5 (encoder+decoder)", _text("T5Model", "T5Config", ("input_ids", "attention_mask", "decoder_input_ids"),
                                                                   call_kw=_NO_CACHE, vocab_size=VOCAB, d_model=H, d_kv=H // HEADS, d_ff=FF,
                                                                   num_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0)),
    TorchModel("bart-torchscript", "torchscript", "BART (encoder+decoder)",
               _text("BartModel", "BartConfig", ("input_ids", "attention_mask", "decoder_input_ids"), call_kw=_NO_CACHE,
                     vocab_size=VOCAB, d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                     decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=TEXT_SEQ)),
    TorchModel("whisper-encoder-dynamo", "dynamo", "Whisper encoder", _whisper("encoder")),
    TorchModel("whisper-decoder-torchscript", "torchscript", "Whisper decoder", _whisper("decoder")),
    TorchModel("whisper-decoder-dynamo", "dynamo", "Whisper decoder", _whisper("decoder")),
    # vision transformers
    TorchModel("vit-dynamo", "dynamo", "ViT", _vision("ViTModel", "ViTConfig", 96, **_SMALL_VIT)),
    TorchModel("deit-torchscript", "torchscript", "DeiT", _vision("DeiTModel", "DeiTConfig", 96, **_SMALL_VIT)),
    TorchModel("swin-dynamo", "dynamo", "Swin", _vision("SwinModel", "SwinConfig", 128, image_size=128, patch_size=4, embed_dim=32,
                                                        depths=[1, 1, 2], num_heads=[1, 2, 4], window_size=4)),
    TorchModel("swin-torchscript", "torchscript", "Swin", _vision("SwinModel", "SwinConfig", 128, image_size=128, patch_size=4, embed_dim=32,
                                                        depths=[1, 1, 2], num_heads=[1, 2, 4], window_size=4)),
    TorchModel("beit-dynamo", "dynamo", "BEiT (relative position bias)",
               _vision("BeitModel", "BeitConfig", 96, use_relative_position_bias=True, **_SMALL_VIT)),
    TorchModel("beit-torchscript", "torchscript", "BEiT (relative position bias)",
               _vision("BeitModel", "BeitConfig", 96, use_relative_position_bias=True, **_SMALL_VIT)),
    TorchModel("dinov2-dynamo", "dynamo", "DINOv2", _vision("Dinov2Model", "Dinov2Config", 98, hidden_size=H, num_hidden_layers=LAYERS,
                                                            num_attention_heads=HEADS, mlp_ratio=2, image_size=98, patch_size=14)),
    TorchModel("clip-text-torchscript", "torchscript", "CLIP text (QuickGELU)", _clip("text")),
    TorchModel("clip-vision-dynamo", "dynamo", "CLIP vision (QuickGELU)", _clip("vision")),
    TorchModel("segformer-dynamo", "dynamo", "SegFormer", _segformer),
    TorchModel("wav2vec2-torchscript", "torchscript", "Wav2Vec2", _wav2vec2),
    # CNNs
    TorchModel("convnext-dynamo", "dynamo", "ConvNeXt", _vision("ConvNextModel", "ConvNextConfig", 128, hidden_sizes=[16, 32, 64, 128],
                                                                depths=[1, 1, 2, 1])),
    TorchModel("resnet-torchscript", "torchscript", "ResNet (bottleneck)",
               _vision("ResNetModel", "ResNetConfig", 128, embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1],
                       layer_type="bottleneck")),
    TorchModel("resnet-dynamo", "dynamo", "ResNet (basic)",
               _vision("ResNetModel", "ResNetConfig", 128, embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                       layer_type="basic")),
    TorchModel("mobilenetv2-dynamo", "dynamo", "MobileNetV2 (ReLU6)", _vision("MobileNetV2Model", "MobileNetV2Config", 128, depth_multiplier=0.35, finegrained_output=False)),
    TorchModel("efficientnet-torchscript", "torchscript", "EfficientNet (SiLU, squeeze-excite)",
               _vision("EfficientNetModel", "EfficientNetConfig", 128, width_coefficient=0.35, depth_coefficient=0.5, image_size=128,
                       hidden_dim=448)),
    TorchModel("regnet-dynamo", "dynamo", "RegNet (group conv, squeeze-excite)",
               _vision("RegNetModel", "RegNetConfig", 128, embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1],
                       groups_width=8, layer_type="y")),
    # written in torch
    TorchModel("unet-block-dynamo", "dynamo", "diffusion UNet block (GroupNorm+SiLU, GEGLU)", _unet_block),
    TorchModel("rnn-tagger-torchscript", "torchscript", "LSTM + GRU tagger", _rnn_tagger),
]


def _perturb_vectors(module: Any) -> None:
    """Freshly initialized biases are 0 and norm scales 1, which an optimizer may drop
    (x + 0, x * 1) where a trained model's would stay: give every 1-D parameter noise."""
    import torch

    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def export_torch(model: TorchModel, out: Path) -> dict[str, Any]:
    """Export ``model`` to ``out`` (one file); returns the inputs and torch's outputs for the check."""
    import onnx
    import torch

    module, feeds = model.make()
    _perturb_vectors(module)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with torch.no_grad():
        expected = module(*args)
    expected_list = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    tmp = out.with_suffix(".export.onnx")
    if model.exporter == "torchscript":
        torch.onnx.export(module, args, str(tmp), dynamo=False, opset_version=model.opset or 17,
                          input_names=list(feeds), output_names=[f"output_{i}" for i in range(len(expected_list))])
    else:
        torch.onnx.export(module, args, str(tmp), dynamo=True, opset_version=model.opset, input_names=list(feeds),
                          output_names=[f"output_{i}" for i in range(len(expected_list))], verbose=False)
    proto = onnx.load(str(tmp))     # pulls in external data, if the exporter wrote any
    onnx.save(proto, str(out))
    for p in out.parent.iterdir():
        if p.name.startswith(tmp.name):
            p.unlink()
    return {"inputs": feeds, "expected": [t.detach().numpy() for t in expected_list]}
