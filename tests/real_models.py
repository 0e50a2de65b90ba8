"""Real PyTorch models people train, built from small configs with random
weights: Hugging Face ``transformers`` models and ``torch.nn`` recurrent,
attention and vision models. Each case says how to build the model, how to
make a training batch, and how one training step computes its loss, so the
models matrix (``benchmarks/models_matrix.py``) and the slow tests drive them
the same way.

A case's ``step(model, batch)`` returns the loss tensor. Hugging Face models
get ``labels=`` and compute the loss inside ``forward``; the ``torch.nn``
models compute it after the forward, as a plain loop does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Batch = dict[str, torch.Tensor]

VOCAB = 97


@dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator, int], Batch]  # (generator, batch index) -> batch
    step: Callable[[nn.Module, Batch], torch.Tensor]
    needs: str = ""  # an extra package the case imports ("transformers")
    # its batches are padded to their longest sequence, so their lengths differ:
    # one graph must serve them all (a symbolic sequence length)
    varies: bool = False


def _tokens(g: torch.Generator, b: int, t: int, pad_last: int = 0) -> Batch:
    """Token ids and an attention mask; the last `pad_last` tokens of the second
    sequence are padding (mask 0)."""
    ids = torch.randint(1, VOCAB, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.int64)
    if pad_last:
        mask[1, t - pad_last :] = 0
        ids[1, t - pad_last :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _hf_step(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch).loss


# -- Hugging Face transformers ---------------------------------------------------------------
def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    return GPT2LMHeadModel(cfg)


def _lm_batch(g: torch.Generator, i: int) -> Batch:
    batch = _tokens(g, 4, 12 - 3 * i, pad_last=3)
    labels = batch["input_ids"].clone()
    labels[batch["attention_mask"] == 0] = -100
    return {**batch, "labels": labels}


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=3,
    )
    return BertForSequenceClassification(cfg)


def _classify_batch(g: torch.Generator, i: int) -> Batch:
    batch = _tokens(g, 4, 12 - 3 * i, pad_last=4)
    return {**batch, "labels": torch.randint(0, 3, (4,), generator=g)}


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return T5ForConditionalGeneration(cfg)


def _seq2seq_batch(g: torch.Generator, i: int) -> Batch:
    batch = _tokens(g, 4, 10 - 2 * i, pad_last=2)
    labels = torch.randint(1, VOCAB, (4, 6 - i), generator=g)
    labels[2, 4:] = -100
    return {**batch, "labels": labels}


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=5,
    )
    return ViTForImageClassification(cfg)


def _image_batch(size: int) -> Callable[[torch.Generator, int], Batch]:
    def batch(g: torch.Generator, i: int) -> Batch:
        return {
            "pixel_values": torch.randn(4, 3, size, size, generator=g),
            "labels": torch.randint(0, 5, (4,), generator=g),
        }

    return batch


def _resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)
    return ResNetForImageClassification(cfg)


def _convnext() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(
        num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5, image_size=32
    )
    return ConvNextForImageClassification(cfg)


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(cfg)


# -- torch.nn models ----------------------------------------------------------------------------
class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(24, 3)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(input_ids))
        return self.head(out[:, -1])


class GRUTagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.gru = nn.GRU(16, 12, bidirectional=True)  # sequence first
        self.head = nn.Linear(24, 5)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(input_ids).transpose(0, 1))
        return self.head(out.transpose(0, 1))


class TransformerClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 3)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(input_ids), src_key_padding_mask=padding_mask)
        return self.head(h.mean(dim=1))


class AttentionPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 24)
        self.attn = nn.MultiheadAttention(24, 3, dropout=0.1, batch_first=True)
        self.head = nn.Linear(24, 3)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        out, _ = self.attn(h, h, h, key_padding_mask=padding_mask)
        return self.head(out[:, 0])


class ConvAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.GroupNorm(2, 8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.GroupNorm(4, 16),
            nn.ReLU(),
        )
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.refine = nn.Sequential(
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(),
            nn.Upsample(size=(16, 16), mode="bilinear", align_corners=False),
            nn.Conv2d(8, 3, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.refine(self.up(self.enc(x)))


def _sequence_batch(labels_per_token: bool) -> Callable[[torch.Generator, int], Batch]:
    def batch(g: torch.Generator, i: int) -> Batch:
        t = 10 - 2 * i
        ids = torch.randint(1, VOCAB, (4, t), generator=g)
        shape = (4, t) if labels_per_token else (4,)
        return {"input_ids": ids, "y": torch.randint(0, 5 if labels_per_token else 3, shape)}

    return batch


def _padded_batch(g: torch.Generator, i: int) -> Batch:
    t = 10 - 2 * i
    ids = torch.randint(1, VOCAB, (4, t), generator=g)
    padding = torch.zeros(4, t, dtype=torch.bool)
    padding[1, t - 3 :] = True
    padding[3, t - 4 :] = True
    return {"input_ids": ids, "padding_mask": padding, "y": torch.randint(0, 3, (4,))}


def _ce_step(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "y"}
    logits = model(**inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["y"].reshape(-1))


def _autoencoder_batch(g: torch.Generator, i: int) -> Batch:
    return {"x": torch.randn(4, 3, 16, 16, generator=g)}


def _mse_step(model: nn.Module, batch: Batch) -> torch.Tensor:
    return F.mse_loss(model(batch["x"]), batch["x"])


CASES: list[ModelCase] = [
    ModelCase("gpt2", _gpt2, _lm_batch, _hf_step, "transformers", varies=True),
    ModelCase("bert", _bert, _classify_batch, _hf_step, "transformers", varies=True),
    ModelCase("t5", _t5, _seq2seq_batch, _hf_step, "transformers", varies=True),
    ModelCase("vit", _vit, _image_batch(16), _hf_step, "transformers"),
    ModelCase("resnet", _resnet, _image_batch(32), _hf_step, "transformers"),
    ModelCase("convnext", _convnext, _image_batch(32), _hf_step, "transformers"),
    ModelCase("llama", _llama, _lm_batch, _hf_step, "transformers", varies=True),
    ModelCase("lstm_classifier", LSTMClassifier, _sequence_batch(False), _ce_step, varies=True),
    ModelCase("gru_tagger", GRUTagger, _sequence_batch(True), _ce_step, varies=True),
    ModelCase("transformer_encoder", TransformerClassifier, _padded_batch, _ce_step, varies=True),
    ModelCase("multihead_attention", AttentionPool, _padded_batch, _ce_step, varies=True),
    ModelCase("conv_autoencoder", ConvAutoencoder, _autoencoder_batch, _mse_step),
]


def _hf(config: str, model: str, **fields: Any) -> Callable[[], nn.Module]:
    """A Hugging Face model class built from a small config, by name."""

    def build() -> nn.Module:
        import transformers

        return getattr(transformers, model)(getattr(transformers, config)(**fields))

    return build


_SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 40,
}

# Families no issue names: the matrix tries them (`--extra`) so that support
# built from the ops' meaning is seen to reach them; the suite does not run them.
EXTRA_CASES: list[ModelCase] = [
    ModelCase(
        "roberta",
        _hf(
            "RobertaConfig",
            "RobertaForSequenceClassification",
            num_labels=3,
            pad_token_id=1,
            **_SMALL,
        ),
        _classify_batch,
        _hf_step,
        "transformers",
        varies=True,
    ),
    ModelCase(
        "distilbert",
        _hf(
            "DistilBertConfig",
            "DistilBertForSequenceClassification",
            vocab_size=VOCAB,
            dim=32,
            n_layers=2,
            n_heads=2,
            hidden_dim=64,
            max_position_embeddings=40,
            num_labels=3,
        ),
        _classify_batch,
        _hf_step,
        "transformers",
        varies=True,
    ),
    ModelCase(
        "opt",
        _hf(
            "OPTConfig",
            "OPTForCausalLM",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            ffn_dim=64,
            num_attention_heads=2,
            max_position_embeddings=40,
            word_embed_proj_dim=32,
        ),
        _lm_batch,
        _hf_step,
        "transformers",
        varies=True,
    ),
    ModelCase(
        "qwen2",
        _hf("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=1, **_SMALL),
        _lm_batch,
        _hf_step,
        "transformers",
        varies=True,
    ),
    ModelCase(
        "mistral",
        _hf("MistralConfig", "MistralForCausalLM", num_key_value_heads=1, **_SMALL),
        _lm_batch,
        _hf_step,
        "transformers",
        varies=True,
    ),
    ModelCase(
        "gpt_neox",
        _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", **_SMALL),
        _lm_batch,
        _hf_step,
        "transformers",
        varies=True,
    ),
    ModelCase(
        "bart",
        _hf(
            "BartConfig",
            "BartForConditionalGeneration",
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=40,
        ),
        _seq2seq_batch,
        _hf_step,
        "transformers",
    ),
    ModelCase(
        "deit",
        _hf(
            "DeiTConfig",
            "DeiTForImageClassification",
            image_size=16,
            patch_size=4,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            num_labels=5,
        ),
        _image_batch(16),
        _hf_step,
        "transformers",
    ),
]


def _pixels_only(g: torch.Generator, i: int) -> Batch:
    """Images and no labels: a self-supervised loss (ViT-MAE's reconstruction)."""
    return {"pixel_values": torch.randn(4, 3, 16, 16, generator=g)}


def _audio_batch(g: torch.Generator, i: int) -> Batch:
    """Raw audio (400 samples) and a class per clip."""
    return {
        "input_values": torch.randn(4, 400, generator=g),
        "labels": torch.randint(0, 3, (4,), generator=g),
    }


_SEQ2SEQ_SMALL = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 40,
}
_IMAGE_16 = {"image_size": 16, "num_channels": 3, "num_labels": 5}


