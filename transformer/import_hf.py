"""A Hugging Face MarianMT directory (OPUS-MT's models) -> a checkpoint of this framework:
``python -m transformer.import_hf DIR OUT.ckpt`` (``transformer-import``).

The directory: ``config.json`` (a MarianConfig), ``model.safetensors`` or ``pytorch_model.bin``,
``source.spm`` and ``target.spm`` (the SentencePiece models that split source and target text) and
``vocab.json`` (pieces -> ids, one vocabulary for both sides). What MarianMTModel computes is a
:class:`transformer.config.TransformerConfig`: post-norm layers (``norm_first=False``), embeddings
scaled by sqrt(d_model), sinusoidal positions from 0, swish (``activation=silu``), one embedding
for encoder, decoder and output (``share_all_embeddings``) and an output bias
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
  unk's and whose logit is blocked. The checkpoint carries the two models as any checkpoint
  carries its tokenizers: it evaluates, fine-tunes, prunes and exports as one trained here.

As Marian's, the source is its pieces and eos (no bos); the decoder starts from bos (Marian's
start row) and ends at eos.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from sentencepiece import sentencepiece_model_pb2
from torch import Tensor

from transformer.atomic import atomic_save
from transformer.config import TransformerConfig
from transformer.configs import CONFIG_DIR
from transformer.data.tokenizer import BOS_ID, UNK_ID, Tokenizer
from transformer.errors import ConfigError, DataError, UserError
from transformer.model import Transformer
from transformer.outputs import check_output_file
from transformer.training.config_checks.option_types import show

log = logging.getLogger(__name__)

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


def _refuse(field: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"config.json: {field}={value!r} {why}")


def model_config(config: dict[str, Any], vocab_size: int) -> TransformerConfig:
    """The TransformerConfig of a MarianConfig (``config.json``) over ``vocab_size`` ids; what does
    not map is refused, naming its field."""
    get = {**MARIAN_DEFAULTS, **config}.get
    if config.get("model_type") != "marian":
        raise _refuse("model_type", config.get("model_type"), "is not MarianMT's (marian)")
    for enc, dec in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if get(enc) != get(dec):
            raise _refuse(dec, get(dec), f"differs from {enc}={get(enc)}; here both sides share it")
    activation = ACTIVATIONS.get(get("activation_function"))
    if activation is None:
        choices = ", ".join(ACTIVATIONS)
        raise _refuse("activation_function", get("activation_function"), f"is not one of {choices}")
    if not get("scale_embedding"):
        why = "has no equivalent: embeddings are scaled by sqrt(d_model) here"
        raise _refuse("scale_embedding", False, why)
    if not get("share_encoder_decoder_embeddings") or get("decoder_vocab_size") not in (
        None, config.get("vocab_size"),
    ):  # fmt: skip
        raise _refuse(
            "share_encoder_decoder_embeddings", get("share_encoder_decoder_embeddings"),
            "(separate source and target vocabularies, target_vocab.json) is not imported; only "
            "models with one vocabulary and embedding for both sides are",
        )  # fmt: skip
    if not get("tie_word_embeddings"):
        raise _refuse(
            "tie_word_embeddings", False, "has no equivalent: a shared embedding is also the output"
        )
    for field in ("encoder_layerdrop", "decoder_layerdrop"):
        if get(field):
            raise _refuse(field, get(field), "(layer drop) has no equivalent here; set it to 0.0")
    try:
        return TransformerConfig(
            src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=get("d_model"),
            num_heads=get("encoder_attention_heads"), num_encoder_layers=get("encoder_layers"),
            num_decoder_layers=get("decoder_layers"), d_ff=get("encoder_ffn_dim"),
            dropout=float(get("dropout")), attention_dropout=float(get("attention_dropout")),
            activation_dropout=float(get("activation_dropout")), activation=activation,
            norm_first=False, max_positions=get("max_position_embeddings"), output_bias=True,
            share_all_embeddings=True,
        )  # fmt: skip
    except ValueError as err:
        raise ConfigError(f"config.json describes a model that cannot be built: {err}") from err


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise DataError(f"{path} does not exist: a MarianMT directory holds it")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not JSON ({err})") from err


def tokenizer_config(model_dir: Path) -> dict[str, Any]:
    """``tokenizer_config.json`` (the unknown piece's name, the languages), or {} without one."""
    path = model_dir / "tokenizer_config.json"
    return _read_json(path) if path.is_file() else {}


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


class Vocabulary:
    """Our ids of a Marian vocabulary: ``pieces`` (ours, in id order), ``rows`` (the Marian row
    each takes its embedding from) and ``blocked`` (ids the Marian model cannot produce)."""

    def __init__(
        self, marian: list[str], pad: int, unk: int, start: int, eos: int, extra: list[str]
    ) -> None:
        specials = (pad, unk, start, eos)
        self.rows = [*specials, *(i for i in range(len(marian)) if i not in specials)]
        self.pieces = [marian[i] for i in self.rows]
        self.blocked = []
        if start == pad:  # bos: a copy of the start row, not an id of the Marian model
            if "<s>" in marian:
                raise DataError(
                    f"vocab.json has <s> (id {marian.index('<s>')}), but the decoder starts from "
                    f"pad (decoder_start_token_id={start}); its bos would need that name"
                )
            self.pieces[BOS_ID] = "<s>"
            self.blocked.append(BOS_ID)
        self.blocked += range(len(self.pieces), len(self.pieces) + len(extra))
        self.rows += [unk] * len(extra)
        self.pieces += extra

    def embedding(self, table: Tensor) -> Tensor:
        """Marian's (V_marian, ...) rows in our id order: (V, ...)."""
        return table[torch.tensor(self.rows)]


def vocabulary(model_dir: Path, config: dict[str, Any], spms: dict[str, bytes]) -> Vocabulary:
    """The vocabulary of vocab.json with the specials of config.json, and the pieces of the .spm
    files it lacks."""
    given = _read_json(model_dir / "vocab.json")
    size = config.get("vocab_size")
    if sorted(given.values()) != list(range(len(given))) or len(given) != size:
        raise DataError(
            f"{model_dir / 'vocab.json'} maps {len(given)} pieces to ids, but config.json's "
            f"vocab_size={size}: each id 0..vocab_size-1 needs one piece"
        )
    marian = [""] * size
    for piece, i in given.items():
        marian[i] = piece
    unk_piece = tokenizer_config(model_dir).get("unk_token", "<unk>")
    unk_piece = unk_piece.get("content") if isinstance(unk_piece, dict) else unk_piece
    if unk_piece not in given:
        raise DataError(f"vocab.json has no unknown piece {unk_piece!r}")
    get = {**MARIAN_DEFAULTS, **config}.get
    pad, eos = get("pad_token_id"), get("eos_token_id")
    start = config.get("decoder_start_token_id", pad)
    ids = {"pad_token_id": pad, "eos_token_id": eos, "decoder_start_token_id": start}
    for field, value in ids.items():
        if not isinstance(value, int) or not 0 <= value < size:
            raise _refuse(field, value, f"is not an id of the vocabulary (0..{size - 1})")
    if len({pad, eos, given[unk_piece]}) < 3 or start in (eos, given[unk_piece]):
        raise ConfigError(
            f"config.json: pad_token_id={pad}, eos_token_id={eos}, decoder_start_token_id={start} "
            f"and the unknown piece's id {given[unk_piece]} must be distinct (the start may be pad)"
        )
    extra = []
    for side in ("src", "tgt"):
        for p in sentencepiece_model_pb2.ModelProto.FromString(spms[side]).pieces:
            if p.type in SPM_KEPT and p.piece not in given and p.piece not in extra:
                extra.append(p.piece)
    if extra:
        log.warning(
            "%d pieces of the .spm files are not in vocab.json (%s ...): they stay pieces, read "
            "as unknown, as MarianTokenizer reads them", len(extra), " ".join(extra[:5]),
        )  # fmt: skip
    return Vocabulary(marian, pad, given[unk_piece], start, eos, extra)


def vocabulary_model(spm: bytes, pieces: list[str]) -> bytes:
    """A SentencePiece model that splits text as ``spm`` does and numbers the pieces as
    ``pieces`` (our specials first): ``spm``'s own pieces keep their scores and types, the others
    are UNUSED, which SentencePiece never produces."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(spm)
    own = {p.piece: (p.type, p.score) for p in proto.pieces if p.type in SPM_KEPT}
    Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
    del proto.pieces[:]
    for i, name in enumerate(pieces):
        if i == UNK_ID:
            kind, score = Piece.UNKNOWN, 0.0
        elif i < 4:
            kind, score = Piece.CONTROL, 0.0
        else:
            kind, score = own.get(name, (Piece.UNUSED, 0.0))
        proto.pieces.add(piece=name, type=kind, score=score)
    spec = proto.trainer_spec
    spec.vocab_size = len(pieces)
    spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id = range(4)
    spec.pad_piece, spec.unk_piece, spec.bos_piece, spec.eos_piece = pieces[:4]
    return proto.SerializeToString()


def import_marian(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint (as ``train.py`` writes them, for evaluation and fine-tuning) of the
    MarianMT directory ``model_dir``."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise DataError(f"{model_dir} is not a directory (a MarianMT model's, e.g. opus-mt-en-de)")
    config = _read_json(model_dir / "config.json")
    spms = {}
    for side, name in SPM_FILES.items():
        if not (model_dir / name).is_file():
            raise DataError(f"{model_dir / name} does not exist: a MarianMT directory holds it")
        spms[side] = (model_dir / name).read_bytes()
    vocab = vocabulary(model_dir, config, spms)
    cfg = model_config(config, len(vocab.pieces))
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
    embeddings = ("model.shared.weight", "model.encoder.embed_tokens.weight")
    shared = next((k for k in embeddings if k in weights), None)
    if shared is None:
        raise DataError(f"{model_dir}: its weights have no model.shared.weight (the embedding)")
    embedding = vocab.embedding(weights[shared].float())[:, perm]  # (V, D)
    for name in ("src_embed.tokens.weight", "tgt_embed.tokens.weight", "output.weight"):
        state[name] = embedding
    bias = weights.get("final_logits_bias", torch.zeros(1, config["vocab_size"]))[0].float()
    bias = vocab.embedding(bias)
    bias[vocab.blocked] = BLOCKED_LOGIT
    if not vocab.blocked and not bias.any():  # none: the model needs no output bias
        cfg.output_bias = False
    else:
        state["output.bias"] = bias
    model = Transformer(cfg)
    model.load_state_dict(state)  # every weight given, none left over
    tokenizers = {
        side: {"name": f"{SPM_FILES[side]}.model", "model": vocabulary_model(spm, vocab.pieces)}
        for side, spm in spms.items()
    }
    langs = tokenizer_config(model_dir)
    return {
        "hyper_parameters": {"model": cfg.to_dict()},
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "datamodule_hyper_parameters": {
            "src_lang": langs.get("source_lang"),
            "tgt_lang": langs.get("target_lang"),
            "vocab_size": len(vocab.pieces),
            "joint_vocab": False,
        },  # fmt: skip
        "tokenizers": tokenizers,
        "imported_from": {"path": str(model_dir), "format": "marian"},
    }


def train_overrides(cfg: TransformerConfig) -> list[str]:
    """The ``train.py`` options that describe the model ``cfg`` (those that differ from
    ``model/base.yaml``), with the data options its tokenizers need: ``init_from=`` takes a
    checkpoint of the configured model only."""
    base = OmegaConf.load(CONFIG_DIR / "model" / "base.yaml")
    out = [f"data.vocab_size={cfg.src_vocab_size}", "data.joint_vocab=false"]
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
        prog="python -m transformer.import_hf",
        description="Import a Hugging Face MarianMT model directory (an OPUS-MT model: "
        "config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm, "
        "vocab.json) as a checkpoint that evaluates, fine-tunes (init_from=) and exports.",
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


if __name__ == "__main__":
    main()
