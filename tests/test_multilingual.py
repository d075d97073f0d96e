"""One model, two target languages (data.corpora + data.target_token): it must learn to translate
into the language its target token asks for, validate each direction, and evaluate each."""

from __future__ import annotations

import json

import pytest

from tests.tiny import (
    SPLITS,
    compose_cfg,
    compose_eval_cfg,
    sentence_pairs,
    tiny_overrides,
    write_language,
)
from transformer import DecodeOptions, Translator
from transformer.evaluation import evaluate
from transformer.metrics import score_translations
from transformer.training import train

pytestmark = pytest.mark.heavy


def short_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    return sentence_pairs(n, seed, max_words=6)


@pytest.mark.slow
def test_target_tokens_choose_the_language_and_each_direction_validates(tmp_path) -> None:
    de = write_language(tmp_path / "de", "de", SPLITS, short_pairs)
    xx = write_language(tmp_path / "xx", "xx", SPLITS, short_pairs, reverse=True)
    overrides = [
        *tiny_overrides(de),
        f"data.corpora=[{{root:'{de}'}},{{root:'{xx}',tgt_lang:xx}}]",
        "data.target_token=true",
        "data.vocab_size=72",
        "trainer.max_steps=800",  # at 400 one thread (pytest -n) learnt en-de to 15 BLEU, two to 25
        "trainer.val_check_interval=800",
        "trainer.check_val_every_n_epoch=null",
        "validation.bleu_sentences=null",
        "model.d_model=96",
        "model.d_ff=192",
        "model.dropout=0",
        "optim.optimizer.lr=5e-3",
    ]
    out = tmp_path / "run"
    metrics = train(compose_cfg(overrides, out))
    per_direction = [metrics["val/bleu/en-de"], metrics["val/bleu/en-xx"]]
    assert abs(metrics["val/bleu"] - sum(per_direction) / 2) < 1e-4

    ckpt = out / "checkpoints" / "last.ckpt"
    hyps, refs = {}, {}
    for direction, corpus in (("en-de", de), ("en-xx", xx)):
        overrides = [f"ckpt_path={ckpt}", "split=test", f"direction={direction}"]
        result = evaluate(compose_eval_cfg(overrides, tmp_path / direction))
        assert result["direction"] == direction
        hyps[direction] = (tmp_path / direction / "hypotheses.txt").read_text().splitlines()
        refs[direction] = (corpus / f"test.{direction[3:]}").read_text().splitlines()
        assert json.loads((tmp_path / direction / "metrics.json").read_text())["bleu"] > 0
        # from Python: the direction's token before each line, as evaluate.py puts it
        translator = Translator.from_checkpoint(ckpt, device="cpu", direction=direction)
        sources = (corpus / "test.en").read_text().splitlines()
        found = translator.translate(sources, DecodeOptions(strategy="beam"))
        assert [t[0].text for t in found] == hyps[direction]
    plain = Translator.from_checkpoint(ckpt, device="cpu")  # the first direction's token
    assert [t[0].text for t in plain.translate(sources[:5], DecodeOptions())] == hyps["en-de"][:5]
    written = [f"<2xx> {line}" for line in sources[:5]]  # a line's own token: kept
    assert [t[0].text for t in plain.translate(written, DecodeOptions())] == hyps["en-xx"][:5]
    # The same English, two languages: each direction's output is far closer to its own
    # references than the other direction's output is.
    for own, other in (("en-de", "en-xx"), ("en-xx", "en-de")):
        own_bleu = score_translations(hyps[own], refs[own]).bleu
        other_bleu = score_translations(hyps[other], refs[own]).bleu
        assert own_bleu > other_bleu + 8, (own, own_bleu, other_bleu)  # 28-36 against 6-15 here
