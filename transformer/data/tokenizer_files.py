"""Which SentencePiece models a run uses and where they live in the cache (``cache_dir/spm``):
those trained on the training split, named by the split's identity and the settings, or a
checkpoint's, named by what they do (:func:`model_digest`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from transformer.atomic import atomic_write
from transformer.data.spm_model import model_digest
from transformer.data.token_cache import fingerprint
from transformer.data.tokenizer import MODEL_TYPES, Tokenizer
from transformer.errors import CheckpointError, DataError


@dataclass(frozen=True)
class TokenizerFiles:
    spm_dir: Path
    corpus: str  # the source's tag
    src_lang: str  # the source language, or several joined by "-" (several corpora)
    tgt_lang: str
    vocab_size: int
    model_type: str
    joint: bool  # one model for both languages
    train_sentences: int  # SentencePiece samples at most this many sentences to train on
    symbols: tuple[str, ...] = ()  # tags and target tokens, each kept one piece

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(
                f"spm_model_type must be one of {MODEL_TYPES}, got {self.model_type!r}"
            )
        if self.vocab_size <= 4:
            raise ValueError(
                f"data.vocab_size={self.vocab_size} leaves no room beyond pad/unk/bos/eos"
            )
        if self.train_sentences <= 100:  # SentencePiece's own lower bound
            raise ValueError(
                f"data.spm_train_sentences must be over 100 (SentencePiece samples at least that "
                f"many), got {self.train_sentences}"
            )

    @property
    def _langs(self) -> str:
        return "-".join(sorted((self.src_lang, self.tgt_lang)))

    def trained_paths(self, train_identity: str) -> tuple[Path, Path]:
        """Source and target model files trained on the split of this identity (one file twice
        for a joint vocabulary)."""
        settings = (train_identity, self.vocab_size, self.model_type, self.train_sentences)
        settings += (self.symbols,) if self.symbols else ()
        kind = f"{self.model_type}{self.vocab_size}"
        names = [self._langs] if self.joint else [self.src_lang, self.tgt_lang]
        src, *tgt = (
            self.spm_dir / f"{self.corpus}.{n}.{kind}.{fingerprint(*settings, n)}.model"
            for n in names
        )
        return src, tgt[0] if tgt else src

    def load(self, src_path: Path, tgt_path: Path) -> tuple[Tokenizer, Tokenizer]:
        """The trained models, which must have ``vocab_size`` pieces."""
        src = Tokenizer(src_path)
        tgt = src if self.joint else Tokenizer(tgt_path)
        for tok in {src, tgt}:
            if tok.vocab_size != self.vocab_size:
                raise DataError(
                    f"{tok.model_path} has {tok.vocab_size} pieces, not data.vocab_size="
                    f"{self.vocab_size}; delete it so it is trained again"
                )
        return src, tgt

    def from_checkpoint(
        self, src: bytes, tgt: bytes, checkpoint: str | os.PathLike
    ) -> tuple[Tokenizer, Tokenizer]:
        """The models ``checkpoint`` was trained with (their bytes, alike for a joint vocabulary),
        checked against these settings; :func:`save_missing` writes them to the cache, named by
        what they do (:func:`model_digest`)."""
        tokenizers = []
        for side, lang, model in (("source", self.src_lang, src), ("target", self.tgt_lang, tgt)):
            name = f"{self.corpus}.{self._langs if self.joint else lang}"
            try:
                path = self.spm_dir / f"{name}.{model_digest(model)}.model"
                tokenizers.append(Tokenizer(path, model_proto=model))
            except DataError as err:
                raise CheckpointError(
                    f"checkpoint {checkpoint}: its {side} tokenizer is damaged ({err}); resume "
                    "from another checkpoint of the run (they hold the same tokenizers)"
                ) from err
        src_tok, tgt_tok = tokenizers
        if self.joint and src_tok.digest != tgt_tok.digest:
            raise DataError(
                f"checkpoint {checkpoint} has separate source and target tokenizers, but "
                "data.joint_vocab=true; resume with data.joint_vocab=false, as it was trained"
            )
        for side, tok in zip(("source", "target"), tokenizers, strict=True):
            if tok.vocab_size != self.vocab_size:
                raise DataError(
                    f"the {side} tokenizer of checkpoint {checkpoint} has {tok.vocab_size} "
                    f"pieces, but data.vocab_size={self.vocab_size}; resume with "
                    f"data.vocab_size={tok.vocab_size}, the setting it was trained with"
                )
        return src_tok, src_tok if self.joint else tgt_tok


def save_missing(tokenizers: tuple[Tokenizer, Tokenizer]) -> None:
    """Write tokenizers built from bytes to their ``model_path`` (atomically) where none is."""
    for tok in set(tokenizers):
        if not tok.model_path.exists():
            model = tok.to_bytes()
            atomic_write(tok.model_path, lambda f, model=model: f.write(model))
