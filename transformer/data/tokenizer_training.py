"""Training SentencePiece tokenizers with the project's fixed special ids
(:mod:`transformer.data.tokenizer`): on a uniform sample of the corpus's sentences, in a child
process that Ctrl-C stops at once, the model written atomically in its canonical form."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from transformer.atomic import atomic_write
from transformer.data.spm_model import canonical_model
from transformer.data.tokenizer import BOS_ID, EOS_ID, MODEL_TYPES, PAD_ID, UNK_ID, Tokenizer
from transformer.errors import DataError

log = logging.getLogger(__name__)


class SentenceSample:
    """A uniform random sample of at most ``size`` of the non-empty sentences given to
    :meth:`add` (reservoir sampling, Vitter's algorithm R, a list at a time), the same for the same
    ``seed`` and sentences; while no more than ``size`` have come, all of them, in order. It is
    what SentencePiece trains on: its time and memory grow with the sentences it is given."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seen = size, 0
        self.sentences: list[str] = []
        self._rng = np.random.default_rng(seed)

    def add(self, texts: list[str]) -> None:
        texts = [t for t in texts if t.strip()]
        room = max(0, self.size - len(self.sentences))
        self.sentences += texts[:room]
        rest = texts[room:]
        # Sentence number t (from 0) takes slot j ~ U{0..t} when j < size.
        slots = self._rng.integers(0, self.seen + room + np.arange(len(rest)) + 1)
        for i in np.flatnonzero(slots < self.size):
            self.sentences[slots[i]] = rest[i]
        self.seen += len(texts)


# SentencePiece's sample: its training time and memory grow with it (2.5 GB at 500,000 sentences
# of WMT length, docs/benchmarks.md#data-pipeline-at-wmt-sizes); data.spm_train_sentences
SPM_TRAIN_SENTENCES = 500_000


def train_tokenizer(
    texts: Iterable[str],
    model_path: str | os.PathLike,
    vocab_size: int,
    model_type: str = "unigram",
    max_sentences: int = SPM_TRAIN_SENTENCES,
    symbols: Iterable[str] = (),
) -> Tokenizer:
    """Train a SentencePiece model on ``texts`` (at most ``max_sentences`` of them, a random
    sample beyond: SentencePiece's time and memory grow with them) and write it to
    ``model_path`` (a ``.model`` file). ``symbols`` (tags such as ``<bt>``, target tokens such
    as ``<2de>``) become pieces of their own, never split.

    SentencePiece trains in a child process (:func:`_train_in_child`), so that Ctrl-C or SIGTERM
    stop it at once; the model comes back as bytes, in its :func:`canonical_model` form (the same
    bytes for the same data and settings, whichever process trained it), and is written
    atomically: an interrupted run leaves no file, whole or half-written, behind.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"spm_model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    model_path = Path(model_path)
    options = dict(
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        character_coverage=1.0,
        input_sentence_size=max_sentences,
        user_defined_symbols=list(symbols),
        shuffle_input_sentence=True,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
    log.info("training a %s SentencePiece model %s", model_type, model_path)
    model = _train_in_child([t for t in texts if t.strip()], options, model_path.name)
    model = canonical_model(model)
    try:
        atomic_write(model_path, lambda f: f.write(model))
    except OSError as err:
        raise DataError(
            f"could not write the tokenizer model {model_path} ({err.strerror or err}); free space "
            "there or set data.cache_dir to a disk with room"
        ) from err
    tokenizer = Tokenizer(model_path)
    log.info("trained %s SentencePiece model %s", model_type, model_path)
    return tokenizer


# The child's program: the sentences on stdin, one a line; the options as JSON in argv[1]; the
# model's bytes on stdout; SentencePiece's error as the last line of stderr. It imports only
# SentencePiece, and dies at once on SIGINT (a Python handler would wait for the C++ training).
_CHILD = """
import json, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
import sentencepiece as spm
data = sys.stdin.buffer.read().decode("utf-8")
sentences = data.split("\\n") if data else []
try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=sys.stdout.buffer, **json.loads(sys.argv[1])
    )
except RuntimeError as err:
    sys.exit(str(err).strip())
"""


def _train_in_child(sentences: list[str], options: dict[str, Any], name: str) -> bytes:
    """SentencePiece's training of model ``name`` in a child process, given the sentences (none
    holds a newline) and its options; the serialized model. The child is killed when this call
    ends early (an exception, Ctrl-C, or SIGTERM turned into an exception): it never outlives
    the call."""
    cmd = [sys.executable, "-c", _CHILD, json.dumps(options)]
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = subprocess.Popen(cmd, **pipes)
    try:
        model, err = proc.communicate("\n".join(sentences).encode("utf-8"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode < 0:
        signum = signal.Signals(-proc.returncode)
        hint = (
            f": out of memory? lower data.spm_train_sentences (now "
            f"{options['input_sentence_size']})"
            if signum == signal.SIGKILL
            else ""
        )
        raise DataError(f"SentencePiece training for {name} was stopped by {signum.name}{hint}")
    if proc.returncode:
        lines = err.decode("utf-8", "replace").strip().splitlines() or ["(no message)"]
        raise DataError(
            f"SentencePiece training for {name} failed: {lines[-1]}. If the vocabulary is too "
            f"large for this corpus, lower data.vocab_size (now {options['vocab_size']})"
        )
    return model
