"""SentencePiece tokenizers with the project's fixed special ids.

The ids ``pad=0, unk=1, bos=2, eos=3`` are fixed for the whole project: the model sizes its
embedding and zeroes the padding row from them, so every tokenizer is trained with exactly these.

Two tokenizers are the same when they tokenize alike: their models are compared (and caches
named) by :func:`transformer.data.spm_model.model_digest`, which leaves out where and how a model
was trained.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from transformer.data.spm_model import model_digest
from transformer.errors import DataError

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

MODEL_TYPES = ("unigram", "bpe")

WORD_START = "\u2581"  # SentencePiece's space


def word_index(ids: Sequence[int], pieces: Sequence[str]) -> list[int]:
    """The word (0, 1, ...) of each piece: a word starts at a piece beginning with "▁", and
    bos/eos are words of their own."""
    index: list[int] = []
    for i, (token, piece) in enumerate(zip(ids, pieces, strict=True)):
        special = token in (BOS_ID, EOS_ID)
        starts = i == 0 or special or piece.startswith(WORD_START) or ids[i - 1] in (BOS_ID, EOS_ID)
        index.append(index[-1] + starts if index else 0)
    return index


def user_defined(model: bytes) -> list[str]:
    """A SentencePiece model's user-defined pieces (tags, target-language tokens), in id order:
    never split, wherever they are in a text."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    user = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    return [p.piece for p in proto.pieces if p.type == user]


def leading_pieces(model: bytes) -> re.Pattern[str] | None:
    """What :meth:`Tokenizer.split_leading` takes off a text's start: any of the model's
    user-defined pieces (longest first), after spaces; None if it has none."""
    names = sorted(user_defined(model), key=len, reverse=True)
    return re.compile(r"\s*(" + "|".join(map(re.escape, names)) + ")") if names else None


