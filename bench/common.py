"""Pieces the speed scripts share: the peer models built to our sizes, one training step."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer import Transformer, TransformerConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.embedding import TransformerEmbedding
from transformer.masks import causal_allowed
from transformer.training.loss import label_smoothed_loss

Batch = tuple[Tensor, Tensor, Tensor]  # right-padded source, decoder input, labels


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with our embeddings and tied output projection around it."""

    def __init__(self, cfg: TransformerConfig, tgt_pad_mask: bool = True) -> None:
        super().__init__()
        self.pad_id = cfg.pad_id
        self.tgt_pad_mask = tgt_pad_mask  # without it, causality alone guards right-padded targets
        emb = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        nn.init.normal_(emb.weight, std=cfg.d_model**-0.5)
        self.embed = TransformerEmbedding(emb, cfg.max_positions, cfg.dropout)
        with warnings.catch_warnings():  # nested tensors are an inference fast path: not used
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.core = nn.Transformer(
                cfg.d_model, cfg.num_heads, cfg.num_encoder_layers, cfg.num_decoder_layers,
                cfg.d_ff, cfg.dropout, batch_first=True, norm_first=cfg.norm_first,
            )  # fmt: skip
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        self.output.weight = emb.weight

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_pad = src.eq(self.pad_id)
        tgt_pad = tgt.eq(self.pad_id) if self.tgt_pad_mask else None
        causal = ~causal_allowed(tgt.size(1), tgt.size(1), device=tgt.device)  # True = masked
        x = self.core(
            self.embed(src), self.embed(tgt), tgt_mask=causal, src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad, tgt_is_causal=True,
        )  # fmt: skip
        return self.output(x)


def marian(cfg: TransformerConfig) -> nn.Module:
    """Hugging Face MarianMTModel of our sizes, random weights (needs the `bench` extra).

    Marian's own architecture otherwise: post-norm layers, embeddings scaled by sqrt(d_model)
    (``scale_embedding``), sinusoidal positions, one embedding shared by encoder, decoder and
    output projection, plus a (zero, frozen) ``final_logits_bias``.
    """
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=cfg.tgt_vocab_size, d_model=cfg.d_model, encoder_layers=cfg.num_encoder_layers,
        decoder_layers=cfg.num_decoder_layers, encoder_attention_heads=cfg.num_heads,
        decoder_attention_heads=cfg.num_heads, encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff, activation_function=cfg.activation, dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout, activation_dropout=cfg.activation_dropout,
        max_position_embeddings=cfg.max_positions, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID, forced_eos_token_id=EOS_ID, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )  # fmt: skip
    return MarianMTModel(config)


class MarianLogits(nn.Module):
    """MarianMTModel behind our interface: (src, tgt) -> logits (B, T, V)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.hf = marian(cfg)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        # No decoder_attention_mask: causality alone guards right-padded targets, as in ours.
        out = self.hf(
            input_ids=src, attention_mask=src.ne(PAD_ID), decoder_input_ids=tgt, use_cache=False
        )
        return out.logits


class _EoleVocab:
    """What eole's model builder reads of a vocabulary: its size and the pad token's id."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, token: str) -> int:
        return PAD_ID


class EoleLogits(nn.Module):
    """eole's EncoderDecoderModel of our sizes behind our interface: (src, tgt) -> logits.

    Pre-norm like ours, biases as ours, one embedding shared by encoder, decoder and output,
    sinusoidal positions, Xavier-uniform weights (eole's ``param_init_method``). eole's feed-forward
    also drops out after its activation, with the residual dropout's p: that dropout gets our
    ``activation_dropout`` here, so both models drop the same activations. Needs ``pip install
    eole`` (in no extra of ours: it brings about 40 packages).
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        from types import SimpleNamespace

        from eole.config.models import EmbeddingsConfig, TransformerModelConfig
        from eole.models.model import EncoderDecoderModel

        d = cfg.d_model
        model_cfg = TransformerModelConfig(
            layers=cfg.num_decoder_layers, hidden_size=d, heads=cfg.num_heads,
            transformer_ff=cfg.d_ff, mlp_activation_fn=cfg.activation, norm_eps=cfg.layer_norm_eps,
            add_qkvbias=cfg.bias, add_ffnbias=cfg.bias, generator_bias=False,
            share_embeddings=True, share_decoder_embeddings=True,
            embeddings=EmbeddingsConfig(
                src_word_vec_size=d, tgt_word_vec_size=d, position_encoding_type="SinusoidalConcat",
            ),
            encoder={"layers": cfg.num_encoder_layers}, decoder={"layers": cfg.num_decoder_layers},
        )  # fmt: skip
        running = SimpleNamespace(
            dropout=[cfg.dropout], attention_dropout=[cfg.attention_dropout],
            self_attn_backend="pytorch", param_init_method="xavier_uniform", use_ckpting=[],
        )  # fmt: skip
        vocab = _EoleVocab(cfg.tgt_vocab_size)
        self.eole = EncoderDecoderModel.build(
            model_cfg, {"src": vocab, "tgt": vocab, "specials": {}}, running
        )
        self.eole.init_weights(running)
        for module in self.eole.modules():
            if hasattr(module, "dropout_1"):  # the feed-forward's dropout after its activation
                module.dropout_1.p = cfg.activation_dropout

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        tgt = F.pad(tgt, (0, 1), value=PAD_ID)  # eole's decoder reads all of tgt but the last
        out = self.eole(src, tgt, src.ne(PAD_ID).sum(1))
        return self.eole.generator(out.dec_out)


def autocast_factory(
    device: torch.device, dtype: str
) -> Callable[[], AbstractContextManager[object]]:
    """A context factory: bf16 autocast (mixed precision) for "bf16", nothing for "fp32"."""
    if dtype == "bf16":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext


LossFn = Callable[[Batch, int], Tensor]  # (batch, its non-pad label count) -> mean loss


def logits_loss(model: nn.Module, label_smoothing: float = 0.0) -> LossFn:
    """The peers' loss: cross entropy in fp32 on the model's full (B, T, V) logits, averaged over
    the non-pad labels, as a Hugging Face or fairseq training loop computes it."""

    def loss(batch: Batch, num_labels: int) -> Tensor:
        src, tgt_in, labels = batch
        logits = model(src, tgt_in)
        return F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=PAD_ID,
            label_smoothing=label_smoothing,
        )  # fmt: skip

    return loss


def own_loss(model: Transformer, runner: nn.Module, label_smoothing: float = 0.0) -> LossFn:
    """Our training loss, as ``TranslationModule`` computes it: decoder states from ``runner``
    (the model, or the model compiled), then the output projection fused with the loss over the
    non-pad positions only (``transformer.training.loss``), counted on the host (no device sync)."""

    def loss(batch: Batch, num_labels: int) -> Tensor:
        src, tgt_in, labels = batch
        hidden = runner(src, tgt_in, return_hidden=True)
        total, _, _ = label_smoothed_loss(
            hidden, model.output.weight, labels, label_smoothing, PAD_ID, num_labels
        )
        return total / num_labels

    return loss


def train_step(
    loss_fn: LossFn,
    opt: torch.optim.Optimizer,
    batch: Batch,
    num_labels: int,
    autocast: Callable[[], AbstractContextManager[object]],
) -> Tensor:
    """Forward and loss (mean over the ``num_labels`` non-pad labels), backward, optimizer step."""
    with autocast():
        loss = loss_fn(batch, num_labels)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)  # no gradients held between steps (or by another model)
    return loss.detach()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