def _text(name: str, config: str, model: str, **fields: Any) -> ModelCase:
    return ModelCase(
        name, _hf(config, model, **fields), _classify_batch, _hf_step, "transformers", True
    )


def _lm(name: str, config: str, model: str, **fields: Any) -> ModelCase:
    return ModelCase(name, _hf(config, model, **fields), _lm_batch, _hf_step, "transformers", True)


def _image(name: str, config: str, model: str, size: int, **fields: Any) -> ModelCase:
    return ModelCase(
        name, _hf(config, model, **fields), _image_batch(size), _hf_step, "transformers"
    )


# More families no issue names (first tried 2026-11-28; each passed on the
# torch, ONNX and TensorFlow targets, most on JAX too, after the fixes they
# brought: shared layers, bool sums, random draws, writes through views of
# views and of whole tensors, vector and weight norms, sorting).
EXTRA_CASES += [
    _text("albert", "AlbertConfig", "AlbertForSequenceClassification", embedding_size=16,
          num_labels=3, **_SMALL),
    _text("electra", "ElectraConfig", "ElectraForSequenceClassification", embedding_size=16,
          num_labels=3, **_SMALL),
    _text("mpnet", "MPNetConfig", "MPNetForSequenceClassification", num_labels=3, **_SMALL),
    _text("xlm_roberta", "XLMRobertaConfig", "XLMRobertaForSequenceClassification",
          num_labels=3, pad_token_id=1, **_SMALL),
    _text("roformer", "RoFormerConfig", "RoFormerForSequenceClassification", num_labels=3,
          embedding_size=32, **_SMALL),
    _text("squeezebert", "SqueezeBertConfig", "SqueezeBertForSequenceClassification",
          num_labels=3, embedding_size=32, q_groups=2, k_groups=2, v_groups=2,
          post_attention_groups=2, intermediate_groups=2, output_groups=2, **_SMALL),
    _text("funnel", "FunnelConfig", "FunnelForSequenceClassification", vocab_size=VOCAB,
          d_model=32, n_head=2, d_head=16, d_inner=64, block_sizes=[1, 1],
          num_decoder_layers=1, num_labels=3),
    _lm("gemma", "GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1, head_dim=16, **_SMALL),
    _lm("phi", "PhiConfig", "PhiForCausalLM", **_SMALL),
    _lm("falcon", "FalconConfig", "FalconForCausalLM", vocab_size=VOCAB, hidden_size=32,
        num_hidden_layers=2, num_attention_heads=2),
    _lm("bloom", "BloomConfig", "BloomForCausalLM", vocab_size=VOCAB, hidden_size=32, n_layer=2,
        n_head=2),
    _lm("gptj", "GPTJConfig", "GPTJForCausalLM", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2,
        rotary_dim=8, n_positions=40),
    _lm("gpt_bigcode", "GPTBigCodeConfig", "GPTBigCodeForCausalLM", vocab_size=VOCAB, n_embd=32,
        n_layer=2, n_head=2, n_positions=40),
    _lm("gpt_neo", "GPTNeoConfig", "GPTNeoForCausalLM", vocab_size=VOCAB, hidden_size=32,
        num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]], window_size=4,
        max_position_embeddings=40),
    _lm("xglm", "XGLMConfig", "XGLMForCausalLM", vocab_size=VOCAB, d_model=32, num_layers=2,
        attention_heads=2, ffn_dim=64, max_position_embeddings=40),
    *(
        ModelCase(name, _hf(config, model, **_SEQ2SEQ_SMALL, **extra), _seq2seq_batch,
                  _hf_step, "transformers")
        for name, config, model, extra in [
            ("mbart", "MBartConfig", "MBartForConditionalGeneration", {}),
            ("pegasus", "PegasusConfig", "PegasusForConditionalGeneration", {}),
            ("marian", "MarianConfig", "MarianMTModel",
             {"pad_token_id": 0, "decoder_start_token_id": 0}),
            ("blenderbot_small", "BlenderbotSmallConfig",
             "BlenderbotSmallForConditionalGeneration", {}),
        ]
    ),
    _image("swin", "SwinConfig", "SwinForImageClassification", 16, patch_size=2, embed_dim=16,
           depths=[1, 1], num_heads=[2, 2], window_size=2, **_IMAGE_16),
    _image("beit", "BeitConfig", "BeitForImageClassification", 16, patch_size=4, hidden_size=32,
           num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
           use_relative_position_bias=True, **_IMAGE_16),
    _image("dinov2", "Dinov2Config", "Dinov2ForImageClassification", 16, patch_size=4,
           hidden_size=32, num_hidden_layers=2, num_attention_heads=2, **_IMAGE_16),
    _image("convnextv2", "ConvNextV2Config", "ConvNextV2ForImageClassification", 32,
           num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5),
    _image("regnet", "RegNetConfig", "RegNetForImageClassification", 32, embedding_size=8,
           hidden_sizes=[8, 16], depths=[1, 1], groups_width=4, num_labels=5),
    _image("mobilevit", "MobileViTConfig", "MobileViTForImageClassification", 32, image_size=32,
           patch_size=2, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48],
           num_labels=5),
    _image("segformer", "SegformerConfig", "SegformerForImageClassification", 32,
           num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
           num_attention_heads=[1, 2], patch_sizes=[3, 3], strides=[2, 2],
           decoder_hidden_size=16, num_labels=5),
    _image("levit", "LevitConfig", "LevitForImageClassification", 32, image_size=32,
           patch_size=16, hidden_sizes=[16, 24, 32], num_attention_heads=[1, 2, 2],
           depths=[1, 1, 1], key_dim=[8, 8, 8],
           down_ops=[["Subsample", 8, 1, 4, 2, 2], ["Subsample", 8, 2, 4, 2, 2]], num_labels=5),
    _image("poolformer", "PoolFormerConfig", "PoolFormerForImageClassification", 32,
           hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3],
           strides=[4, 2], padding=[2, 1], num_labels=5),
    _image("mobilenet_v2_hf", "MobileNetV2Config", "MobileNetV2ForImageClassification", 32,
           image_size=32, depth_multiplier=0.35, num_labels=5),
    ModelCase("vit_mae", _hf("ViTMAEConfig", "ViTMAEForPreTraining", image_size=16, patch_size=4,
              num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, decoder_hidden_size=32, decoder_num_hidden_layers=1,
              decoder_num_attention_heads=2, decoder_intermediate_size=64),
              _pixels_only, _hf_step, "transformers"),
    ModelCase("wav2vec2", _hf("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification",
              vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, num_labels=3,
              mask_time_prob=0.0), _audio_batch, _hf_step, "transformers"),
]  # fmt: skip