class Tokenizer:
    """A trained SentencePiece model: text <-> piece ids, no bos/eos (the collator adds them)."""

    def __init__(self, model_path: str | os.PathLike, *, model_proto: bytes | None = None) -> None:
        """Load ``model_path``, or, given ``model_proto`` (the model's bytes, as a checkpoint
        carries them), build from those; ``model_path`` then only names it."""
        self.model_path = Path(model_path)
        self.prefix: tuple[int, ...] = ()  # ids put before every non-empty encoding
        self.unless_written = False  # (with_prefix) not before a text that starts with its own
        if model_proto is not None:
            try:
                self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
            except RuntimeError as err:
                raise DataError(
                    f"tokenizer model {self.model_path.name} is damaged: SentencePiece cannot "
                    f"read its bytes ({str(err).strip()})"
                ) from err
        elif not self.model_path.is_file():
            raise DataError(
                f"tokenizer model {self.model_path} does not exist; delete the data cache "
                "(data.cache_dir) so the tokenizer is trained again"
            )
        else:
            try:
                self._sp = spm.SentencePieceProcessor(model_file=str(self.model_path))
            except (OSError, RuntimeError) as err:
                raise DataError(
                    f"tokenizer model {self.model_path} cannot be read ({err}); delete it so it "
                    "is trained again"
                ) from err
        ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"{self.model_path} has special ids pad/unk/bos/eos={ids}, but this project needs "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; delete the file so it is trained again"
            )
        self._leading = leading_pieces(self.to_bytes())

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def to_bytes(self) -> bytes:
        """The serialized model: ``Tokenizer(name, model_proto=...)`` rebuilds it anywhere."""
        return self._sp.serialized_model_proto()

    @property
    def digest(self) -> str:
        """:func:`model_digest` of the model: equal for tokenizers that tokenize alike."""
        return model_digest(self.to_bytes())

    @property
    def model_type(self) -> str:
        """The SentencePiece model's kind: ``unigram``, ``bpe``, ``word`` or ``char``."""
        spec = sentencepiece_model_pb2.ModelProto.FromString(self.to_bytes()).trainer_spec
        return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(spec.model_type).lower()

    def with_prefix(self, pieces: Sequence[str], unless_written: bool = False) -> Tokenizer:
        """This tokenizer, but each non-empty encoding starts with ``pieces`` (a multilingual
        model's target token, a corpus's tag), which must be pieces of the model. With
        ``unless_written`` (translation), a text that starts with user-defined pieces of its own
        (a line naming its target language, ``<2fr> ...``) keeps them instead."""
        ids = tuple(self._sp.piece_to_id(p) for p in pieces)
        unknown = [p for p, i in zip(pieces, ids, strict=True) if i == UNK_ID]
        if unknown and (have := user_defined(self.to_bytes())):
            named = ", ".join(have[:20]) + (", ..." if len(have) > 20 else "")
            raise DataError(
                f"{self.model_path} has no piece {unknown[0]}; its own tokens are {named}: "
                "use one of them, or train a new model with it"
            )
        if unknown:
            raise DataError(
                f"{self.model_path} has no piece {unknown[0]}: this SentencePiece model was "
                "trained without it (before data.target_token or the corpus's tag was set); "
                "train a new model with them, or leave them out"
            )
        prefixed = copy.copy(self)
        prefixed.prefix, prefixed.unless_written = ids, unless_written
        return prefixed

    def _prefix_before(self, lead: list[int]) -> tuple[int, ...]:
        """The prefix for a text that starts with the user-defined pieces ``lead``."""
        return () if lead and self.unless_written else self.prefix

    def split_leading(self, text: str) -> tuple[list[int], str]:
        """The ids of the user-defined pieces ``text`` starts with (a target-language token such
        as ``<2de>`` or OPUS-MT's ``>>fra<<``, a tag), and the text after them. SentencePiece
        alone would put a word start before the first (``▁ >>fra<<``); MarianTokenizer, and
        :meth:`with_prefix`, give the token and then the rest encoded as a text of its own."""
        ids: list[int] = []
        while self._leading is not None and (found := self._leading.match(text)):
            ids.append(self._sp.piece_to_id(found.group(1)))
            text = text[found.end() :]
        return ids, text

    def encode(self, text: str) -> list[int]:
        lead, text = self.split_leading(text)
        ids = [*lead, *self._sp.encode(text, out_type=int)]
        return [*self._prefix_before(lead), *ids] if ids else ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Encode many texts at once (SentencePiece uses its own threads)."""
        leads, rests = zip(*map(self.split_leading, texts), strict=True) if texts else ((), ())
        encoded = self._sp.encode(list(rests), out_type=int, num_threads=os.cpu_count() or 1)
        return [
            [*self._prefix_before(lead), *lead, *ids] if lead or ids else ids
            for lead, ids in zip(leads, encoded, strict=True)
        ]

    def resample(self, ids: Sequence[int], alpha: float, nbest: int, seed: int) -> list[int]:
        """Another segmentation of the text that ``ids`` (this tokenizer's encoding, prefix
        included) spell, drawn by SentencePiece's sampler: a unigram model's from the ``nbest``
        best segmentations (-1: all of them) with probabilities proportional to their
        likelihood to the power ``alpha``, a BPE model's by dropping each merge with probability
        ``alpha`` (``nbest`` unused). The sampler's generator is seeded with ``seed`` (below
        2**32 - 1) first: the same seed draws the same segmentation (sentencepiece >= 0.2.3
        reseeds it; earlier ones seed each thread's once). Ids holding an unknown piece come
        back as they are: the text of ``<unk>`` is lost."""
        body = [int(i) for i in ids[len(self.prefix) :]]
        if UNK_ID in body:
            return [int(i) for i in ids]
        spm.set_random_generator_seed(seed)
        lead, text = self.split_leading(self._sp.decode(body))
        drawn = lead + self._sp.encode(
            text, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=nbest
        )
        return [*self.prefix, *drawn] if drawn and self.prefix else drawn

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text. Stops at the first eos, drops pad and bos; unk decodes as SentencePiece's
        unknown marker."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                kept.append(i)
        return self._sp.decode(kept)

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """Ids -> their SentencePiece pieces, specials included (``<s>``, ``</s>``, ...)."""
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def __getstate__(self) -> dict:
        return {
            "model_path": self.model_path,
            "model_proto": self.to_bytes(),
            "prefix": self.prefix,
            "unless_written": self.unless_written,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_path"], model_proto=state["model_proto"])
        self.prefix, self.unless_written = state["prefix"], state["unless_written"]
