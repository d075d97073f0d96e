"""A Marian vocabulary in our id order (the specials first), and the SentencePiece models that
split text as a MarianMT directory's ``.spm`` files do and number pieces as its ``vocab.json`` does
(:mod:`transformer.export.marian` says why)."""

from __future__ import annotations

import itertools
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
    """Our ids of a Marian vocabulary (file ``name``, its pieces ``marian`` by id, its special
    ``ids``, then the ``extra`` pieces it lacks): ``pieces`` (ours, in id order), ``rows`` (the
    Marian row each takes its embedding from) and ``blocked`` (ids the Marian model cannot
    produce)."""

    def __init__(self, marian: list[str], ids: dict[str, int], extra: list[str], name: str) -> None:
        specials = pad, _, start, _ = tuple(ids[k] for k in ("pad", "unk", "start", "eos"))
        self.rows = [*specials, *(i for i in range(len(marian)) if i not in specials)]
        self.pieces = [marian[i] for i in self.rows]
        self.blocked = []
        if start == pad:  # bos: a copy of the start row, not an id of the Marian model
            if "<s>" in marian:
                raise DataError(
                    f"{name} has <s> (id {marian.index('<s>')}), but the decoder starts from "
                    f"pad (decoder_start_token_id={start}); its bos would need that name"
                )
            self.pieces[BOS_ID] = "<s>"
            self.blocked.append(BOS_ID)
        self.blocked += range(len(self.pieces), len(self.pieces) + len(extra))
        self.rows += [ids["unk"]] * len(extra)
        self.pieces += extra

    def embedding(self, table: Tensor) -> Tensor:
        """Marian's (V_marian, ...) rows in our id order: (V, ...)."""
        return table[torch.tensor(self.rows)]


def read_vocab(path: Path, size_field: str, size: Any) -> list[str]:
    """The pieces of a vocab.json (target_vocab.json) by id; config.json's ``size_field`` is
    ``size``."""
    given = read_json(path)
    if sorted(given.values()) != list(range(len(given))) or len(given) != size:
        raise DataError(
            f"{path} maps {len(given)} pieces to ids, but config.json's {size_field}={size}: "
            f"each id 0..{size_field}-1 needs one piece"
        )
    pieces = [""] * size
    for piece, i in given.items():
        pieces[i] = piece
    return pieces


def special_ids(
    model_dir: Path, config: dict[str, Any], marian: list[str], name: str
) -> dict[str, int]:
    """pad, unk, start and eos of the target vocabulary ``marian`` (file ``name``): config.json's
    ids, the unknown piece's by its name."""
    unk_piece = tokenizer_config(model_dir).get("unk_token", "<unk>")
    unk_piece = unk_piece.get("content") if isinstance(unk_piece, dict) else unk_piece
    if unk_piece not in marian:
        raise DataError(f"{name} has no unknown piece {unk_piece!r}")
    get = {**MARIAN_DEFAULTS, **config}.get
    pad, eos, size = get("pad_token_id"), get("eos_token_id"), len(marian)
    start = config.get("decoder_start_token_id", pad)
    ids = {"pad_token_id": pad, "eos_token_id": eos, "decoder_start_token_id": start}
    for field, value in ids.items():
        if not isinstance(value, int) or not 0 <= value < size:
            raise refuse(field, value, f"is not an id of the vocabulary (0..{size - 1})")
    unk = marian.index(unk_piece)
    if len({pad, eos, unk}) < 3 or start in (eos, unk):
        raise ConfigError(
            f"config.json: pad_token_id={pad}, eos_token_id={eos}, decoder_start_token_id={start} "
            f"and the unknown piece's id {unk} must be distinct (the start may be pad)"
        )
    return {"pad": pad, "unk": unk, "start": start, "eos": eos}


def missing_pieces(spms: list[bytes], marian: list[str], name: str) -> list[str]:
    """The pieces that ``spms`` produce and the vocabulary ``marian`` (file ``name``) lacks."""
    known, extra = set(marian), []
    for spm in spms:
        for p in sentencepiece_model_pb2.ModelProto.FromString(spm).pieces:
            if p.type in SPM_KEPT and p.piece not in known and p.piece not in extra:
                extra.append(p.piece)
    if extra:
        log.warning(
            "%d pieces of the .spm files are not in %s (%s ...): they stay pieces, read as "
            "unknown, as MarianTokenizer reads them", len(extra), name, " ".join(extra[:5]),
        )  # fmt: skip
    return extra


def vocabularies(
    model_dir: Path, config: dict[str, Any], spms: dict[str, bytes]
) -> dict[str, Vocabulary]:
    """Each side's vocabulary, of one size: vocab.json for both, with the pieces of both .spm
    files it lacks; or, for separate vocabularies (``share_encoder_decoder_embeddings: false``),
    vocab.json for the source and target_vocab.json for the target, each with its .spm's missing
    pieces, the shorter filled with unused pieces (never produced, their logits blocked) so that
    one ``data.vocab_size`` holds both. The source's specials are the target's pieces."""
    get = {**MARIAN_DEFAULTS, **config}.get
    size = config.get("vocab_size")
    source = read_vocab(model_dir / "vocab.json", "vocab_size", size)
    if get("share_encoder_decoder_embeddings"):
        ids = special_ids(model_dir, config, source, "vocab.json")
        extra = missing_pieces([*spms.values()], source, "vocab.json")
        shared = Vocabulary(source, ids, extra, "vocab.json")
        return {"src": shared, "tgt": shared}
    tgt_size = config.get("decoder_vocab_size") or size
    target = read_vocab(model_dir / "target_vocab.json", "decoder_vocab_size", tgt_size)
    ids = special_ids(model_dir, config, target, "target_vocab.json")
    src_ids = {}
    for name, i in ids.items():
        piece = target[i]
        if name == "start":  # the source has no start: bos is its own <s> or a copy of pad
            i = source.index("<s>") if "<s>" in source else src_ids["pad"]
        elif piece not in source:
            raise DataError(
                f"{model_dir / 'vocab.json'} has no {piece!r}, target_vocab.json's {name} piece: "
                "the source needs it too"
            )
        else:
            i = source.index(piece)
        src_ids[name] = i
    extra = {
        "src": missing_pieces([spms["src"]], source, "vocab.json"),
        "tgt": missing_pieces([spms["tgt"]], target, "target_vocab.json"),
    }
    sizes = {"src": len(source) + len(extra["src"]), "tgt": len(target) + len(extra["tgt"])}
    short, gap = min(sizes, key=sizes.__getitem__), abs(sizes["src"] - sizes["tgt"])
    taken = {*source, *target, *extra["src"], *extra["tgt"]}
    fillers = (f"<unused{i}>" for i in itertools.count())
    extra[short] += itertools.islice((p for p in fillers if p not in taken), gap)
    return {
        "src": Vocabulary(source, src_ids, extra["src"], "vocab.json"),
        "tgt": Vocabulary(target, ids, extra["tgt"], "target_vocab.json"),
    }


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