# Tried first on 2026-11-28 (afternoon), on the ONNX and TensorFlow targets: each
# passed as it came but HuBERT, whose SpecAugment masking (mask_time_prob's
# default, hidden[mask] = masked_spec_embed) needed index_put by a mask with one row.
_ONE_KV = {"num_key_value_heads": 1, **_SMALL}
_IMAGE_32 = {"image_size": 32, "num_channels": 3, "num_labels": 5}
EXTRA_CASES += [
    _lm("codegen", "CodeGenConfig", "CodeGenForCausalLM", vocab_size=VOCAB, n_embd=32, n_layer=2,
        n_head=2, n_positions=40, rotary_dim=8),
    _lm("stablelm", "StableLmConfig", "StableLmForCausalLM", **_ONE_KV),
    _lm("biogpt", "BioGptConfig", "BioGptForCausalLM", **_SMALL),
    _lm("olmo", "OlmoConfig", "OlmoForCausalLM", **_ONE_KV),
    _lm("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", **_ONE_KV),
    _lm("phi3", "Phi3Config", "Phi3ForCausalLM", pad_token_id=0, **_ONE_KV),
    _lm("gemma2", "Gemma2Config", "Gemma2ForCausalLM", head_dim=16, **_ONE_KV),
    _lm("mamba", "MambaConfig", "MambaForCausalLM", vocab_size=VOCAB, hidden_size=32,
        num_hidden_layers=2, state_size=4, expand=2, conv_kernel=4),
    _text("megatron_bert", "MegatronBertConfig", "MegatronBertForSequenceClassification",
          num_labels=3, **_SMALL),
    _image("mobilenet_v1", "MobileNetV1Config", "MobileNetV1ForImageClassification", 32,
           depth_multiplier=0.25, **_IMAGE_32),
    _image("swinv2", "Swinv2Config", "Swinv2ForImageClassification", 16, patch_size=2,
           embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=2, **_IMAGE_16),
    _image("focalnet", "FocalNetConfig", "FocalNetForImageClassification", 32, embed_dim=16,
           depths=[1, 1], **_IMAGE_32),
    ModelCase("hubert", _hf("HubertConfig", "HubertForSequenceClassification", num_labels=3,
              hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2),
              _audio_batch, _hf_step, "transformers"),
]  # fmt: skip


def _fixed_classify_batch(g: torch.Generator, i: int) -> Batch:
    """Like _classify_batch at one length (12) and unpadded: Nystromformer's
    landmarks split a sequence of its config's segment_means_seq_len only,
    and its landmark scores do not broadcast against a padding mask."""
    batch = _tokens(g, 4, 12)
    return {"input_ids": batch["input_ids"], "labels": torch.randint(0, 3, (4,), generator=g)}


# Tried first on 2026-11-28 (evening), on all four targets: each passed after the
# fixes they brought (ConvBERT: im2col; Nystromformer, XLNet: eye; BiT: batch
# norm without running statistics; CvT: views in the batch-dim replay).
# DeBERTa's loss is named in two cases, and its default (the labelled rows
# picked by (labels >= 0).nonzero(): a count symbol) in a third; CvtStage indexes its
# drop-path rates by stage, so stage k needs a depth above k. EfficientFormer
# is gone from this transformers (5.24).
EXTRA_CASES += [
    # mixture-of-experts (2026-11-29): transformers' default grouped_mm experts
    # (histc, _grouped_mm, an inverse permutation into empty_like), and the
    # per-expert loop (nonzero per expert: a count symbol each)
    _lm("mixtral", "MixtralConfig", "MixtralForCausalLM", num_key_value_heads=1,
        num_local_experts=4, num_experts_per_tok=2, **_SMALL),
    _lm("mixtral_loop", "MixtralConfig", "MixtralForCausalLM", num_key_value_heads=1,
        num_local_experts=4, num_experts_per_tok=2, experts_implementation="eager", **_SMALL),
    _lm("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_key_value_heads=1,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, **_SMALL),
    _text("deberta", "DebertaConfig", "DebertaForSequenceClassification", num_labels=3,
          problem_type="single_label_classification",
          relative_attention=True, pos_att_type=["c2p", "p2c"], **_SMALL),
    _text("deberta_labelled", "DebertaConfig", "DebertaForSequenceClassification",
          num_labels=3, relative_attention=True, pos_att_type=["c2p", "p2c"], **_SMALL),
    _text("deberta_v2", "DebertaV2Config", "DebertaV2ForSequenceClassification", num_labels=3,
          problem_type="single_label_classification",
          relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
          norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False, **_SMALL),
    _text("convbert", "ConvBertConfig", "ConvBertForSequenceClassification", num_labels=3,
          embedding_size=32, conv_kernel_size=3, **_SMALL),
    _text("mobilebert", "MobileBertConfig", "MobileBertForSequenceClassification", num_labels=3,
          embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
          num_feedforward_networks=2, **_SMALL),
    _text("data2vec_text", "Data2VecTextConfig", "Data2VecTextForSequenceClassification",
          num_labels=3, pad_token_id=1, **_SMALL),
    ModelCase("nystromformer", _hf("NystromformerConfig", "NystromformerForSequenceClassification",
              num_labels=3, segment_means_seq_len=12, num_landmarks=4, conv_kernel_size=3,
              **_SMALL), _fixed_classify_batch, _hf_step, "transformers"),
    _text("xlnet", "XLNetConfig", "XLNetForSequenceClassification", vocab_size=VOCAB, d_model=32,
          n_layer=2, n_head=2, d_inner=64, num_labels=3),
    _lm("ctrl", "CTRLConfig", "CTRLLMHeadModel", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2,
        dff=64, n_positions=40),
    _lm("persimmon", "PersimmonConfig", "PersimmonForCausalLM", **_SMALL),
    _lm("cohere", "CohereConfig", "CohereForCausalLM", **_ONE_KV),
    _lm("granite", "GraniteConfig", "GraniteForCausalLM", **_ONE_KV),
    ModelCase("wavlm", _hf("WavLMConfig", "WavLMForSequenceClassification", num_labels=3,
              hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, num_buckets=8,
              max_bucket_distance=16), _audio_batch, _hf_step, "transformers"),
    _image("cvt", "CvtConfig", "CvtForImageClassification", 32, embed_dim=[8, 16, 32],
           num_heads=[1, 2, 2], depth=[1, 2, 3], num_channels=3, num_labels=5),
    _image("pvt", "PvtConfig", "PvtForImageClassification", 32, hidden_sizes=[8, 8, 16, 16],
           depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2], **_IMAGE_32),
    _image("bit", "BitConfig", "BitForImageClassification", 32, embedding_size=8,
           hidden_sizes=[8, 16], depths=[1, 1], num_groups=4, num_labels=5),
    _image("data2vec_vision", "Data2VecVisionConfig", "Data2VecVisionForImageClassification", 16,
           patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
           intermediate_size=64, use_relative_position_bias=True, **_IMAGE_16),
]  # fmt: skip


