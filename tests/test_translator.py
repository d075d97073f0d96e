"""Translating from Python: ``Translator.from_checkpoint`` gives what ``evaluate.py`` gives for the
same checkpoint, lines and decode options; several checkpoints averaged or ensembled; its device
and dtype options checked as evaluate.py's are."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny import compose_cfg, compose_eval_cfg, tiny_overrides
from transformer import DecodeOptions, Translator
from transformer.errors import ConfigError
from transformer.evaluation import evaluate
from transformer.training import train


@pytest.fixture(scope="module")
def checkpoints(corpus, tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny models of one corpus (tokenizers alike), trained 40 and 20 steps."""
    runs = []
    for steps in (40, 20):
        out = tmp_path_factory.mktemp(f"run{steps}")
        train(compose_cfg([*tiny_overrides(corpus), f"trainer.max_steps={steps}"], out))
        runs.append(out / "checkpoints" / "last.ckpt")
    return runs[0], runs[1]


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"strategy": "greedy"}, {"beam_size": 3, "nbest": 2}])
def test_translations_equal_evaluate_py_input_files(checkpoints, corpus, tmp_path, options):
    last, _ = checkpoints
    sentences = (corpus / "test.en").read_text().splitlines()[:12]
    source = tmp_path / "source.txt"
    source.write_text("\n".join(sentences) + "\n")
    decode = [f"decode.{k}={v}" for k, v in options.items()]
    if options.get("strategy") == "greedy":
        decode = ["decode=greedy"]
    cfg = compose_eval_cfg([f"ckpt_path={last}", f"input={source}", "device=cpu", *decode],
                           tmp_path / "eval")  # fmt: skip
    result = evaluate(cfg)
    written = Path(result["output"]).read_text().splitlines()

    translator = Translator.from_checkpoint(last, device="cpu")
    found = translator.translate(sentences, DecodeOptions(**options))
    assert [t.text for line in found for t in line] == written


@pytest.mark.slow
def test_several_checkpoints_are_averaged_or_ensembled(checkpoints):
    last, earlier = checkpoints
    lines = ["a small test", "two words"]
    options = DecodeOptions(strategy="greedy")
    averaged = Translator.from_checkpoint(last, earlier, device="cpu")
    ensemble = Translator.from_checkpoint(last, earlier, ensemble=True, device="cpu")
    assert len(averaged.models) == 1 and len(ensemble.models) == 2
    for translator in (averaged, ensemble):
        assert [len(t) for t in translator.translate(lines, options)] == [1, 1]


def test_device_and_dtype_are_checked_as_evaluate_checks_them(tmp_path):
    missing = tmp_path / "missing.ckpt"
    with pytest.raises(ConfigError, match="dtype=float16 is for GPUs"):
        Translator.from_checkpoint(missing, device="cpu", dtype="float16")
    with pytest.raises(ConfigError, match="dtype=half is not one of auto"):
        Translator.from_checkpoint(missing, device="cpu", dtype="half")
    with pytest.raises(ValueError, match="needs the path of a checkpoint"):
        Translator.from_checkpoint()
