"""What the tests share: a tiny synthetic parallel corpus, a tiny model, batches for it, and Hydra
configs that train on the corpus in seconds."""

from __future__ import annotations

import csv
import gzip
import random
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from sentencepiece import sentencepiece_model_pb2

from transformer import Transformer, TransformerConfig
from transformer.data.collate import Batch, Collator

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

# A made-up language pair: each German word is the image of one English word, so a few training
# steps already move the loss and BLEU has something to score.
WORDS_EN = (
    "a the man woman dog cat child girl boy walks runs sits eats red blue green big small on in "
    "near under street park house tree ball water bike car plays jumps looks"
).split()
WORDS_DE = (
    "ein der mann frau hund katze kind mädchen junge geht läuft sitzt isst rot blau grün groß "
    "klein auf in bei unter straße park haus baum ball wasser fahrrad auto spielt springt schaut"
).split()
TINY_VOCAB = 64  # SentencePiece pieces that the corpus fills
SPLITS = {"train": 400, "val": 32, "test": 32}  # sentence pairs of write_corpus's splits
DATA_SPLITS = {"train": 300, "val": 30, "test": 25}  # the data tests' corpus (data_pairs)


def sentence_pairs(
    n: int, seed: int, max_words: int = 10, punctuated: bool = False
) -> tuple[list[str], list[str]]:
    """``n`` English sentences of 2 to ``max_words`` words and their German, word by word;
    ``punctuated``: capitalised and ending in a full stop."""
    rng = random.Random(seed)
    en, de = [], []
    for _ in range(n):
        idx = [rng.randrange(len(WORDS_EN)) for _ in range(rng.randint(2, max_words))]
        pair = (" ".join(words[i] for i in idx) for words in (WORDS_EN, WORDS_DE))
        e, d = (s.capitalize() + "." for s in pair) if punctuated else pair
        en.append(e)
        de.append(d)
    return en, de


def data_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """The data tests' sentences: 2-12 words, punctuated (characters enough for 64 pieces)."""
    return sentence_pairs(n, seed, max_words=12, punctuated=True)


def write_lines(path: Path, lines: list[str]) -> Path:
    """One sentence a line, UTF-8; gzipped where the name ends in ``.gz``."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def write_corpus(
    root: Path, splits: dict[str, int] = SPLITS, suffix: str = "", pairs=sentence_pairs
) -> Path:
    """``{split}.{en,de}{suffix}`` in ``root``: ``pairs(n, seed=i)`` for the i-th split."""
    root.mkdir(parents=True, exist_ok=True)
    for seed, (split, n) in enumerate(splits.items()):
        en, de = pairs(n, seed)
        write_lines(root / f"{split}.en{suffix}", en)
        write_lines(root / f"{split}.de{suffix}", de)
    return root


def trained_elsewhere(model: bytes) -> bytes:
    """A SentencePiece model as another process on another machine would have written the same
    training: SentencePiece records its output path (with the process id) and thread count."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    proto.trainer_spec.model_prefix = "/elsewhere/spm/.corpus.de-en.unigram64.4242.tmp"
    proto.trainer_spec.num_threads = 64
    return proto.SerializeToString()


def other_tokenizer(model: bytes) -> bytes:
    """The model with one piece's score changed: it tokenizes (a little) differently."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    proto.pieces[10].score += 1.0
    return proto.SerializeToString()


def tiny_model_config(vocab: int = 50, **overrides) -> dict:
    """``TransformerConfig`` keyword arguments of a 2+2-layer model, 32 wide, 4 heads."""
    sizes = dict(d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64)
    return dict(src_vocab_size=vocab, tgt_vocab_size=vocab, **sizes) | overrides


def tiny_model(vocab: int = 50, **overrides) -> Transformer:
    """The tiny model in eval mode (dropout off): ``.train()`` it to train."""
    return Transformer(TransformerConfig(**tiny_model_config(vocab, **overrides))).eval()


def lengths_to_pad_mask(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]  # True at padding


def padded_batch(lengths: list[tuple[int, int]], seed: int = 0, vocab: int = 20) -> Batch:
    """A collated batch of random pairs with these (source, target) lengths: right-padded."""
    rng = np.random.default_rng(seed)
    pairs = [(rng.integers(4, vocab, s), rng.integers(4, vocab, t)) for s, t in lengths]
    return Collator()([(i, src, tgt) for i, (src, tgt) in enumerate(pairs)])


def read_metrics(out_dir: Path) -> list[dict[str, str]]:
    """The rows of a run's CSV log (``logger=csv``)."""
    (path,) = out_dir.glob("csv/version_*/metrics.csv")
    with open(path) as f:
        return list(csv.DictReader(f))


def logged(out_dir: Path, key: str) -> list[float]:
    """The values of ``key`` in a run's CSV log, in the order they were logged."""
    return [float(r[key]) for r in read_metrics(out_dir) if r.get(key)]


ATTENTION_MAPS_OFF = "~callbacks.attention_maps"


def tiny_overrides(corpus: Path) -> list[str]:
    """Command-line overrides that train the tiny model on :func:`write_corpus`'s files."""
    return [
        "model=tiny",
        "data=local",
        f"data.root={corpus}",
        f"data.cache_dir={corpus / 'cache'}",
        f"data.vocab_size={TINY_VOCAB}",
        "data.num_workers=0",
        "data.max_tokens=512",
        "logger=csv",
        "trainer.accelerator=cpu",
        "trainer.precision=32-true",  # not auto: the same on CPUs with and without bf16
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "trainer.num_sanity_val_steps=0",
        "validation.bleu_sentences=8",
        # warmup then inverse square root: a rate that does not depend on trainer.max_steps (the
        # recipe's warmup-stable-decay ends at max_steps, so a test that stops at step k and
        # resumes to n would compare two schedules); tests of the budgeted ones add optim=...
        "optim=adamw",
        "optim.optimizer.lr=3e-3",
        "optim.scheduler.warmup_steps=10",
        ATTENTION_MAPS_OFF,  # its figures cost seconds; tests/test_analysis_training.py runs it
    ]


def compose_cfg(overrides: list[str], out_dir: Path | None = None):
    """``configs/train.yaml`` with these overrides, as ``python train.py`` composes it."""
    out = [f"paths.output_dir={out_dir}"] if out_dir is not None else ["paths.output_dir=unused"]
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[*out, *overrides])