def _long_classify_batch(g: torch.Generator, i: int) -> Batch:
    """Like _classify_batch, longer (20 and 18 tokens): BigBird's block-sparse
    attention runs only beyond (5 + 2 * random blocks) blocks."""
    batch = _tokens(g, 4, 20 - 2 * i, pad_last=4)
    return {**batch, "labels": torch.randint(0, 3, (4,), generator=g)}


# Tried first on 2026-11-29, on all four targets: each
# passed as it came but X-MOD, whose language adapters select the rows of one
# language (x[mask], a count symbol) and flatten them with the sequence
# (count*seq: a product of two symbols the fit did not have). Tried and left out:
# FNet (torch.fft: complex tensors), YOSO and Reformer (custom autograd
# backwards that are not their forward's derivative: YosoCumulation,
# _ReversibleFunction; Reformer's LSH attention also calls torch.empty),
# Longformer (as_strided chunks, writes through strided views, nonzero).
# Jamba's SSM state size is 8 here: at 4, the batch size, the batch-dim replay
# ran out of backtracks (every 4 a reading of the batch) before its MoE's
# grouped_mm, and the recording fell back to marking every 4 as the batch.
EXTRA_CASES += [
    _lm("qwen3", "Qwen3Config", "Qwen3ForCausalLM", head_dim=16, **_ONE_KV),
    _lm("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=16, sliding_window=4,
        **_ONE_KV),
    _lm("olmo2", "Olmo2Config", "Olmo2ForCausalLM", **_ONE_KV),
    _lm("mpt", "MptConfig", "MptForCausalLM", vocab_size=VOCAB, d_model=32, n_heads=2,
        n_layers=2, max_seq_len=40),
    _lm("nemotron", "NemotronConfig", "NemotronForCausalLM", head_dim=16, **_ONE_KV),
    _lm("glm", "GlmConfig", "GlmForCausalLM", head_dim=16, pad_token_id=0, **_ONE_KV),
    _lm("helium", "HeliumConfig", "HeliumForCausalLM", head_dim=16, **_ONE_KV),
    _text("rembert", "RemBertConfig", "RemBertForSequenceClassification", num_labels=3,
          input_embedding_size=16, output_embedding_size=16, **_SMALL),
    _text("esm", "EsmConfig", "EsmForSequenceClassification", num_labels=3, pad_token_id=1,
          position_embedding_type="rotary", **_SMALL),
    _text("ibert", "IBertConfig", "IBertForSequenceClassification", num_labels=3,
          pad_token_id=1, **_SMALL),
    _text("xmod", "XmodConfig", "XmodForSequenceClassification", num_labels=3, pad_token_id=1,
          languages=["en_XX"], default_language="en_XX", **_SMALL),
    _text("layoutlm", "LayoutLMConfig", "LayoutLMForSequenceClassification", num_labels=3,
          **_SMALL),
    _text("mra", "MraConfig", "MraForSequenceClassification", num_labels=3, **_SMALL),
    _text("lilt", "LiltConfig", "LiltForSequenceClassification", num_labels=3,
          **{**_SMALL, "hidden_size": 48}),
    _text("canine", "CanineConfig", "CanineForSequenceClassification", num_labels=3,
          hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
          max_position_embeddings=64, num_hash_buckets=64, num_hash_functions=2,
          downsampling_rate=2),
    _text("big_bird_full", "BigBirdConfig", "BigBirdForSequenceClassification", num_labels=3,
          attention_type="original_full", **_SMALL),
    ModelCase("big_bird", _hf("BigBirdConfig", "BigBirdForSequenceClassification", num_labels=3,
              attention_type="block_sparse", block_size=2, num_random_blocks=1,
              **{**_SMALL, "max_position_embeddings": 64}), _long_classify_batch, _hf_step,
              "transformers", True),
    _lm("jamba", "JambaConfig", "JambaForCausalLM", num_experts=2, num_experts_per_tok=1,
        attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8,
        use_mamba_kernels=False, **_ONE_KV),
    _lm("bamba", "BambaConfig", "BambaForCausalLM", attn_layer_indices=[1], mamba_n_heads=4,
        mamba_d_head=16, mamba_n_groups=1, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=4, **_ONE_KV),
    *(
        ModelCase(name, _hf(config, model, vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64,
                  num_layers=1, num_decoder_layers=1, num_heads=2, decoder_start_token_id=0,
                  pad_token_id=0, **extra), _seq2seq_batch, _hf_step, "transformers")
        for name, config, model, extra in [
            ("mt5", "MT5Config", "MT5ForConditionalGeneration", {}),
            ("umt5", "UMT5Config", "UMT5ForConditionalGeneration", {}),
            ("longt5", "LongT5Config", "LongT5ForConditionalGeneration", {"local_radius": 4}),
        ]
    ),
]  # fmt: skip


# -- 2026-11-29: vision, audio, time-series and multimodal families --
def _b_video_batch(g: torch.Generator, i: int) -> Batch:
    """Clips of 2 frames of 16x16 and a class per clip."""
    return {
        "pixel_values": torch.randn(4, 2, 3, 16, 16, generator=g),
        "labels": torch.randint(0, 5, (4,), generator=g),
    }


def _b_features_batch(frames: int, bins: int, channels_first: bool = False) -> Any:
    """Spectrogram features [batch, frames, bins] (or [batch, bins, frames]) and a class."""

    def batch(g: torch.Generator, i: int) -> Batch:
        shape = (4, bins, frames) if channels_first else (4, frames, bins)
        return {
            "input_features" if channels_first else "input_values": torch.randn(
                *shape, generator=g
            ),
            "labels": torch.randint(0, 3, (4,), generator=g),
        }

    return batch


def _b_speech_seq2seq_batch(key: str, shape: tuple[int, ...]) -> Any:
    def batch(g: torch.Generator, i: int) -> Batch:
        labels = torch.randint(1, VOCAB, (4, 6 - i), generator=g)
        labels[2, 4:] = -100
        return {key: torch.randn(4, *shape, generator=g), "labels": labels}

    return batch


def _b_depth_batch(g: torch.Generator, i: int) -> Batch:
    """Images and a positive depth map per image."""
    return {
        "pixel_values": torch.randn(4, 3, 32, 32, generator=g),
        "labels": torch.rand(4, 32, 32, generator=g) * 5 + 0.5,
    }


def _b_image_text_batch(g: torch.Generator, i: int) -> Batch:
    """Token ids (padded to the longest) and an image per pair; a contrastive loss."""
    batch = _tokens(g, 4, 8 - 2 * i, pad_last=2)
    return {**batch, "pixel_values": torch.randn(4, 3, 16, 16, generator=g)}


def _b_image_text_fixed_batch(g: torch.Generator, i: int) -> Batch:
    """SigLIP's text tower pools the last token, and is trained unpadded."""
    return {
        "input_ids": torch.randint(1, VOCAB, (4, 8), generator=g),
        "pixel_values": torch.randn(4, 3, 16, 16, generator=g),
    }


def _b_contrastive_step(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch, return_loss=True).loss


def _b_feature_step(model: nn.Module, batch: Batch) -> torch.Tensor:
    """A backbone with no head of its own (ViTDet): the mean square of its features."""
    return model(batch["pixel_values"]).last_hidden_state.pow(2).mean()


