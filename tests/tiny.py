"""What the tests share: the tiny synthetic parallel corpus (``transformer.data.synthetic``), a
tiny model, batches for it, and Hydra configs that train on the corpus in seconds."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from sentencepiece import sentencepiece_model_pb2

from transformer import Transformer, TransformerConfig
from transformer.allocator import KERNEL_CACHES
from transformer.configs import CONFIG_DIR
from transformer.data.collate import Batch, Collator
from transformer.data.synthetic import (  # noqa: F401 (the tests' names for them)
    SPLITS,
    Pairs,
    sentence_pairs,
    write_corpus,
    write_lines,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = CONFIG_DIR

TINY_VOCAB = 64  # SentencePiece pieces that the corpus fills
DATA_SPLITS = {"train": 300, "val": 30, "test": 25}  # the data tests' corpus (data_pairs)


def data_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """The data tests' sentences: 2-12 words, punctuated (characters enough for 64 pieces)."""
    return sentence_pairs(n, seed, max_words=12, punctuated=True)


def write_language(
    root: Path, tgt: str, splits: dict[str, int], pairs: Pairs, seed: int = 0, reverse: bool = False
) -> Path:
    """``{split}.en`` and ``{split}.{tgt}`` from ``pairs(n, seed + i)`` for the i-th split; with
    ``reverse`` the German's words reversed (a second "language" of the same English sentences,
    that only the target token tells apart)."""
    root.mkdir(parents=True)
    for k, (split, n) in enumerate(splits.items()):
        en, de = pairs(n, seed + k)
        if reverse:
            de = [" ".join(reversed(x.split())) for x in de]
        write_lines(root / f"{split}.en", en)
        write_lines(root / f"{split}.{tgt}", de)
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
        ATTENTION_MAPS_OFF,  # its figures cost seconds; analysis/test_analysis_training.py runs it
    ]


def compose_cfg(overrides: list[str], out_dir: Path | None = None):
    """``transformer/configs/train.yaml`` with these overrides, as ``python train.py`` composes
    it."""
    out = [f"paths.output_dir={out_dir}"] if out_dir is not None else ["paths.output_dir=unused"]
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[*out, *overrides])


def compose_eval_cfg(overrides: list[str], out_dir: Path):
    """``transformer/configs/evaluate.yaml`` with these overrides, as ``python evaluate.py``
    composes it."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("evaluate", overrides=[f"paths.output_dir={out_dir}", *overrides])


def prepared_datamodule(tokenizers: tuple[bytes, bytes] | None = None, **kwargs):
    """A ``TranslationDataModule(**kwargs)`` prepared and set up for fitting; with
    ``tokenizers``, those of a checkpoint (``last.ckpt``) instead of training its own."""
    from transformer.data import datamodule  # Lightning: imported by the tests that use it

    dm = datamodule.TranslationDataModule(**kwargs)
    if tokenizers is not None:
        dm.use_tokenizers(*tokenizers, checkpoint="last.ckpt")
    dm.prepare_data()
    dm.setup("fit")
    return dm


def script_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``train.py`` started by a test: this checkout first on the path, then
    what the caller's path holds (where packages live outside site-packages, as the GPU check
    installs them); no ~/.netrc and no API key, so no wandb key."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["HOME"] = str(tmp_path / "home")
    env.pop("WANDB_API_KEY", None)
    return env


# The start of a script that probes glibc's heap: ``libc`` with malloc, free and mallinfo2 (the
# main arena's sizes and the count of blocks mapped for themselves).
GLIBC_HEAP_PROBE = """
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Mallinfo2
"""

# Float32 linear layers (oneDNN's kernel, transformer/linear.py) over 400 numbers of rows not seen
# before, after 200 others: prints how many MiB the heap holds more once they are done (their
# outputs freed; what stays is the kernels compiled for their shapes, and the caches' entries).
# ``{run}``: what the process does first (train(), evaluate(), or nothing).
MULTIPLY_400_NEW_SHAPES = (
    GLIBC_HEAP_PROBE
    + """
import torch
{run}
from transformer.linear import linear
weight = torch.randn(64, 64)
def multiply(rows):
    for n in rows:
        linear(torch.randn(n, 64), weight)
multiply(range(1, 201))
held = libc.mallinfo2().uordblks
multiply(range(201, 601))
print((libc.mallinfo2().uordblks - held) >> 20)
"""
)


def run_python(script: str, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    """``python -c script`` in a process of its own, its output captured."""
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )


def heap_held_by_new_shapes(first: str, tmp_path: Path) -> tuple[int, int]:
    """MiB the heap holds more after :data:`MULTIPLY_400_NEW_SHAPES`, in a process that runs the
    script lines ``first`` before, and in a plain one. Both without the kernel caches' variables,
    as a user's shell has them: a ``train()`` or ``evaluate()`` earlier in this pytest process set
    them in ``os.environ`` (:func:`transformer.allocator.bound_kernel_caches`)."""
    env = script_env(tmp_path)
    for variable in KERNEL_CACHES:
        env.pop(variable, None)
    held = []
    for run, timeout in ((first, 120), ("", 60)):
        done = run_python(MULTIPLY_400_NEW_SHAPES.format(run=run), env, timeout)
        assert done.returncode == 0, done.stderr[-3000:]
        held.append(int(done.stdout.split()[-1]))
    return held[0], held[1]
