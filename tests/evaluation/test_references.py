"""Scoring against a reference file: hypotheses=FILE reference=FILE (no model), and the options
that contradict it or reference=, refused before any work. input=FILE reference=FILE with a
model: tests/evaluation/test_evaluate.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from tests.tiny import REPO, compose_eval_cfg
from transformer.errors import ConfigError, DataError
from transformer.evaluation import evaluate

HYPS = ["Ein Hund rennt im Park.", "Zwei Männer stehen an der Straße.", "", "我喜欢猫和狗。"]
REFS = [
    "Ein Hund läuft im Park.",
    "Zwei Männer stehen auf der Straße.",
    "Ein Kind.",
    "我喜欢狗和猫。",
]


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    hyps, refs = tmp_path / "hyps.txt", tmp_path / "refs.txt"
    hyps.write_text("".join(line + "\n" for line in HYPS), encoding="utf-8")
    refs.write_text("".join(line + "\n" for line in REFS), encoding="utf-8")
    return hyps, refs


def test_a_file_of_translations_is_scored_against_a_reference_file_without_a_model(files, tmp_path):
    hyps, refs = files
    out = tmp_path / "run"
    metrics = evaluate(compose_eval_cfg([f"hypotheses={hyps}", f"reference={refs}"], out))
    assert json.loads((out / "metrics.json").read_text()) == metrics
    assert metrics["num_sentences"] == 4 and metrics["reference"] == str(refs)
    expected = {
        "bleu": sacrebleu.corpus_bleu(HYPS, [REFS]),
        "bleu_lc": sacrebleu.corpus_bleu(HYPS, [REFS], lowercase=True),
        "chrf": sacrebleu.corpus_chrf(HYPS, [REFS]),
        "chrf_pp": sacrebleu.corpus_chrf(HYPS, [REFS], word_order=2),
        "ter": sacrebleu.corpus_ter(HYPS, [REFS]),
    }
    for name, score in expected.items():
        assert metrics[name] == pytest.approx(score.score), name
    assert "tok:13a" in metrics["signature"]["bleu"] and "nw:2" in metrics["signature"]["chrf_pp"]
    zh = evaluate(compose_eval_cfg(
        [f"hypotheses={hyps}", f"reference={refs}", "metrics.tokenize=zh"], tmp_path / "zh"
    ))  # fmt: skip
    assert zh["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="zh").score)
    assert zh["bleu"] != metrics["bleu"] and "tok:zh" in zh["signature"]["bleu_lc"]


def test_files_of_other_line_counts_are_refused_naming_both(files, tmp_path):
    hyps, refs = files
    short = tmp_path / "short.txt"
    short.write_text("Ein Hund.\n")
    with pytest.raises(DataError, match=rf"hypotheses={hyps} has 4 lines but reference={short} "
                                        "has 1: give one reference a line"):  # fmt: skip
        evaluate(compose_eval_cfg([f"hypotheses={hyps}", f"reference={short}"], tmp_path / "a"))
    assert not (tmp_path / "a" / "metrics.json").exists()
    # input= is counted against reference= before the model is even loaded
    missing = f"ckpt_path={tmp_path / 'none.ckpt'}"
    with pytest.raises(DataError, match=rf"input={hyps} has 4 lines but reference={short} has 1"):
        evaluate(compose_eval_cfg([missing, f"input={hyps}", f"reference={short}"], tmp_path))


def test_output_never_names_the_reference(files, tmp_path):
    hyps, refs = files
    before = refs.read_bytes()
    run = [f"ckpt_path={tmp_path / 'none.ckpt'}", f"input={hyps}", f"reference={refs}"]
    with pytest.raises(ConfigError, match=rf"output={refs} is {refs}, an input of this run"):
        evaluate(compose_eval_cfg([*run, f"output={refs}"], tmp_path / "out"))
    assert refs.read_bytes() == before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["hypotheses={hyps}"], r"hypotheses=.* is scored against reference=FILE"),
        (["hypotheses={hyps}", "reference={refs}", "ckpt_path=x.ckpt"], "leave out ckpt_path"),
        (["hypotheses={hyps}", "reference={refs}", "input={hyps}"], "leave out input"),
        (["hypotheses={hyps}", "reference={refs}", "score=true"], "leave out score=true"),
        (["hypotheses={hyps}", "reference=nothing.txt"], "reference=nothing.txt: no such file"),
        (["ckpt_path=x.ckpt", "reference={refs}"], "a split is scored against its own references"),
        (["input={hyps}", "reference={refs}"], r"give ckpt_path, or .* give it as hypotheses="),
        (
            ["ckpt_path=x.ckpt", "input={hyps}", "reference={refs}", "decode.nbest=2"],
            "scores one translation a line, input=FILE's; leave out decode.nbest=2",
        ),  # fmt: skip
        (
            ["ckpt_path=x.ckpt", "input={hyps}", "reference={refs}", "decode.print_scores=true"],
            "leave out decode.print_scores=true",
        ),  # fmt: skip
        (["ckpt_path=x.ckpt", "metrics.tokenize=13b"], r"metrics\.tokenize=13b is not one of"),
    ],
)
def test_misplaced_reference_options_are_refused_by_name(files, tmp_path, overrides, message):
    hyps, refs = files
    given = [o.format(hyps=hyps, refs=refs) for o in overrides]
    with pytest.raises(ConfigError, match=message):
        evaluate(compose_eval_cfg(given, tmp_path / "out"))


@pytest.mark.slow  # a Python process that imports torch and Hydra
def test_evaluate_py_prints_each_score_with_its_signature(files, tmp_path):
    hyps, refs = files
    done = subprocess.run(
        [sys.executable, "evaluate.py", f"hypotheses={hyps}", f"reference={refs}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert printed[0] == f"hypotheses={hyps} against reference={refs} (4 sentences)"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    labels = ["BLEU", "BLEU lowercased", "chrF", "chrF++", "TER"]
    for line, label, name in zip(printed[1:], labels, metrics["signature"], strict=True):
        assert line == f"{label} = {metrics[name]:.2f}  {metrics['signature'][name]}"