def _b_forecast_batch(g: torch.Generator, i: int) -> Batch:
    """A context of 16 steps of 3 series and the 4 steps to forecast."""
    return {
        "past_values": torch.randn(4, 16, 3, generator=g),
        "future_values": torch.randn(4, 4, 3, generator=g),
    }


def _b_time_features_batch(g: torch.Generator, i: int) -> Batch:
    """TimeSeriesTransformer (its config's lags and time features): one series, 2 time features,
    context 8 plus lags up to 3, a forecast of 4."""
    past = 8 + 3
    return {
        "past_values": torch.randn(4, past, generator=g),
        "past_time_features": torch.randn(4, past, 2, generator=g),
        "past_observed_mask": torch.ones(4, past),
        "future_values": torch.randn(4, 4, generator=g),
        "future_time_features": torch.randn(4, 4, 2, generator=g),
    }


_B_VIT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 64}  # fmt: skip
_B_AUDIO = {"num_labels": 3, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "conv_dim": (16, 16), "conv_stride": (5, 4),
            "conv_kernel": (10, 4), "num_conv_pos_embeddings": 16,
            "num_conv_pos_embedding_groups": 2}  # fmt: skip
_B_TS = {"prediction_length": 4, "context_length": 8, "lags_sequence": [1, 2, 3],
         "num_time_features": 2, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
         "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
         "decoder_ffn_dim": 32}  # fmt: skip
_B_CLIP = {
    "text_config": {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
                    "num_hidden_layers": 2, "num_attention_heads": 2,
                    "max_position_embeddings": 40},
    "vision_config": {"image_size": 16, "patch_size": 4, "hidden_size": 32,
                      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
}  # fmt: skip

#  Vision, audio, time-series and
# multimodal families, each 4 of 4 targets; MobileViTV2 after the batch-dim
# replay read group norm's sizes from its input. Tried and left out: Autoformer
# (torch.fft: complex), YOLOS (scipy matching). In the blocks at the end, left
# out at first: DPT (its auxiliary head's dropout lands in the loss graph, whose
# function took no rng), SwiftFormer and EfficientNet (gradients that cancel were
# judged at the median gradient scale, which neither model's gradients have),
# Informer (randint, topk with sorted=False) and SEW-D (no float64 reference: its
# XSoftmax fills the softmax output in place).
EXTRA_CASES += [
    _image("vit_msn", "ViTMSNConfig", "ViTMSNForImageClassification", 16, patch_size=4,
           **_B_VIT, **_IMAGE_16),
    _image("ijepa", "IJepaConfig", "IJepaForImageClassification", 16, patch_size=4, **_B_VIT,
           **_IMAGE_16),
    ModelCase("vitdet", _hf("VitDetConfig", "VitDetModel", image_size=16, pretrain_image_size=16,
              patch_size=4, window_size=2, window_block_indices=[0],
              use_relative_position_embeddings=True, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=2, mlp_ratio=2),
              _pixels_only, _b_feature_step, "transformers"),
    _image("hiera", "HieraConfig", "HieraForImageClassification", 32, image_size=[32, 32],
           embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], masked_unit_size=[8, 8],
           num_channels=3, num_labels=5),
    _image("mobilevitv2", "MobileViTV2Config", "MobileViTV2ForImageClassification", 64,
           width_multiplier=0.25, image_size=64, num_channels=3, num_labels=5),
    _image("pvt_v2", "PvtV2Config", "PvtV2ForImageClassification", 32, hidden_sizes=[8, 8, 16, 16],
           depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2], **_IMAGE_32),
    _image("textnet", "TextNetConfig", "TextNetForImageClassification", 32, stem_out_channels=8,
           hidden_sizes=[8, 8, 16, 16, 32], num_labels=5),
    ModelCase("glpn", _hf("GLPNConfig", "GLPNForDepthEstimation", hidden_sizes=[8, 8, 16, 16],
              depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2], decoder_hidden_size=8),
              _b_depth_batch, _hf_step, "transformers"),
    ModelCase("timesformer", _hf("TimesformerConfig", "TimesformerForVideoClassification",
              image_size=16, patch_size=4, num_frames=2, num_labels=5, **_B_VIT),
              _b_video_batch, _hf_step, "transformers"),
    ModelCase("videomae", _hf("VideoMAEConfig", "VideoMAEForVideoClassification", image_size=16,
              patch_size=4, num_frames=2, tubelet_size=2, num_labels=5, **_B_VIT),
              _b_video_batch, _hf_step, "transformers"),
    *(
        ModelCase(name, _hf(config, model, **{**_B_AUDIO, **extra}), _audio_batch, _hf_step,
                  "transformers")
        for name, config, model, extra in [
            ("sew", "SEWConfig", "SEWForSequenceClassification", {"squeeze_factor": 2}),
            ("unispeech", "UniSpeechConfig", "UniSpeechForSequenceClassification", {}),
            ("unispeech_sat", "UniSpeechSatConfig", "UniSpeechSatForSequenceClassification", {}),
            ("data2vec_audio", "Data2VecAudioConfig", "Data2VecAudioForSequenceClassification",
             {"conv_pos_kernel_size": 4, "num_conv_pos_embeddings": 2}),
        ]
    ),
    ModelCase("ast", _hf("ASTConfig", "ASTForAudioClassification", patch_size=4,
              frequency_stride=4, time_stride=4, max_length=16, num_mel_bins=16, num_labels=3,
              **_B_VIT), _b_features_batch(16, 16), _hf_step, "transformers"),
    ModelCase("whisper_cls", _hf("WhisperConfig", "WhisperForAudioClassification",
              num_mel_bins=8, max_source_positions=8, num_labels=3, **_SEQ2SEQ_SMALL),
              _b_features_batch(16, 8, channels_first=True), _hf_step, "transformers"),
    ModelCase("whisper", _hf("WhisperConfig", "WhisperForConditionalGeneration",
              num_mel_bins=8, max_source_positions=8, max_target_positions=16,
              decoder_start_token_id=1, pad_token_id=0, **_SEQ2SEQ_SMALL),
              _b_speech_seq2seq_batch("input_features", (8, 16)), _hf_step, "transformers"),
    ModelCase("speech_to_text", _hf("Speech2TextConfig", "Speech2TextForConditionalGeneration",
              input_feat_per_channel=8, conv_channels=16, max_source_positions=40,
              max_target_positions=16, **_SEQ2SEQ_SMALL),
              _b_speech_seq2seq_batch("input_features", (16, 8)), _hf_step, "transformers"),
    ModelCase("clip", _hf("CLIPConfig", "CLIPModel", projection_dim=16, **_B_CLIP),
              _b_image_text_batch, _b_contrastive_step, "transformers", varies=True),
    ModelCase("siglip", _hf("SiglipConfig", "SiglipModel", **_B_CLIP),
              _b_image_text_fixed_batch, _b_contrastive_step, "transformers"),
    ModelCase("patchtst", _hf("PatchTSTConfig", "PatchTSTForPrediction", num_input_channels=3,
              context_length=16, prediction_length=4, patch_length=4, patch_stride=4, d_model=16,
              num_attention_heads=2, num_hidden_layers=2, ffn_dim=32),
              _b_forecast_batch, _hf_step, "transformers"),
    ModelCase("patchtsmixer", _hf("PatchTSMixerConfig", "PatchTSMixerForPrediction",
              num_input_channels=3, context_length=16, prediction_length=4, patch_length=4,
              patch_stride=4, d_model=16, num_layers=2),
              _b_forecast_batch, _hf_step, "transformers"),
    *(
        ModelCase(name, _hf(config, model, **_B_TS, **extra), _b_time_features_batch, _hf_step,
                  "transformers")
        for name, config, model, extra in [
            ("time_series_transformer", "TimeSeriesTransformerConfig",
             "TimeSeriesTransformerForPrediction", {}),
        ]
    ),
]  # fmt: skip


