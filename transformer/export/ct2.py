"""Checkpoints -> a CTranslate2 model directory, with CTranslate2's converter spec API.

Every option of :class:`transformer.config.TransformerConfig` maps onto
``ctranslate2.specs.TransformerSpec``: pre- and post-norm, ReLU, GELU (erf) and SiLU (its swish),
biases or none, an output bias, grouped-query and multi-query attention, tied and shared
embeddings (CTranslate2 stores equal tensors once), the sqrt(d_model) embedding scale and the
layer-norm epsilon. Our fused QKV (self-)
and KV (cross-attention) projections are CTranslate2's own layout. The sinusoidal table is given
explicitly: CTranslate2's built-in one starts at position 1 and puts sin and cos in two halves, ours
starts at 0 and interleaves them; learned positions (``model.positions=learned``) go in the same
place. Rotary positions are CTranslate2's ``rotary_dim=0`` (every dimension) with
``rotary_interleave=False`` (halves, as ours); the relative bias is its T5
``relative_attention_bias`` (bidirectional in the encoder, causal in the decoder), given to every
layer as our one table per stack (CTranslate2 computes the first layer's and reuses it). The
directory holds ``model.bin``, ``config.json``, the vocabulary, both SentencePiece models,
``transformer_nmt.json`` (what was exported, its data settings and our decoding defaults) and a
README on translating with it (:mod:`transformer.export.ct2_readme`).

A pruned model (``python -m transformer.prune``) converts exactly, but CTranslate2 has one head
count per encoder or decoder (its attention layers take ``num_heads`` from the stack), so the
removed heads go back in as zero weights (:func:`transformer.surgery.restore_heads`): the same
translations, at the unpruned model's speed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from transformer.averaging import load_or_average
from transformer.checkpoints import model_from_checkpoint, tokenizers_from_checkpoint
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, user_defined
from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError, UserError
from transformer.model import ATTENTION_TYPES, Transformer
from transformer.outputs import check_output_directory, replace_directory
from transformer.positions import RELATIVE_MAX_DISTANCE, ROTARY_BASE
from transformer.surgery import restore_heads

QUANTIZATIONS = ("float32", "int8", "int8_float32", "float16", "bfloat16")
CT2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}  # GELU: erf, as torch's
INFO_FILE = "transformer_nmt.json"  # what was exported; evaluate.py engine=ctranslate2 reads it
SPM_FILES = {"src": "source.spm.model", "tgt": "target.spm.model"}


def import_ctranslate2() -> Any:
    """The ``ctranslate2`` module, or a UserError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError('CTranslate2 is not installed: pip install -e ".[export]"') from None
    return ctranslate2


# The TransformerConfig options the conversion reads or that do not act at inference (dropout).
# An option added to the config is refused below, by name, until the conversion maps it.
CONVERTED_OPTIONS = frozenset(
    "src_vocab_size tgt_vocab_size d_model num_heads num_kv_heads num_encoder_layers "
    "num_decoder_layers d_ff dropout attention_dropout activation_dropout activation norm_first "
    "bias layer_norm_eps max_positions output_bias tie_output_embeddings share_all_embeddings "
    "pad_id heads_per_layer positions".split()
)


# The spec's arguments for each position kind (the tables and biases are written as weights)
CT2_POSITIONS: dict[str, dict[str, Any]] = {
    "sinusoidal": {},
    "learned": {},
    "rope": dict(rotary_dim=0, rotary_interleave=False, rotary_base=ROTARY_BASE),  # in halves
    "relative": dict(relative_attention_bias=True),
}


def check_convertible(model: Transformer) -> None:
    """Refuse, naming it, what the CTranslate2 model would not compute exactly."""
    for option, mapped in (("positions", CT2_POSITIONS), ("activation", CT2_ACTIVATIONS)):
        value = getattr(model.cfg, option)
        if value not in mapped:
            raise ConfigError(
                f"model.{option}={value} has no CTranslate2 mapping in this exporter; export a "
                f"model with model.{option}= one of {', '.join(mapped)}"
            )
    for option in fields(model.cfg):
        value = getattr(model.cfg, option.name)
        if option.name not in CONVERTED_OPTIONS and value != option.default:
            raise ConfigError(
                f"model.{option.name}={value!r} has no CTranslate2 equivalent in this exporter; "
                f"export a model trained without it (model.{option.name}={option.default!r})"
            )
    for kind in ATTENTION_TYPES:
        for layer, module in enumerate(model.attention_modules(kind)):
            heads = module.bias_heads
            if heads is not None and not heads.equal(torch.arange(len(heads), device=heads.device)):
                raise ConfigError(
                    f"model.positions=relative cannot be exported to CTranslate2 with {kind} "
                    f"layer {layer} pruned to heads {heads.tolist()}: CTranslate2 gives every "
                    "layer the relative bias of heads 0, 1, ... in order; export the unpruned "
                    "model, or prune only each layer's last heads"
                )
            if module.head_mask is not None:
                raise ConfigError(
                    f"{kind} attention of layer {layer} has a head mask (masked or scaled "
                    "heads), which CTranslate2 cannot apply; remove masked heads for real "
                    "(python -m transformer.prune) or clear it (model.clear_head_masks())"
                )


