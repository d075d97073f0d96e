"""Checkpoints -> a Hugging Face MarianMT directory: ``python -m transformer.export hf CKPT DIR``.

The directory loads with ``AutoModelForSeq2SeqLM.from_pretrained`` (a MarianMTModel) and
``AutoTokenizer.from_pretrained`` (a MarianTokenizer) and translates as the checkpoint does. It
holds config.json, generation_config.json, model.safetensors, source.spm and target.spm (the
checkpoint's SentencePiece models), vocab.json (their pieces in our id order; target_vocab.json
too where the two sides have vocabularies of their own), tokenizer_config.json and
``transformer_nmt.json`` (what was exported). The mapping is :mod:`transformer.export.marian`'s read
backwards: our interleaved sinusoids become Marian's halves by permuting the residual stream's
dimensions, our special ids stay (pad 0, unk 1, bos 2 = ``decoder_start_token_id``, eos 3), an
output bias is ``final_logits_bias``. A model maps when MarianMTModel computes it: post-norm
layers, sinusoidal positions, biases, one key/value head per query head, layer norms of epsilon
1e-5 (its fixed one); anything else is refused by name, as the CTranslate2 exporter refuses. A
pruned model's removed heads go back as zero weights (one head count per stack there too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer.averaging import load_or_average
from transformer.checkpoints import model_from_checkpoint, tokenizers_from_checkpoint
from transformer.config import TransformerConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError, UserError
from transformer.export.ct2 import INFO_FILE, check_convertible
from transformer.export.marian import SPM_FILES, interleaved, layer_weights
from transformer.model import Transformer
from transformer.outputs import check_output_directory, replace_directory
from transformer.surgery import restore_heads

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "swish"}  # ours -> activation_function
MARIAN_LAYER_NORM_EPS = 1e-5  # MarianMTModel's nn.LayerNorm: not a config option there
# What MarianMTModel computes of each option that it fixes: (the value, why another is refused).
FIXED = {
    "norm_first": (False, "MarianMTModel's layers are post-norm"),
    "positions": ("sinusoidal", "MarianMTModel adds sinusoids to the embeddings"),
    "bias": (True, "MarianMTModel's projections have biases"),
    "layer_norm_eps": (MARIAN_LAYER_NORM_EPS, "MarianMTModel's layer norms have epsilon 1e-5"),
}


def check_exportable(model: Transformer) -> None:
    """Refuse, naming it, an option MarianMTModel does not compute (and what CTranslate2's export
    refuses: an option no exporter knows, head masks)."""
    check_convertible(model)
    cfg = model.cfg
    for name, (value, why) in FIXED.items():
        if getattr(cfg, name) != value:
            raise ConfigError(
                f"model.{name}={getattr(cfg, name)!r} has no MarianMTModel equivalent ({why}); "
                f"export a model trained with model.{name}={value!r}, or export to CTranslate2"
            )
    if cfg.num_kv_heads != cfg.num_heads:
        raise ConfigError(
            f"model.num_kv_heads={cfg.num_kv_heads} (grouped-query attention) has no MarianMTModel "
            f"equivalent: its attention has one key/value head per query head "
            f"(num_heads={cfg.num_heads}); export to CTranslate2 instead"
        )


def marian_state(model: Transformer) -> dict[str, Tensor]:
    """MarianMTModel's weights of ``model``: the residual stream in Marian's dimension order."""
    cfg = model.cfg
    order = interleaved(cfg.d_model).argsort()  # Marian's dimension k is our order[k]
    ours = model.state_dict()
    state: dict[str, Tensor] = {}
    for name, theirs, axis in layer_weights(cfg):
        tensor = ours[name] if axis is None else ours[name].index_select(axis, order)
        for part, chunk in zip(theirs, tensor.chunk(len(theirs)), strict=True):
            state[part] = chunk.contiguous()
    embed = lambda weight: weight[:, order].contiguous()  # noqa: E731 (V, D)
    if cfg.share_all_embeddings:
        state["model.shared.weight"] = embed(model.src_embed.tokens.weight)
    else:
        state["model.encoder.embed_tokens.weight"] = embed(model.src_embed.tokens.weight)
        state["model.decoder.embed_tokens.weight"] = embed(model.tgt_embed.tokens.weight)
    if not cfg.tie_output_embeddings and not cfg.share_all_embeddings:
        state["lm_head.weight"] = embed(model.output.weight)
    bias = ours.get("output.bias")  # (V,): model.output_bias; Marian's is zeros without one
    state["final_logits_bias"] = (torch.zeros(cfg.tgt_vocab_size) if bias is None else bias)[None]
    return {k: v.detach().float().cpu().contiguous() for k, v in state.items()}


def marian_config(cfg: TransformerConfig) -> dict[str, Any]:
    """config.json: the MarianConfig of ``cfg``, with our special ids."""
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian",
        "vocab_size": cfg.src_vocab_size, "decoder_vocab_size": cfg.tgt_vocab_size,
        "d_model": cfg.d_model, "encoder_layers": cfg.num_encoder_layers,
        "decoder_layers": cfg.num_decoder_layers, "encoder_attention_heads": cfg.num_heads,
        "decoder_attention_heads": cfg.num_heads, "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff, "activation_function": ACTIVATIONS[cfg.activation],
        "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout, "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0, "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True, "share_encoder_decoder_embeddings": cfg.share_all_embeddings,
        "tie_word_embeddings": cfg.tie_output_embeddings or cfg.share_all_embeddings,
        "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "decoder_start_token_id": BOS_ID,
        "forced_eos_token_id": EOS_ID, "bos_token_id": None, "is_encoder_decoder": True,
    }  # fmt: skip


def generation_config(cfg: TransformerConfig, options: DecodeOptions) -> dict[str, Any]:
    """generation_config.json: our beam and length penalty, pad and bos banned as we ban them,
    eos forced at the length limit (``max_length``: the model's positions)."""
    return {
        "decoder_start_token_id": BOS_ID, "pad_token_id": PAD_ID, "eos_token_id": EOS_ID,
        "forced_eos_token_id": EOS_ID, "bad_words_ids": [[PAD_ID], [BOS_ID]],
        "num_beams": options.beam_size, "length_penalty": options.len_penalty,
        "max_length": cfg.max_positions,
    }  # fmt: skip


def tokenizer_files(
    src: Tokenizer, tgt: Tokenizer, joint: bool, data: dict[str, Any]
) -> dict[str, bytes | str]:
    """The MarianTokenizer's files: the SentencePiece models, vocab.json (target_vocab.json) and
    tokenizer_config.json with our special pieces."""
    vocab = lambda tok: {p: i for i, p in enumerate(tok.pieces(range(tok.vocab_size)))}  # noqa: E731
    pad, unk, bos, eos = tgt.pieces(range(4))
    config = {
        "tokenizer_class": "MarianTokenizer", "source_lang": data.get("src_lang"),
        "target_lang": data.get("tgt_lang"), "unk_token": unk, "eos_token": eos,
        "pad_token": pad, "bos_token": bos, "separate_vocabs": not joint,
    }  # fmt: skip
    files: dict[str, bytes | str] = {
        SPM_FILES["src"]: src.to_bytes(),
        SPM_FILES["tgt"]: tgt.to_bytes(),
        "vocab.json": json.dumps(vocab(src), ensure_ascii=False),
        "tokenizer_config.json": json.dumps(config, indent=2),
    }
    if not joint:
        files["target_vocab.json"] = json.dumps(vocab(tgt), ensure_ascii=False)
    return files


def export_hf(
    paths: Sequence[str | os.PathLike], out_dir: str | os.PathLike, force: bool = False
) -> Path:
    """Write the MarianMT directory of ``paths`` (one checkpoint, or several averaged) to
    ``out_dir``; it appears complete or not at all. An existing non-empty ``out_dir`` is replaced
    only with ``force``, and only if an earlier export wrote it."""
    check_output_directory(out_dir, paths, force, "OUT_DIR", INFO_FILE)
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise UserError('the hf format needs safetensors: pip install -e ".[hf]"') from None
    ckpt = load_or_average(paths)
    src, tgt = tokenizers_from_checkpoint(ckpt, paths[0])
    model = model_from_checkpoint(ckpt, paths[0]).eval()
    check_exportable(model)
    if model.cfg.heads_per_layer is not None:  # one head count per stack: removed heads as zeros
        model = restore_heads(model)
    cfg = model.cfg
    if cfg.share_all_embeddings and src.pieces(range(src.vocab_size)) != tgt.pieces(
        range(tgt.vocab_size)
    ):
        raise ConfigError(
            f"{paths[0]}: model.share_all_embeddings=true over tokenizers that number their "
            "pieces differently; MarianMTModel's shared embedding needs one vocabulary"
        )
    data = ckpt.get("datamodule_hyper_parameters") or {}
    files = tokenizer_files(src, tgt, cfg.share_all_embeddings, data)
    files["config.json"] = json.dumps(marian_config(cfg), indent=2)
    files["generation_config.json"] = json.dumps(generation_config(cfg, DecodeOptions()), indent=2)
    info = {"checkpoints": [str(p) for p in paths], "format": "hf", "model": cfg.to_dict()}
    files[INFO_FILE] = json.dumps(info, indent=2, default=str)
    state = marian_state(model)

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name, content in files.items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                (tmp / name).write_text(content + "\n", encoding="utf-8")

    replace_directory(out_dir, write)
    return Path(out_dir)