def _segmentation_batch(size: int, classes: int) -> Callable[[torch.Generator, int], Batch]:
    def batch(g: torch.Generator, i: int) -> Batch:
        return {
            "pixel_values": torch.randn(4, 3, size, size, generator=g),
            "labels": torch.randint(0, classes, (4, size, size), generator=g),
        }

    return batch


# DPT's semantic segmentation model with its auxiliary head (first tried
# 2026-11-29, helper e), as transformers' DPT tests build it: given labels, the
# auxiliary head (a dropout of its own) runs for the loss only, so its draw is
# the loss graph's (tracelog.sample.loss_mask_key); the forward drops too.
EXTRA_CASES += [
    ModelCase("dpt", _hf("DPTConfig", "DPTForSemanticSegmentation", image_size=32, patch_size=16,
              hidden_size=32, fusion_hidden_size=32, num_hidden_layers=2,
              backbone_out_indices=[0, 1, 2, 3], num_attention_heads=4, intermediate_size=37,
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=3,
              neck_hidden_sizes=[16, 32], use_auxiliary_head=True),
              _segmentation_batch(32, 3), _hf_step, "transformers"),
]  # fmt: skip

# Informer (first tried 2026-11-29): ProbSparse attention samples its keys with
# torch.randint and picks its queries with topk(sorted=False), then drops out over
# the picked rows in that order (the order is a draw the sample keeps).
EXTRA_CASES += [
    ModelCase("informer", _hf("InformerConfig", "InformerForPrediction", **_B_TS),
              _b_time_features_batch, _hf_step, "transformers"),
]  # fmt: skip

# Jamba with its ssm state as wide as the batch (4): every replay through the
# experts' torch._grouped_mm failed (its meta kernel takes CUDA's dtypes only), and
# the fallback guess split the state's 4 as the batch.
EXTRA_CASES += [
    _lm("jamba_state4", "JambaConfig", "JambaForCausalLM", num_experts=2, num_experts_per_tok=1,
        attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
        mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8,
        use_mamba_kernels=False, **_ONE_KV),
]  # fmt: skip

# SEW-D (first tried 2026-11-29): DeBERTa's disentangled attention through its
# XSoftmax, a custom autograd Function that fills softmax's output in place (the
# float64 reference replays that write out of place).
EXTRA_CASES += [
    ModelCase("sew_d", _hf("SEWDConfig", "SEWDForSequenceClassification", **_B_AUDIO,
              squeeze_factor=2, position_buckets=8, max_position_embeddings=32),
              _audio_batch, _hf_step, "transformers"),
]  # fmt: skip

# SwiftFormer and HF EfficientNet, left out at first (2026-11-29): their
# translations were right, but gradients that cancel to near zero (conv and
# batch-norm biases before a training batch norm) were judged at the median
# gradient scale, 1.7e-7 behind SwiftFormer's 1e-5 layer scales and 1e-17 in
# EfficientNet (N(0, 0.02) batch-norm weights with eps 1e-3 above the variance
# shrink its activations to 1e-16), far below the terms they sum (1 and 1e-2).
# They are judged at that size, up to the largest gradient (parity._terms).
EXTRA_CASES += [
    _image("swiftformer", "SwiftFormerConfig", "SwiftFormerForImageClassification", 32,
           depths=[1, 1, 1, 1], embed_dims=[8, 8, 16, 16], mlp_ratio=2, image_size=32,
           num_channels=3, num_labels=5),
    _image("efficientnet", "EfficientNetConfig", "EfficientNetForImageClassification", 32,
           image_size=32, width_coefficient=0.25, depth_coefficient=1.0, kernel_sizes=[3, 3, 5],
           in_channels=[32, 16, 24], out_channels=[16, 24, 40], strides=[1, 2, 2],
           num_block_repeats=[1, 1, 1], expand_ratios=[1, 6, 6], hidden_dim=320, num_labels=5),
]  # fmt: skip

