"""Validation's sacreBLEU metrics: each one logged per direction, BLEU with the tokenizer of
``metrics.tokenize``, and the signatures in wandb's run summary (offline here)."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest
import sacrebleu

from tests.tiny import compose_cfg, read_metrics, tiny_overrides
from transformer.metrics import METRICS
from transformer.training import train
from transformer.training.validation_bleu import bleu_metrics, score_directions, signature_summary

REFS = {"en-de": ["Ein Hund läuft im Park.", "Zwei Männer sitzen."], "en-zh": ["我喜欢狗和猫。"]}
HYPS = {"en-de": ["Ein Hund rennt im Park.", "Zwei Männer stehen."], "en-zh": ["我喜欢猫和狗。"]}


class Data:
    """What score_directions reads of the data module: its directions and references."""

    def __init__(self, directions: list[str]) -> None:
        self.directions = directions

    def references(self, split: str, direction: str) -> list[str]:
        assert split == "val"
        return REFS[direction]


def hyps(directions: list[str]) -> dict[int, dict[int, str]]:
    """Each validation loader's translations by sentence index, in the data's order."""
    return {k: dict(enumerate(HYPS[d])) for k, d in enumerate(directions)}


def test_validation_logs_every_metric_with_the_tokenizer_named():
    scores = score_directions(Data(["en-zh"]), hyps(["en-zh"]), 1, tokenize="zh")
    metrics = bleu_metrics(scores, ["en-zh"])
    assert set(metrics) == {"val/bleu", "val/bleu_lc", "val/chrf", "val/chrf_pp", "val/ter"}
    h, r = HYPS["en-zh"], [REFS["en-zh"]]
    assert metrics["val/bleu"] == pytest.approx(sacrebleu.corpus_bleu(h, r, tokenize="zh").score)
    assert metrics["val/bleu"] > 0 and sacrebleu.corpus_bleu(h, r).score == 0  # 13a: one word
    assert metrics["val/chrf_pp"] == pytest.approx(sacrebleu.corpus_chrf(h, r, word_order=2).score)
    assert metrics["val/ter"] == pytest.approx(sacrebleu.corpus_ter(h, r).score)
    summary = signature_summary(scores)
    assert set(summary) == {f"val/signature/{name}" for name in METRICS}
    assert "tok:zh" in summary["val/signature/bleu"] and "nw:2" in summary["val/signature/chrf_pp"]


def test_several_directions_log_each_metric_per_direction_and_bleu_their_mean():
    directions = ["en-de", "en-zh"]
    metrics = bleu_metrics(score_directions(Data(directions), hyps(directions), 1), directions)
    for name in METRICS:
        assert {f"val/{name}/en-de", f"val/{name}/en-zh"} <= set(metrics)
    ter = sacrebleu.corpus_ter(HYPS["en-de"], [REFS["en-de"]]).score
    assert metrics["val/ter/en-de"] == pytest.approx(ter)
    mean = (metrics["val/bleu/en-de"] + metrics["val/bleu/en-zh"]) / 2
    assert metrics["val/bleu"] == pytest.approx(mean)


def wandb_signatures(run: Path, wait: float = 60.0) -> dict[str, str]:
    """The signatures in an offline wandb run's log (its summary updates, JSON values), by metric
    name. wandb's service process writes the log: on a loaded machine its last records, the
    summary's, can land after ``wandb.finish()`` returns, so the file is read until they are in
    (or ``wait`` seconds have passed)."""
    deadline = time.monotonic() + wait
    while True:
        records = run.read_bytes()
        signatures = re.findall(rb"val/signature/(\w+)[^\"]*\"(nrefs:1\|[^\"]*)\"", records)
        recorded = {name.decode(): value.decode() for name, value in signatures}
        if set(recorded) >= set(METRICS) or time.monotonic() > deadline:
            return recorded
        time.sleep(0.5)


@pytest.mark.slow
def test_training_logs_chrf_pp_and_ter_and_puts_the_signatures_in_the_wandb_summary(
    corpus, tmp_path, caplog
):
    """metrics.tokenize=char reaches val/bleu (the log's signature), the CSV log holds the new
    metrics, and the offline wandb run records every signature in its summary."""
    overrides = [
        *[o for o in tiny_overrides(corpus) if not o.startswith("logger=")],
        "logger=[csv,wandb]",
        "metrics.tokenize=char",
        "trainer.max_steps=8",
        "trainer.val_check_interval=8",
        "trainer.check_val_every_n_epoch=null",
    ]
    with caplog.at_level("INFO", logger="transformer.training.lit_module"):
        train(compose_cfg(overrides, tmp_path))
    assert re.search(r"val BLEU \S+ on 8 sentences \(nrefs:1\|.*tok:char", caplog.text)
    (row,) = [r for r in read_metrics(tmp_path) if r.get("val/bleu")]
    assert all(math.isfinite(float(row[f"val/{m}"])) for m in ("chrf_pp", "ter", "bleu_lc"))
    (run,) = Path(tmp_path, "wandb").glob("offline-run-*/run-*.wandb")
    recorded = wandb_signatures(run)
    assert set(recorded) == set(METRICS)
    assert "tok:char" in recorded["bleu"] and "case:lc" in recorded["bleu_lc"]
