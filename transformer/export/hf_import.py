"""A Hugging Face MarianMT directory (OPUS-MT's models) -> a checkpoint of this framework:
``python -m transformer.export.hf_import DIR OUT.ckpt`` (``transformer-import``). How the format
maps to ours: :mod:`transformer.export.marian`."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from transformer.atomic import atomic_save
from transformer.config import TransformerConfig
from transformer.configs import CONFIG_DIR
from transformer.data.tokenizer import Tokenizer, user_defined
from transformer.errors import ConfigError, DataError, UserError, show
from transformer.export.marian import (
    ACTIVATIONS,
    BLOCKED_LOGIT,
    MARIAN_DEFAULTS,
    SPM_FILES,
    interleaved,
    layer_weights,
    read_json,
    read_weights,
    refuse,
    tokenizer_config,
)
from transformer.export.marian_vocab import language_tokens, vocabularies, vocabulary_model
from transformer.model import Transformer
from transformer.outputs import check_output_file

log = logging.getLogger(__name__)


def model_config(config: dict[str, Any], vocab_size: int) -> TransformerConfig:
    """The TransformerConfig of a MarianConfig (``config.json``) over ``vocab_size`` ids; what does
    not map is refused, naming its field."""
    get = {**MARIAN_DEFAULTS, **config}.get
    if config.get("model_type") != "marian":
        raise refuse("model_type", config.get("model_type"), "is not MarianMT's (marian)")
    for enc, dec in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if get(enc) != get(dec):
            raise refuse(dec, get(dec), f"differs from {enc}={get(enc)}; here both sides share it")
    activation = ACTIVATIONS.get(get("activation_function"))
    if activation is None:
        choices = ", ".join(ACTIVATIONS)
        raise refuse("activation_function", get("activation_function"), f"is not one of {choices}")
    if not get("scale_embedding"):
        why = "has no equivalent: embeddings are scaled by sqrt(d_model) here"
        raise refuse("scale_embedding", False, why)
    shared = bool(get("share_encoder_decoder_embeddings"))
    if shared and get("decoder_vocab_size") not in (None, config.get("vocab_size")):
        raise refuse(
            "decoder_vocab_size", get("decoder_vocab_size"),
            f"differs from vocab_size={config.get('vocab_size')}, but "
            "share_encoder_decoder_embeddings=true gives both sides one vocabulary",
        )  # fmt: skip
    if not get("tie_word_embeddings"):
        raise refuse(
            "tie_word_embeddings", False,
            "has no equivalent: the decoder's embedding is also the output here",
        )  # fmt: skip
    for field in ("encoder_layerdrop", "decoder_layerdrop"):
        if get(field):
            raise refuse(field, get(field), "(layer drop) has no equivalent here; set it to 0.0")
    try:
        return TransformerConfig(
            src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=get("d_model"),
            num_heads=get("encoder_attention_heads"), num_encoder_layers=get("encoder_layers"),
            num_decoder_layers=get("decoder_layers"), d_ff=get("encoder_ffn_dim"),
            dropout=float(get("dropout")), attention_dropout=float(get("attention_dropout")),
            activation_dropout=float(get("activation_dropout")), activation=activation,
            norm_first=False, max_positions=get("max_position_embeddings"), output_bias=True,
            tie_output_embeddings=True, share_all_embeddings=shared,
        )  # fmt: skip
    except ValueError as err:
        raise ConfigError(f"config.json describes a model that cannot be built: {err}") from err


def embedding_weights(shared: bool) -> dict[str, tuple[str, ...]]:
    """The MarianMTModel weights each side's embedding may come from, the first found (a shared
    embedding: the source's, which the target shares)."""
    if shared:
        return {"src": ("model.shared.weight", "model.encoder.embed_tokens.weight")}
    return {
        "src": ("model.encoder.embed_tokens.weight",),
        "tgt": ("model.decoder.embed_tokens.weight",),
    }