# Tried first on 2026-11-29 (sweep): each below passed on all four targets as it
# came. Config notes: Zamba needs two hybrid layers (its shared block is tied across
# them); DBRX needs rope_theta and clip_qkv in attn_config; FSMT makes its decoder
# inputs from input_ids, so it trains on _lm_batch; JetMoE's top-k is 3: its
# attention experts split the tokens by routed counts read into Python
# (split_with_sizes of [B*T*k] by ints from the data), which no batch-dim replay can
# run at another batch, so the recording falls back to reading every 4 as the batch,
# and at top-2 its key repeat of 2 kv heads to 4 is such a 4 ("not a whole number of
# times"); at top-3 the fallback holds (the counts are constants: a graph per batch);
# Wav2Vec2-BERT's SpecAugment mask (drawn by numpy) was a constant [4, 16], and
# index_put_ by it on [batch, seq, 32] unsupported, until such a mask became a data
# input following the data's sizes (base.external_mask). Tried and left out:
# SwitchTransformers and NLLB-MoE (their experts loop's nonzero: a count the
# batch-dim replay could not follow; added in the block at the end since); LED (Longformer's as_strided chunks, slices of part
# of the batch, writes through strided views); PhiMoE (its router weight's gradient,
# by sparsemixer's custom autograd backward, fails the float32 row: 0.25 relative);
# Flaubert with
# pre_norm and xLSTM (both fail in plain PyTorch under transformers 5.24); Depth
# Anything (no training loss); Van and ViT-Hybrid (gone from transformers 5.24).
EXTRA_CASES += [
    _text("camembert", "CamembertConfig", "CamembertForSequenceClassification", num_labels=3,
          pad_token_id=1, **_SMALL),
    _text("xlm", "XLMConfig", "XLMForSequenceClassification", vocab_size=VOCAB, emb_dim=32,
          n_layers=2, n_heads=2, max_position_embeddings=40, num_labels=3),
    _text("ernie", "ErnieConfig", "ErnieForSequenceClassification", num_labels=3, **_SMALL),
    _text("roc_bert", "RoCBertConfig", "RoCBertForSequenceClassification", num_labels=3,
          pronunciation_vocab_size=16, shape_vocab_size=16, pronunciation_embed_dim=16,
          shape_embed_dim=16, **_SMALL),
    _text("markuplm", "MarkupLMConfig", "MarkupLMForSequenceClassification", num_labels=3,
          max_depth=8, xpath_unit_hidden_size=8, **_SMALL),
    _text("luke", "LukeConfig", "LukeForSequenceClassification", num_labels=3,
          entity_vocab_size=8, entity_emb_size=16, **_SMALL),
    _text("modernbert", "ModernBertConfig", "ModernBertForSequenceClassification", num_labels=3,
          local_attention=4, global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=1,
          eos_token_id=2, cls_token_id=1, sep_token_id=2, reference_compile=False, **_SMALL),
    _lm("bert_generation", "BertGenerationConfig", "BertGenerationDecoder", is_decoder=True,
        **_SMALL),
    _lm("gpt_neox_japanese", "GPTNeoXJapaneseConfig", "GPTNeoXJapaneseForCausalLM",
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_multiple_size=2, max_position_embeddings=40),
    _lm("recurrent_gemma", "RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", vocab_size=VOCAB,
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, lru_width=32, attention_window_size=8, conv1d_width=4,
        block_types=["recurrent", "attention"], head_dim=16),
    _lm("falcon_mamba", "FalconMambaConfig", "FalconMambaForCausalLM", vocab_size=VOCAB,
        hidden_size=32, num_hidden_layers=2, state_size=4, expand=2, conv_kernel=4,
        use_mambapy=False),
    _lm("mamba2", "Mamba2Config", "Mamba2ForCausalLM", vocab_size=VOCAB, hidden_size=32,
        num_hidden_layers=2, state_size=8, num_heads=4, head_dim=16, expand=2, n_groups=1,
        chunk_size=4, conv_kernel=4),
    _lm("rwkv", "RwkvConfig", "RwkvForCausalLM", vocab_size=VOCAB, context_length=40,
        hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64),
    _lm("zamba", "ZambaConfig", "ZambaForCausalLM", attention_hidden_size=64, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8, n_mamba_heads=1,
        layers_block_type=["linear_attention", "hybrid", "hybrid"], use_mamba_kernels=False,
        **{**_ONE_KV, "num_hidden_layers": 3}),
    _lm("olmoe", "OlmoeConfig", "OlmoeForCausalLM", num_experts=4, num_experts_per_tok=2,
        **_ONE_KV),
    _lm("granitemoe", "GraniteMoeConfig", "GraniteMoeForCausalLM", num_local_experts=4,
        num_experts_per_tok=2, **_ONE_KV),
    _lm("dbrx", "DbrxConfig", "DbrxForCausalLM", vocab_size=VOCAB, d_model=32, n_heads=2,
        n_layers=2, max_seq_len=40,
        attn_config={"kv_n_heads": 1, "rope_theta": 10000.0, "clip_qkv": 8.0},
        ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}),
    # past keep_window_size its dynamic mask keeps the keys topk(sorted=False) picked,
    # among scores that all tie at init: it failed the translation check (logits 0.32
    # off) until the rule picked the kernel's tied elements (rules_attention.topk_keys)
    _lm("doge", "DogeConfig", "DogeForCausalLM", keep_window_size=8, **_ONE_KV),
    _lm("deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM", moe_intermediate_size=16,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        v_head_dim=16, qk_nope_head_dim=8, **_SMALL),
    *(
        ModelCase(name, _hf(config, model, **_SEQ2SEQ_SMALL, **extra), _seq2seq_batch,
                  _hf_step, "transformers")
        for name, config, model, extra in [
            ("m2m_100", "M2M100Config", "M2M100ForConditionalGeneration", {}),
            ("plbart", "PLBartConfig", "PLBartForConditionalGeneration", {}),
            ("blenderbot", "BlenderbotConfig", "BlenderbotForConditionalGeneration", {}),
            ("mvp", "MvpConfig", "MvpForConditionalGeneration", {}),
            ("bigbird_pegasus", "BigBirdPegasusConfig", "BigBirdPegasusForConditionalGeneration",
             {"attention_type": "original_full"}),
        ]
    ),
    ModelCase("prophetnet", _hf("ProphetNetConfig", "ProphetNetForConditionalGeneration",
              vocab_size=VOCAB, hidden_size=32, encoder_ffn_dim=64, num_encoder_layers=1,
              num_encoder_attention_heads=2, decoder_ffn_dim=64, num_decoder_layers=1,
              num_decoder_attention_heads=2, max_position_embeddings=40, ngram=2, num_buckets=8,
              relative_max_distance=16, pad_token_id=0, decoder_start_token_id=0),
              _seq2seq_batch, _hf_step, "transformers"),
    ModelCase("fsmt", _hf("FSMTConfig", "FSMTForConditionalGeneration", langs=["en", "de"],
              src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, encoder_layers=1,
              decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
              encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40),
              _lm_batch, _hf_step, "transformers", True),
    ModelCase("encoder_decoder", _hf("EncoderDecoderConfig", "EncoderDecoderModel",
              encoder={"model_type": "bert", **_SMALL},
              decoder={"model_type": "bert", "is_decoder": True, "add_cross_attention": True,
                       **_SMALL}, decoder_start_token_id=1, pad_token_id=0),
              _seq2seq_batch, _hf_step, "transformers"),
    ModelCase("wav2vec2_conformer", _hf("Wav2Vec2ConformerConfig",
              "Wav2Vec2ConformerForSequenceClassification", conv_depthwise_kernel_size=3,
              **_B_AUDIO), _audio_batch, _hf_step, "transformers"),
    ModelCase("wav2vec2_bert", _hf("Wav2Vec2BertConfig", "Wav2Vec2BertForSequenceClassification",
              feature_size=8, num_labels=3, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=2, intermediate_size=64, conv_depthwise_kernel_size=3,
              output_hidden_size=32, feature_projection_input_dim=8),
              _b_features_batch(8, 16, channels_first=True), _hf_step, "transformers"),
    _image("dinov2_with_registers", "Dinov2WithRegistersConfig",
           "Dinov2WithRegistersForImageClassification", 16, patch_size=4, num_register_tokens=2,
           **_B_VIT, **_IMAGE_16),
    ModelCase("swin2sr", _hf("Swin2SRConfig", "Swin2SRModel", image_size=16, patch_size=1,
              embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, upscale=1),
              _pixels_only, _b_feature_step, "transformers"),
    ModelCase("upernet", _hf("UperNetConfig", "UperNetForSemanticSegmentation",
              backbone_config={"model_type": "convnext", "num_stages": 4,
                               "hidden_sizes": [8, 8, 16, 16], "depths": [1, 1, 1, 1],
                               "out_features": ["stage1", "stage2", "stage3", "stage4"]},
              hidden_size=16, auxiliary_in_channels=16, auxiliary_channels=8, num_labels=3,
              use_pretrained_backbone=False), _segmentation_batch(32, 3), _hf_step,
              "transformers"),
    _lm("falcon_h1", "FalconH1Config", "FalconH1ForCausalLM", mamba_d_ssm=64, mamba_n_heads=4,
        mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=4, head_dim=16, **_ONE_KV),
    _lm("lfm2", "Lfm2Config", "Lfm2ForCausalLM", layer_types=["conv", "full_attention"],
        block_multiple_of=16, block_auto_adjust_ff_dim=False, **_ONE_KV),
    _lm("jetmoe", "JetMoeConfig", "JetMoeForCausalLM", vocab_size=VOCAB, hidden_size=32,
        num_hidden_layers=2, num_key_value_heads=2, kv_channels=16, intermediate_size=64,
        max_position_embeddings=40, num_local_experts=4, num_experts_per_tok=3),
    _lm("minimax", "MiniMaxConfig", "MiniMaxForCausalLM", head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"], block_size=4,
        **_ONE_KV),
    _lm("granitemoehybrid", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32,
        layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8,
        mamba_chunk_size=4, **_ONE_KV),
    _lm("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM", head_dim=16,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        num_experts=4, num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"],
        **_ONE_KV),
    _lm("trocr", "TrOCRConfig", "TrOCRForCausalLM", vocab_size=VOCAB, d_model=32,
        decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=64,
        max_position_embeddings=40),
    _image("hgnet_v2", "HGNetV2Config", "HGNetV2ForImageClassification", 32, embedding_size=8,
           depths=[1, 1], hidden_sizes=[16, 32], stem_channels=[3, 8, 8],
           stage_in_channels=[8, 16], stage_mid_channels=[8, 16], stage_out_channels=[16, 32],
           stage_num_blocks=[1, 1], stage_downsample=[False, True],
           stage_downsample_strides=[2, 2], stage_light_block=[False, True],
           stage_kernel_size=[3, 3], stage_numb_of_layers=[2, 2], num_labels=5),
    ModelCase("vivit", _hf("VivitConfig", "VivitForVideoClassification", image_size=16,
              num_frames=2, tubelet_size=[2, 4, 4], num_labels=5, **_B_VIT), _b_video_batch,
              _hf_step, "transformers"),
    ModelCase("pegasus_x", _hf("PegasusXConfig", "PegasusXForConditionalGeneration",
              num_global_tokens=2, block_size=4, **_SEQ2SEQ_SMALL), _seq2seq_batch, _hf_step,
              "transformers"),
    ModelCase("moonshine", _hf("MoonshineConfig", "MoonshineForConditionalGeneration",
              vocab_size=VOCAB, hidden_size=32, intermediate_size=64, encoder_num_hidden_layers=1,
              decoder_num_hidden_layers=1, encoder_num_attention_heads=2,
              decoder_num_attention_heads=2, max_position_embeddings=40, pad_token_id=0),
              _b_speech_seq2seq_batch("input_values", (4000,)), _hf_step, "transformers"),
    ModelCase("speecht5", _hf("SpeechT5Config", "SpeechT5ForSpeechToText", vocab_size=VOCAB,
              hidden_size=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
              decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
              conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
              encoder_max_relative_position=16, max_text_positions=40, encoder_layerdrop=0.0,
              decoder_layerdrop=0.0), _b_speech_seq2seq_batch("input_values", (400,)), _hf_step,
              "transformers"),
    ModelCase("groupvit", _hf("GroupViTConfig", "GroupViTModel", projection_dim=16,
              projection_intermediate_dim=32, text_config=_B_CLIP["text_config"],
              vision_config={"image_size": 16, "patch_size": 4, "hidden_size": 32,
                             "intermediate_size": 64, "depths": [1, 1],
                             "num_group_tokens": [4, 0], "num_output_groups": [4, 4],
                             "num_attention_heads": 2}),
              _b_image_text_batch, _b_contrastive_step, "transformers", varies=True),
]  # fmt: skip