def _array(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _linear(spec: Any, linear: nn.Linear) -> None:
    spec.weight = _array(linear.weight)
    if linear.bias is not None:
        spec.bias = _array(linear.bias)


def _norm(spec: Any, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def transformer_spec(model: Transformer, src_vocab: list[str], tgt_vocab: list[str]) -> Any:
    """A validated ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights; the
    vocabularies are the pieces of ids 0..V-1. The source gets eos appended by CTranslate2 itself
    (``add_source_eos``), the decoder starts from bos, as ours do."""
    import_ctranslate2()
    check_convertible(model)
    if model.cfg.heads_per_layer is not None:  # one head count per stack: removed heads as zeros
        model = restore_heads(model)
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as ts

    cfg = model.cfg
    act = getattr(common_spec.Activation, CT2_ACTIVATIONS[cfg.activation])
    shape = dict(pre_norm=cfg.norm_first, activation=act, num_heads_kv=cfg.num_kv_heads)
    shape.update(CT2_POSITIONS[cfg.positions])
    encoder = ts.TransformerEncoderSpec(cfg.num_encoder_layers, cfg.num_heads, **shape)
    decoder = ts.TransformerDecoderSpec(cfg.num_decoder_layers, cfg.num_heads, **shape)

    for side, embed in ((encoder, model.src_embed), (decoder, model.tgt_embed)):
        tokens = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
        tokens.weight = _array(embed.tokens.weight)
        side.scale_embeddings = embed.scale  # sqrt(d_model)
        if embed.positions is not None:  # sinusoidal or learned: (max_positions, D)
            side.position_encodings.encodings = _array(embed.positions)
    for side, stack in ((encoder, model.encoder), (decoder, model.decoder)):
        if stack.positions.relative_bias is not None:  # (buckets, H), every layer the same
            for spec in side.layer:
                spec.self_attention.relative_attention_bias = _array(
                    stack.positions.relative_bias.weight
                )
                spec.self_attention.relative_attention_max_distance = np.int32(
                    RELATIVE_MAX_DISTANCE
                )
    for spec, layer in zip(encoder.layer, model.encoder.layers, strict=True):
        _norm(spec.self_attention.layer_norm, layer.attn_block.norm)
        _linear(spec.self_attention.linear[0], layer.self_attn.qkv_proj)
        _linear(spec.self_attention.linear[1], layer.self_attn.out_proj)
        _ffn(spec.ffn, layer)
    for spec, layer in zip(decoder.layer, model.decoder.layers, strict=True):
        _norm(spec.self_attention.layer_norm, layer.self_block.norm)
        _linear(spec.self_attention.linear[0], layer.self_attn.qkv_proj)
        _linear(spec.self_attention.linear[1], layer.self_attn.out_proj)
        _norm(spec.attention.layer_norm, layer.cross_block.norm)
        _linear(spec.attention.linear[0], layer.cross_attn.q_proj)
        _linear(spec.attention.linear[1], layer.cross_attn.kv_proj)
        _linear(spec.attention.linear[2], layer.cross_attn.out_proj)
        _ffn(spec.ffn, layer)
    if cfg.norm_first:  # post-norm stacks have no final norm, in either implementation
        _norm(encoder.layer_norm, model.encoder.norm)
        _norm(decoder.layer_norm, model.decoder.norm)
    _linear(decoder.projection, model.output)  # (a bias: model.output_bias)

    spec = ts.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.config.unk_token, spec.config.eos_token = tgt_vocab[UNK_ID], tgt_vocab[EOS_ID]
    spec.config.bos_token = spec.config.decoder_start_token = tgt_vocab[BOS_ID]
    spec.config.add_source_eos = True
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    spec.validate()
    return spec


def _ffn(spec: Any, layer: nn.Module) -> None:
    _norm(spec.layer_norm, layer.ffn_block.norm)
    _linear(spec.linear_0, layer.ffn.fc1)
    _linear(spec.linear_1, layer.ffn.fc2)


def check_quantization(quantization: str) -> None:
    if quantization not in QUANTIZATIONS:
        choices = ", ".join(QUANTIZATIONS)
        raise ConfigError(f"--quantization {quantization}: choose one of {choices}")


def save_spec(spec: Any, out_dir: str | os.PathLike, quantization: str = "float32") -> None:
    """Quantize the weights (``float32`` keeps them) and write the model files to ``out_dir``."""
    check_quantization(quantization)
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    spec.save(str(out_dir))


def export_ct2(
    paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    quantization: str = "float32",
    force: bool = False,
) -> Path:
    """Write the CTranslate2 model of ``paths`` (one checkpoint, or several averaged as
    ``evaluate.py`` averages them) to ``out_dir``; the directory appears complete or not at all.
    An existing non-empty ``out_dir`` is replaced only with ``force``, and only if it is an earlier
    export (:func:`transformer.outputs.check_output_directory`)."""
    from transformer.export.ct2_readme import target_tokens, usage  # (it names this module's files)

    check_output_directory(out_dir, paths, force, "OUT_DIR", INFO_FILE)
    check_quantization(quantization)
    ckpt = load_or_average(paths)
    tokenizers = tokenizers_from_checkpoint(ckpt, paths[0])
    model = model_from_checkpoint(ckpt, paths[0]).eval()
    vocabs = [tok.pieces(range(tok.vocab_size)) for tok in tokenizers]
    spec = transformer_spec(model, *vocabs)

    def write(tmp: Path) -> None:
        save_spec(spec, tmp, quantization)
        for side, tok in zip(("src", "tgt"), tokenizers, strict=True):
            (tmp / SPM_FILES[side]).write_bytes(tok.to_bytes())
        info = {
            "checkpoints": [str(p) for p in paths],
            "quantization": quantization,
            "model": model.cfg.to_dict(),
            "data": ckpt.get("datamodule_hyper_parameters") or {},
            "decode": asdict(DecodeOptions()),
            "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
        }
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
        targets = target_tokens(info["data"], user_defined(tokenizers[0].to_bytes()))
        (tmp / "README.md").write_text(usage(model.cfg.max_positions, DecodeOptions(), targets))

    replace_directory(out_dir, write)
    return Path(out_dir)
