"""A Marian vocabulary in our id order (the specials first), and the SentencePiece models that
split text as a MarianMT directory's ``.spm`` files do and number pieces as its ``vocab.json`` does
(:mod:`transformer.export.marian` says why)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from sentencepiece import sentencepiece_model_pb2
from torch import Tensor

from transformer.data.tokenizer import BOS_ID, UNK_ID
from transformer.errors import ConfigError, DataError
from transformer.export.marian import MARIAN_DEFAULTS, SPM_KEPT, read_json, refuse, tokenizer_config

log = logging.getLogger(__name__)
# A multilingual model's target-language token (>>fra<<, >>pt_br<<): MarianTokenizer takes one off
# a source line's start as a piece of its own; vocab.json has them, the .spm files do not.
LANGUAGE_TOKEN = re.compile(r">>[^<>\s]+<<")


def language_tokens(pieces: Sequence[str]) -> list[str]:
    """The target-language tokens (``>>fra<<``) among ``pieces``, in their order."""
    return [p for p in pieces if LANGUAGE_TOKEN.fullmatch(p)]


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
    given = read_json(model_dir / "vocab.json")
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
            raise refuse(field, value, f"is not an id of the vocabulary (0..{size - 1})")
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


def vocabulary_model(spm: bytes, pieces: list[str], user: Sequence[str] = ()) -> bytes:
    """A SentencePiece model that splits text as ``spm`` does and numbers the pieces as
    ``pieces`` (our specials first): ``spm``'s own pieces keep their scores and types, those in
    ``user`` (a source's language tokens) are USER_DEFINED, never split (``Tokenizer`` takes one
    off a text's start as MarianTokenizer does), the others UNUSED, which SentencePiece never
    produces."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(spm)
    Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
    own = {p.piece: (p.type, p.score) for p in proto.pieces if p.type in SPM_KEPT}
    own |= {name: (Piece.USER_DEFINED, 0.0) for name in user}
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
