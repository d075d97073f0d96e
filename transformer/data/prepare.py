"""Data preparation without Lightning: :func:`prepare` trains the SentencePiece model(s) on a
run's corpora (:class:`transformer.data.corpora.CorpusTexts`) and builds the token-id caches that
:class:`transformer.data.datamodule.TranslationDataModule` serves batches from.

Caches, under ``cache_dir``: ``spm/<corpus>.<langs>.<type><vocab>.<hash>.model`` (the hash covers
the training split's identity and the tokenizer settings) and
``tok/<corpus>.<split>.<src>-<tgt>.<hash>/`` (covering the split's identity, what the tokenizers
do, :attr:`Tokenizer.digest`, and ``max_len``). A raw file's identity is its path, size and mtime.
A checkpoint's tokenizers (given to resume) are saved as ``spm/<corpus>.<langs>.<digest>.model``.
With several corpora the SentencePiece models train on all their training splits, and each
corpus's splits are cached apart.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from transformer.atomic import sweep_temporaries
from transformer.data.corpora import Corpus, CorpusTexts, Key
from transformer.data.source_tokens import special_tokens
from transformer.data.token_cache import (
    CACHE_FORMAT,
    DamagedCache,
    TokenizedSplit,
    build_split,
    fingerprint,
)
from transformer.data.tokenizer import Tokenizer
from transformer.data.tokenizer_files import TokenizerFiles, save_missing
from transformer.data.tokenizer_training import SentenceSample, train_tokenizer
from transformer.errors import Interrupted

log = logging.getLogger(__name__)


@contextlib.contextmanager
def interruptible(what: str) -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM raise :class:`Interrupted`: the exception removes the
    temporaries being written on its way out (SIGTERM's default ends the process on the spot;
    Lightning installs its own handler only after data preparation). The previous handlers come
    back after the block."""
    if threading.current_thread() is not threading.main_thread():  # (only it can set them)
        yield
        return

    def stop(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        raise Interrupted(
            f"{name} during {what}: stopped; what was finished is kept and nothing half-written "
            "is left; run the same command again to go on",
            signum,
        )

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def check_batching(
    max_len: int,
    max_tokens: int | None,
    batch_size: int | None,
    num_buckets: int,
    validation_max_tokens: int | None,
) -> None:
    """The data module's batching options, checked together (a ValueError names the fault)."""
    if max_len < 1:
        raise ValueError(f"max_len must be positive, got {max_len}")
    if max_tokens is not None and max_tokens < max_len + 1:
        raise ValueError(
            f"max_tokens={max_tokens} cannot hold one sentence of max_len={max_len} pieces "
            f"(+1 for bos/eos); raise data.max_tokens or lower data.max_len"
        )
    if max_tokens is None and not batch_size:
        raise ValueError("set data.max_tokens (token budget) or data.batch_size (sentences)")
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 0:
        raise ValueError(
            f"num_buckets must be a count >= 0 (0: no shape buckets), got {num_buckets!r}"
        )
    if validation_max_tokens is not None and (
        max_tokens is None or validation_max_tokens < max_len + 1
    ):
        raise ValueError(
            f"validation.max_tokens={validation_max_tokens} needs token-budget batches "
            f"(data.max_tokens) and room for one sentence of max_len={max_len} pieces (+1); "
            "raise it, or set it to null (data.max_tokens)"
        )


def tokenizer_files(
    spm_dir: Path,
    corpora: list[Corpus],
    vocab_size: int,
    model_type: str,
    joint: bool,
    train_sentences: int,
) -> TokenizerFiles:
    """Where the corpora's SentencePiece models live in ``spm_dir``, and how they train."""
    src_langs = sorted({c.source.src_lang for c in corpora})
    tgt_langs = sorted({c.source.tgt_lang for c in corpora})
    return TokenizerFiles(
        spm_dir, "+".join(dict.fromkeys(c.source.tag for c in corpora)), "-".join(src_langs),
        "-".join(tgt_langs), vocab_size, model_type, joint, train_sentences,
        special_tokens(corpora),
    )  # fmt: skip


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` leaves ready: the tokenizers and every split's token ids."""

    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    splits: dict[Key, TokenizedSplit]  # (corpus, split) ->
    trains: list[Key]  # each corpus's training split, in corpus order


def prepare(
    texts: CorpusTexts,
    files: TokenizerFiles,
    cache_dir: Path,
    max_len: int,
    given: tuple[Tokenizer, Tokenizer] | None = None,
) -> Prepared:
    """Make sure tokenizers and token-id caches exist, building only what is missing (or
    damaged), and load them. The tokenizers are ``given`` (a checkpoint's, saved into the cache)
    or trained on the training splits. Ctrl-C or SIGTERM stop it with :class:`Interrupted`,
    leaving no temporary behind; those of killed runs are removed first."""
    for folder in ("spm", "tok"):
        for path in sweep_temporaries(cache_dir / folder):
            log.info("removed %s, left by a process that no longer runs", path)
    with interruptible("data preparation"):
        return _build(texts, files, cache_dir, max_len, given)


def _build(
    texts: CorpusTexts,
    files: TokenizerFiles,
    cache_dir: Path,
    max_len: int,
    given: tuple[Tokenizer, Tokenizer] | None,
) -> Prepared:
    keys = [(c, s) for c in range(len(texts.corpora)) for s in texts.splits_of(c)]
    for c, corpus in enumerate(texts.corpora):
        corpus.source.prepare(texts.splits_of(c))
    identities = {(c, s): texts.corpora[c].source.identity(s) for c, s in keys}
    trains = texts.trains()
    if given is not None:
        save_missing(given)
        src_tok, tgt_tok = given
    else:
        train_identity = "+".join(identities[key] for key in trains)
        src_tok, tgt_tok = _trained_tokenizers(texts, files, train_identity)
    tok_digest = "+".join(t.digest for t in (src_tok, tgt_tok))
    paths = {}
    for c, s in keys:
        parts = (CACHE_FORMAT, identities[c, s], tok_digest, max_len if (c, s) in trains else None)
        prefix = texts.prefix(c, s)
        key = fingerprint(*parts, prefix) if prefix else fingerprint(*parts)
        source = texts.corpora[c].source
        pair = f"{source.src_lang}-{source.tgt_lang}"
        paths[c, s] = cache_dir / "tok" / f"{source.tag}.{s}.{pair}.{key}"
    splits: dict[Key, TokenizedSplit] = {}
    for key in keys:
        if paths[key].exists():
            try:
                splits[key] = TokenizedSplit.load(paths[key])
                log.info("%s/%s: token ids from cache %s", texts.tag(key[0]), key[1], paths[key])
            except DamagedCache as err:  # made again from the text
                log.warning("%s: building it again", err)
                shutil.rmtree(paths[key])
    missing = [key for key in keys if key not in splits]
    for c, s in missing:  # the small splits first: bad input fails before the long work
        if (c, s) not in trains:
            texts.read(s, c)
    for c, s in missing:
        build_split(
            texts.chunks(s, c),
            src_tok.with_prefix(texts.prefix(c, s)),
            tgt_tok,
            paths[c, s],
            max_len if (c, s) in trains else None,
            f"{texts.tag(c)}/{s}",
        )
        splits[c, s] = TokenizedSplit.load(paths[c, s])
    return Prepared(src_tok, tgt_tok, splits, trains)


def _trained_tokenizers(
    texts: CorpusTexts, files: TokenizerFiles, train_identity: str
) -> tuple[Tokenizer, Tokenizer]:
    """The tokenizers trained on the training splits (trained now unless cached)."""
    src_path, tgt_path = files.trained_paths(train_identity)
    if not (src_path.exists() and tgt_path.exists()):
        settings = files.vocab_size, files.model_type, files.train_sentences, files.symbols
        for c, corpus in enumerate(texts.corpora):  # the small splits before the long work
            for s in texts.splits_of(c):
                if s != corpus.splits["train"]:
                    texts.read(s, c)
        # One pass over the training splits checks them and draws SentencePiece's sample(s).
        samples = [SentenceSample(files.train_sentences) for _ in range(1 if files.joint else 2)]
        for c, corpus in enumerate(texts.corpora):
            for part in texts.chunks(corpus.splits["train"], c):
                samples[0].add(part.src)
                samples[-1].add(part.tgt)
        paths = [src_path] if files.joint else [src_path, tgt_path]
        for path, sample in zip(paths, samples, strict=True):
            if not path.exists():
                train_tokenizer(sample.sentences, path, *settings)
    return files.load(src_path, tgt_path)