def import_marian(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint (as ``train.py`` writes them, for evaluation and fine-tuning) of the
    MarianMT directory ``model_dir``."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise DataError(f"{model_dir} is not a directory (a MarianMT model's, e.g. opus-mt-en-de)")
    config = read_json(model_dir / "config.json")
    spms = {}
    for side, name in SPM_FILES.items():
        if not (model_dir / name).is_file():
            raise DataError(f"{model_dir / name} does not exist: a MarianMT directory holds it")
        spms[side] = (model_dir / name).read_bytes()
    vocab = vocabularies(model_dir, config, spms)
    cfg = model_config(config, len(vocab["src"].pieces))
    weights = read_weights(model_dir)
    perm = interleaved(cfg.d_model)
    state = {}
    for ours, theirs, axis in layer_weights(cfg):
        missing = [t for t in theirs if t not in weights]
        if missing:
            raise DataError(f"{model_dir}: its weights have no {missing[0]}")
        parts = [
            weights[t] if axis is None else weights[t].index_select(axis, perm) for t in theirs
        ]
        state[ours] = torch.cat(parts).float()
    tables = {}
    for side, names in embedding_weights(cfg.share_all_embeddings).items():
        theirs = next((k for k in names if k in weights), None)
        if theirs is None:
            raise DataError(f"{model_dir}: its weights have no {names[0]} (an embedding)")
        tables[side] = vocab[side].embedding(weights[theirs].float())[:, perm]  # (V, D)
    state["src_embed.tokens.weight"] = tables["src"]
    state["tgt_embed.tokens.weight"] = state["output.weight"] = tables.get("tgt", tables["src"])
    target = vocab["tgt"]
    bias = weights.get("final_logits_bias")  # (1, V_marian); none: zeros
    bias = torch.zeros(len(target.pieces)) if bias is None else target.embedding(bias[0].float())
    bias[target.blocked] = BLOCKED_LOGIT
    if not target.blocked and not bias.any():  # none: the model needs no output bias
        cfg.output_bias = False
    else:
        state["output.bias"] = bias
    model = Transformer(cfg)
    model.load_state_dict(state)  # every weight given, none left over
    user = {"src": language_tokens(vocab["src"].pieces), "tgt": []}  # a source line's start
    tokenizers = {
        side: {
            "name": f"{SPM_FILES[side]}.model",
            "model": vocabulary_model(spm, vocab[side].pieces, user[side]),
        }
        for side, spm in spms.items()
    }
    langs = tokenizer_config(model_dir)
    return {
        "hyper_parameters": {"model": cfg.to_dict()},
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "datamodule_hyper_parameters": {
            "src_lang": langs.get("source_lang"),
            "tgt_lang": langs.get("target_lang"),
            "vocab_size": cfg.src_vocab_size,
            "joint_vocab": False,
        },  # fmt: skip
        "tokenizers": tokenizers,
        "imported_from": {"path": str(model_dir), "format": "marian"},
    }


def train_overrides(cfg: TransformerConfig) -> list[str]:
    """The ``train.py`` options that describe the model ``cfg`` (``model=base`` and those that
    differ from it), with the data options its tokenizers need: ``init_from=`` takes a checkpoint
    of the configured model only."""
    base = OmegaConf.load(CONFIG_DIR / "model" / "base.yaml")
    out = ["model=base", f"data.vocab_size={cfg.src_vocab_size}", "data.joint_vocab=false"]
    for key, value in cfg.to_dict().items():
        if key in ("src_vocab_size", "tgt_vocab_size", "pad_id"):
            continue
        interpolated = OmegaConf.is_interpolation(base, key)
        if interpolated or base.get(key) != value:
            out.append(f"model.{key}={show(value)}")
    return out


def check_tokenizers(ckpt: dict[str, Any]) -> None:
    """Both tokenizers load with this project's special ids (as a checkpoint's must)."""
    for entry in ckpt["tokenizers"].values():
        Tokenizer(entry["name"], model_proto=entry["model"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.export.hf_import",
        description="Import a Hugging Face MarianMT model directory (an OPUS-MT model: "
        "config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm, "
        "vocab.json, target_vocab.json for separate vocabularies) as a checkpoint that "
        "evaluates, fine-tunes (init_from=) and exports.",
    )
    parser.add_argument("model_dir", metavar="DIR", help="the MarianMT model directory")
    parser.add_argument("output", metavar="OUT.ckpt", help="the checkpoint to write")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT.ckpt")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        check_output_file(args.output, [args.model_dir], args.force, "OUT.ckpt")
        ckpt = import_marian(args.model_dir)
        check_tokenizers(ckpt)
    except UserError as err:
        parser.exit(2, f"error: {err}\n")
    atomic_save(ckpt, args.output)
    cfg = TransformerConfig(**ckpt["hyper_parameters"]["model"])
    log.info(
        "wrote %s; evaluate it with: python evaluate.py ckpt_path=%s input=FILE\nfine-tune it "
        "with: python train.py init_from=%s %s ...", args.output, args.output, args.output,
        " ".join(train_overrides(cfg)),
    )  # fmt: skip
    targets = language_tokens(user_defined(ckpt["tokenizers"]["src"]["model"]))
    if targets:
        log.info(
            "a multilingual model: start each source line with the token of the language to "
            "translate into (%d: %s), e.g. '%s a sentence', or let '%s' put it before every "
            "line of an input file, a scored split or a fine-tuning corpus", len(targets),
            " ".join(targets[:8]) + (" ..." if len(targets) > 8 else ""), targets[0],
            f'data.target_token="{targets[0]}"',
        )  # fmt: skip


if __name__ == "__main__":
    main()
