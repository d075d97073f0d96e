"""A tiny synthetic parallel corpus and Hydra configs over it, shared by training and evaluation
tests."""

from __future__ import annotations

import random
from pathlib import Path

from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

WORDS_EN = (
    "a the man woman dog cat child girl boy walks runs sits eats red blue green big small on in "
    "near under street park house tree ball water bike car plays jumps looks"
).split()
WORDS_DE = (
    "ein der mann frau hund katze kind mädchen junge geht läuft sitzt isst rot blau grün groß "
    "klein auf in bei unter straße park haus baum ball wasser fahrrad auto spielt springt schaut"
).split()


def sentence_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` English sentences of 2-10 words and their German, a word-by-word image."""
    rng = random.Random(seed)
    en, de = [], []
    for _ in range(n):
        idx = [rng.randrange(len(WORDS_EN)) for _ in range(rng.randint(2, 10))]
        en.append(" ".join(WORDS_EN[i] for i in idx))
        de.append(" ".join(WORDS_DE[i] for i in idx))
    return en, de


def write_corpus(root: Path) -> Path:
    """train/val/test .en/.de files in ``root``; German is a word-by-word image of English."""
    for split, n, seed in (("train", 400, 0), ("val", 32, 1), ("test", 32, 2)):
        en, de = sentence_pairs(n, seed)
        (root / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
        (root / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    return root


ATTENTION_MAPS_OFF = "~callbacks.attention_maps"


def tiny_overrides(corpus: Path) -> list[str]:
    return [
        "model=tiny",
        "data=local",
        f"data.root={corpus}",
        f"data.cache_dir={corpus / 'cache'}",
        "data.vocab_size=64",
        "data.num_workers=0",
        "data.max_tokens=512",
        "logger=csv",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "trainer.num_sanity_val_steps=0",
        "validation.bleu_sentences=8",
        "optim.optimizer.lr=3e-3",
        "optim.scheduler.warmup_steps=10",
        ATTENTION_MAPS_OFF,  # its figures cost seconds; tests/test_analysis_training.py runs it
    ]


def compose_cfg(overrides: list[str], out_dir: Path | None = None):
    out = [f"paths.output_dir={out_dir}"] if out_dir is not None else ["paths.output_dir=unused"]
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[*out, *overrides])