# Top-1 mixtures of experts whose loop picks each expert's module by a data value
# read into Python (2026-11-29; left out before): the experts hit, found by nonzero
# and iterated, are a number of the graph (batch_dims.iterated: another number is
# another graph), each expert's tokens a count symbol (a count of 1, or equal to the
# batch size, read only where the replay's view or size argument takes it);
# NLLB-MoE's router keeps a flattened [B, T] mask's last B*T tokens.
EXTRA_CASES += [
    ModelCase("switch_transformers", _hf("SwitchTransformersConfig",
              "SwitchTransformersForConditionalGeneration", vocab_size=VOCAB, d_model=32,
              d_kv=16, d_ff=64, num_layers=2, num_sparse_encoder_layers=1, num_decoder_layers=2,
              num_sparse_decoder_layers=1, num_heads=2, num_experts=4, expert_capacity=16,
              decoder_start_token_id=0, pad_token_id=0), _seq2seq_batch, _hf_step,
              "transformers"),
    ModelCase("nllb_moe", _hf("NllbMoeConfig", "NllbMoeForConditionalGeneration",
              **_SEQ2SEQ_SMALL, num_experts=4, expert_capacity=8, encoder_sparse_step=1,
              decoder_sparse_step=1), _seq2seq_batch, _hf_step, "transformers"),
]  # fmt: skip


# Tried first on 2026-11-29 (night, helper-23's sweep), on all four targets: widely
# used families of transformers 5.24 not yet here (decoders, their mixtures of
# experts, Zamba2's hybrid, XLM-RoBERTa-XL); each passed as it came (ratios above 2,
# passing: gpt-oss/TensorFlow 3.26, OLMo3/TensorFlow 2.22 and /JAX 2.40). Tried and
# left out: DeepSeek-V2 and Llama 4 (text), whose rotary embedding runs in complex64
# (polar, view_as_complex, a complex mul, view_as_real): the tape has no complex
# dtype, so every batch goes unrecorded; Splinter's question answering passed but
# read as degenerate (a float32 error of 0 on ONNX: its logits' finfo.min fills set
# their scale, fixed since: parity.FILL) and records 3 graphs for 2 batches, not
# looked into.
EXTRA_CASES += [
    _lm("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", head_dim=16, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, **_ONE_KV),
    _lm("glm4", "Glm4Config", "Glm4ForCausalLM", head_dim=16, pad_token_id=0, **_ONE_KV),
    _lm("cohere2", "Cohere2Config", "Cohere2ForCausalLM", sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **_ONE_KV),
    _lm("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", pad_token_id=0, **_ONE_KV),
    _lm("exaone4", "Exaone4Config", "Exaone4ForCausalLM", sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **_ONE_KV),
    _lm("arcee", "ArceeConfig", "ArceeForCausalLM", **_ONE_KV),
    _lm("ernie4_5", "Ernie4_5Config", "Ernie4_5ForCausalLM", head_dim=16, **_ONE_KV),
    _lm("hunyuan_v1_dense", "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", head_dim=16,
        pad_token_id=0, **_ONE_KV),
    _lm("seed_oss", "SeedOssConfig", "SeedOssForCausalLM", head_dim=16, pad_token_id=0, **_ONE_KV),
    _lm("apertus", "ApertusConfig", "ApertusForCausalLM", pad_token_id=0, **_ONE_KV),
    _lm("dots1", "Dots1Config", "Dots1ForCausalLM", moe_intermediate_size=16, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, head_dim=16, **_ONE_KV),
    _lm("olmo3", "Olmo3Config", "Olmo3ForCausalLM", sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **_ONE_KV),
    _lm("ministral", "MinistralConfig", "MinistralForCausalLM", head_dim=16, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **_ONE_KV),
    _lm("gpt_oss", "GptOssConfig", "GptOssForCausalLM", head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **_ONE_KV),
    _lm("vaultgemma", "VaultGemmaConfig", "VaultGemmaForCausalLM", head_dim=16, **_ONE_KV),
    _lm("ernie4_5_moe", "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", head_dim=16,
        moe_num_experts=4, moe_k=2, moe_intermediate_size=16, moe_num_shared_experts=1,
        moe_layer_start_index=1, **_ONE_KV),
    _lm("hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", head_dim=16,
        num_experts=4, moe_topk=2, pad_token_id=0, **_ONE_KV),
    _lm("glm4_moe", "Glm4MoeConfig", "Glm4MoeForCausalLM", head_dim=16, moe_intermediate_size=16,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
        pad_token_id=0, **_ONE_KV),
    _lm("zamba2", "Zamba2Config", "Zamba2ForCausalLM", mamba_d_state=8, mamba_headdim=16,
        n_mamba_heads=4, chunk_size=4, adapter_rank=8, use_mamba_kernels=False,
        layers_block_type=["mamba", "hybrid"], **_ONE_KV),
    _lm("openai_gpt", "OpenAIGPTConfig", "OpenAIGPTLMHeadModel", vocab_size=VOCAB, n_embd=32,
        n_layer=2, n_head=2, n_positions=40),
    _text("xlm_roberta_xl", "XLMRobertaXLConfig", "XLMRobertaXLForSequenceClassification",
          num_labels=3, pad_token_id=1, **_SMALL),
]  # fmt: skip

BY_NAME = {c.name: c for c in CASES + EXTRA_CASES}


def train(case: ModelCase, log_dir: Any, batches: int = 2, seed: int = 0, **options: Any) -> Any:
    """Build the case's model and train it for `batches` SGD steps under a
    listener writing to `log_dir`; returns the closed listener's log."""
    import tracelog

    torch.manual_seed(seed)
    model = case.build()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    with tracelog.Listener(model, log_dir, overwrite=True, **options) as listener:
        for i in range(batches):
            batch = case.batch(g, i)
            with listener.batch():
                loss = case.step(model, batch)
                loss.backward()
            opt.step()
            opt.zero_grad()
    return listener.log
