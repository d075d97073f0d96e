"""Hugging Face's MarianMT format (OPUS-MT's models) and ours, both ways: the facts of the format,
the weights' correspondence, and the reading of a MarianMT directory, for
:mod:`transformer.export.hf_import` (a directory -> a checkpoint) and :mod:`transformer.export.hf`
(a checkpoint -> a directory); the vocabulary in :mod:`transformer.export.marian_vocab`.

The directory: ``config.json`` (a MarianConfig), ``model.safetensors`` or ``pytorch_model.bin``,
``source.spm`` and ``target.spm`` (the SentencePiece models that split source and target text) and
``vocab.json`` (pieces -> ids, one vocabulary for both sides; or the source's, with
``target_vocab.json`` the target's). What MarianMTModel computes is a
:class:`transformer.config.TransformerConfig`: post-norm layers (``norm_first=False``), embeddings
scaled by sqrt(d_model), sinusoidal positions from 0, swish (``activation=silu``), one embedding
for encoder, decoder and output (``share_all_embeddings``; with separate vocabularies the
encoder's and the decoder's, which is the output: ``tie_output_embeddings``) and an output bias
(``final_logits_bias``: ``output_bias=True``). A config.json option that does not map is refused,
by its field's name. Three differences are taken up by arranging the weights, not by options:

- Positions: Marian's sinusoids put sin in the first half of the dimensions and cos in the
  second, ours interleave them (the same frequencies). The residual stream's dimensions are
  permuted (:func:`interleaved`): every weight that reads or writes the stream is permuted alike,
  layer norms commute with the permutation, so the model computes the same function.
- Special ids: ours are fixed (pad 0, unk 1, bos 2, eos 3), Marian's come from its vocabulary
  (eos 0, unk 1, pad last). The vocabulary is reordered, the specials first, then the other
  pieces in Marian's order. Marian starts the decoder from ``decoder_start_token_id`` (pad): our
  bos is a copy of that row, an id the Marian model does not have, whose output bias is
  :data:`BLOCKED_LOGIT`, so that every softmax is Marian's (bos takes a probability below 1e-40).
- Tokenizers: MarianTokenizer splits text with a side's .spm and numbers the pieces with
  vocab.json (a piece not in it: unk). Each side becomes one SentencePiece model whose pieces are
  the vocabulary in our id order, its own pieces with their scores, the others UNUSED (never
  produced): it splits text as the .spm did and numbers the pieces as vocab.json does. A piece of
  a .spm that vocab.json lacks gets an id of its own after the vocabulary, whose embedding is
  unk's and whose logit is blocked; separate vocabularies are filled to one size with such ids.
  The checkpoint carries the two models as any checkpoint carries its tokenizers: it evaluates,
  fine-tunes, prunes and exports as one trained here.

As Marian's, the source is its pieces and eos (no bos); the decoder starts from bos (Marian's
start row) and ends at eos.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from sentencepiece import sentencepiece_model_pb2
from torch import Tensor

from transformer.config import TransformerConfig
from transformer.errors import ConfigError, DataError, UserError

BLOCKED_LOGIT = -100.0  # the output bias of ids Marian's model cannot produce: exp(-100) ~ 4e-44
SPM_FILES = {"src": "source.spm", "tgt": "target.spm"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Marian's activation_function values and ours (Hugging Face's "gelu" is the exact, erf one)
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}
# MarianConfig's defaults of the fields read here (a config.json may leave them out)
MARIAN_DEFAULTS = {
    "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16,
    "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096,
    "activation_function": "gelu", "dropout": 0.1, "attention_dropout": 0.0,
    "activation_dropout": 0.0, "max_position_embeddings": 1024, "scale_embedding": False,
    "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
    "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "pad_token_id": 58100,
    "eos_token_id": 0, "decoder_vocab_size": None,
}  # fmt: skip
SPM_KEPT = (  # the piece types a tokenizer produces: kept with their scores
    sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL,
    sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED,
    sentencepiece_model_pb2.ModelProto.SentencePiece.BYTE,
)


def interleaved(d_model: int) -> Tensor:
    """(D,) the Marian dimension of each of ours: our 2i and 2i + 1 hold the sin and cos of
    frequency i, Marian's i and D/2 + i."""
    half = torch.arange(d_model // 2)
    return torch.stack([half, half + d_model // 2], 1).flatten()


def layer_weights(cfg: TransformerConfig) -> list[tuple[str, tuple[str, ...], int | None]]:
    """The layers' weights: (our parameter, the MarianMTModel parameters it concatenates along its
    first axis, the axis of the residual stream's dimensions or None)."""
    table: list[tuple[str, tuple[str, ...], int | None]] = []

    def attention(ours: str, theirs: str, cross: bool) -> None:
        fused = {"q_proj": ("q",), "kv_proj": ("k", "v")} if cross else {"qkv_proj": "qkv"}
        for name, parts in fused.items():
            for kind, axis in (("weight", 1), ("bias", None)):
                given = tuple(f"{theirs}.{p}_proj.{kind}" for p in parts)
                table.append((f"{ours}.{name}.{kind}", given, axis))
        table.append((f"{ours}.out_proj.weight", (f"{theirs}.out_proj.weight",), 0))
        table.append((f"{ours}.out_proj.bias", (f"{theirs}.out_proj.bias",), 0))

    def norm(ours: str, theirs: str) -> None:
        table.extend((f"{ours}.{p}", (f"{theirs}.{p}",), 0) for p in ("weight", "bias"))

    def ffn(ours: str, theirs: str) -> None:
        table.append((f"{ours}.fc1.weight", (f"{theirs}.fc1.weight",), 1))
        table.append((f"{ours}.fc1.bias", (f"{theirs}.fc1.bias",), None))
        table.extend((f"{ours}.fc2.{p}", (f"{theirs}.fc2.{p}",), 0) for p in ("weight", "bias"))

    for i in range(cfg.num_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        attention(f"{ours}.self_attn", f"{theirs}.self_attn", cross=False)
        norm(f"{ours}.attn_block.norm", f"{theirs}.self_attn_layer_norm")
        ffn(f"{ours}.ffn", theirs)
        norm(f"{ours}.ffn_block.norm", f"{theirs}.final_layer_norm")
    for i in range(cfg.num_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        attention(f"{ours}.self_attn", f"{theirs}.self_attn", cross=False)
        norm(f"{ours}.self_block.norm", f"{theirs}.self_attn_layer_norm")
        attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn", cross=True)
        norm(f"{ours}.cross_block.norm", f"{theirs}.encoder_attn_layer_norm")
        ffn(f"{ours}.ffn", theirs)
        norm(f"{ours}.ffn_block.norm", f"{theirs}.final_layer_norm")
    return table


def refuse(field: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"config.json: {field}={value!r} {why}")


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise DataError(f"{path} does not exist: a MarianMT directory holds it")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not JSON ({err})") from err


def tokenizer_config(model_dir: Path) -> dict[str, Any]:
    """``tokenizer_config.json`` (the unknown piece's name, the languages), or {} without one."""
    path = model_dir / "tokenizer_config.json"
    return read_json(path) if path.is_file() else {}


def read_weights(model_dir: Path) -> dict[str, Tensor]:
    """MarianMTModel's weights from ``model.safetensors`` or ``pytorch_model.bin``."""
    safetensors, binary = (model_dir / name for name in WEIGHT_FILES)
    if safetensors.is_file():
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise UserError(f"{safetensors} needs safetensors: pip install safetensors") from None
        return load_file(safetensors)
    if binary.is_file():
        return torch.load(binary, map_location="cpu", weights_only=True)
    raise DataError(f"{model_dir} holds no {' or '.join(WEIGHT_FILES)}")
