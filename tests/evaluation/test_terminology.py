"""Terminology constraints through evaluate: the constraints=FILE format and its errors, the share
of phrases met, and translations that hold their phrases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.evaluation.test_evaluate import lines, trained  # noqa: F401 (the trained fixture)
from tests.tiny import REPO, compose_eval_cfg
from transformer.checkpoints import (
    load_checkpoint,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError, DataError
from transformer.evaluation import evaluate
from transformer.evaluation.terminology import constraints_met, read_constraints
from transformer.translate import Translator


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_constraint_file_is_one_json_list_of_strings_a_line(tmp_path) -> None:
    good = write(tmp_path / "good.jsonl", '["Hund"]\n[]\n["roten Ball", "Mann"]\n')
    assert read_constraints(good, 3, "input=x") == [["Hund"], [], ["roten Ball", "Mann"]]
    assert read_constraints(good, None, "input=x") == [["Hund"], [], ["roten Ball", "Mann"]]
    with pytest.raises(DataError, match=r"good.jsonl has 3 lines but split=test has 4: give one"):
        read_constraints(good, 4, "split=test")
    for text, number in (
        ('["Hund"]\nHund\n', 2),  # not JSON
        ('["Hund"]\n[]\n"Hund"\n', 3),  # a string, not a list
        ('[["Hund"]]\n', 1),  # a list of lists
        ('["Hund", 3]\n', 1),
        ("[]\n\n[]\n", 2),  # a blank line
    ):
        bad = write(tmp_path / "bad.jsonl", text)
        with pytest.raises(
            DataError, match=rf"constraints=.*bad.jsonl, line {number}: .* JSON list"
        ):
            read_constraints(bad, None, "input=x")


class Lowercasing:
    """A stand-in tokenizer that normalises text to lower case, as SentencePiece's rules may."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text.lower()]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def test_a_phrase_is_met_where_its_text_as_the_tokenizer_writes_it_occurs() -> None:
    translations = ["ein hund rennt", "zwei hunde", "", "eine katze"]
    constraints = [["Hund", "rennt"], ["hund", "katze"], ["Ball"], []]
    assert constraints_met(translations, constraints, Lowercasing()) == (3, 5)


@pytest.mark.slow
def test_evaluate_places_the_constraints_and_reports_the_share_met(trained, tmp_path) -> None:  # noqa: F811
    ckpt, corpus = trained
    refs = lines(corpus / "test.de")
    # Per sentence the reference's longest word (none for every third), as the benchmark picks.
    wanted = [[] if i % 3 == 0 else [max(r.split(), key=len)] for i, r in enumerate(refs)]
    path = write(tmp_path / "terms.jsonl", "".join(json.dumps(w) + "\n" for w in wanted))
    options = [f"ckpt_path={ckpt}", "decode.beam_size=3"]
    plain = evaluate(compose_eval_cfg(options, tmp_path / "plain"))
    out = evaluate(compose_eval_cfg([*options, f"constraints={path}"], tmp_path / "terms"))
    hyps = lines(tmp_path / "terms" / "hypotheses.txt")
    total = sum(map(len, wanted))
    met = sum(w[0] in h for w, h in zip(wanted, hyps, strict=True) if w)
    assert out["constraints"] == {"file": path, "met": met, "total": total}
    assert (
        json.loads((tmp_path / "terms" / "metrics.json").read_text())["constraints"]["met"] == met
    )
    plain_hyps = lines(tmp_path / "plain" / "hypotheses.txt")
    plain_met = sum(w[0] in h for w, h in zip(wanted, plain_hyps, strict=True) if w)
    assert met == total > plain_met  # every word placed; unconstrained, some missing
    for w, h, p in zip(wanted, hyps, plain_hyps, strict=True):
        if not w:  # no constraints: the plain search's translation
            assert h == p
    assert "constraints" not in plain
    # input=FILE with the same lines and constraints translates the same.
    source = write(tmp_path / "src.txt", (corpus / "test.en").read_text(encoding="utf-8"))
    overrides = [*options, f"input={source}", f"constraints={path}", f"output={tmp_path / 'o.txt'}"]
    result = evaluate(compose_eval_cfg(overrides, tmp_path / "file"))
    assert lines(tmp_path / "o.txt") == hyps
    assert result["constraints"]["met"] == met
    printed = subprocess.run(
        [sys.executable, "evaluate.py", *options, f"constraints={path}",
         f"hydra.run.dir={tmp_path / 'printed'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert f"constraints met = 100.0% ({total} of {total} phrases)" in printed.stdout


@pytest.mark.slow
def test_constraints_outside_beam_search_or_misaligned_are_refused(trained, tmp_path) -> None:  # noqa: F811
    ckpt, corpus = trained
    short = write(tmp_path / "short.jsonl", '["Hund"]\n')
    base = [f"ckpt_path={ckpt}"]
    cases = [
        (
            ["decode=greedy", f"constraints={short}"],
            ConfigError,
            "leave out decode.strategy=greedy",
        ),
        (["score=true", f"constraints={short}"], ConfigError, "guides translations; score=true"),
        (["input=-", f"constraints={short}"], ConfigError, r"leave out input=- \(standard input"),
        (["constraints=none.jsonl"], ConfigError, "constraints=none.jsonl: no such file"),
        ([f"constraints={short}"], DataError, r"short.jsonl has 1 lines but split=test has 32"),
    ]
    for overrides, error, message in cases:
        with pytest.raises(error, match=message):
            evaluate(compose_eval_cfg([*base, *overrides], tmp_path / "out"))
    ckpt_data = load_checkpoint(ckpt)
    translator = Translator(
        model_from_checkpoint(ckpt_data, str(ckpt)),
        *tokenizers_from_checkpoint(ckpt_data, str(ckpt)),
    )
    word = lines(corpus / "test.de")[0].split()[0]
    assert translator.translate(["a dog"], DecodeOptions(), constraints=[[word]])[0][
        0
    ].constraints_met
    with pytest.raises(ConfigError, match="constraints need beam search"):
        translator.translate(["a dog"], DecodeOptions(strategy="greedy"), constraints=[[word]])
    with pytest.raises(DataError, match="line 1: constraint 'Hund' has characters the target"):
        translator.translate(["a dog"], DecodeOptions(), constraints=[["Hund"]])  # no capitals
    with pytest.raises(DataError, match="line 1: constraint '   ' is empty"):
        translator.translate(["a dog"], DecodeOptions(), constraints=[["   "]])
