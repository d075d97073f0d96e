"""Scores and their sacreBLEU signatures; the BLEU tokenizer option."""

import pytest
import sacrebleu
from sacrebleu.tokenizers import tokenizer_ja_mecab

from transformer.errors import ConfigError
from transformer.metrics import METRICS, check_tokenize, score_translations


def test_scores_and_signatures():
    hyps = ["The cat sat on the mat.", "A dog runs."]
    refs = ["The cat sat on the mat.", "a dog runs."]
    s = score_translations(hyps, refs)
    assert 0 < s.bleu < 100 and s.bleu_lc == pytest.approx(100.0)
    assert "case:lc" in s.signatures["bleu_lc"] and "tok:13a" in s.signatures["bleu"]
    assert s.signatures["chrf"].startswith("nrefs:1") and s.num_sentences == 2
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_translations(hyps, refs[:1])


def test_chrf_plus_plus_and_ter_are_sacrebleus_with_their_signatures():
    hyps = ["The cat sat on a mat.", "A dog runs fast.", "Zwei Männer"]
    refs = ["The cat sat on the mat.", "a dog runs.", "Zwei Männer stehen"]
    s = score_translations(hyps, refs)
    assert s.chrf_pp == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs], word_order=2).score)
    assert s.ter == pytest.approx(sacrebleu.corpus_ter(hyps, [refs]).score)
    assert s.chrf_pp != s.chrf and s.ter > 0
    assert "nw:2" in s.signatures["chrf_pp"] and "tok:tercom" in s.signatures["ter"]
    recorded = s.to_dict()
    assert set(METRICS) <= set(recorded) and set(recorded["signature"]) == set(METRICS)


def test_the_bleu_tokenizer_is_the_one_named():
    """Chinese has no spaces: 13a sees one word a sentence, zh and char see characters."""
    hyps, refs = ["我喜欢猫和狗。"], ["我喜欢狗和猫。"]
    assert score_translations(hyps, refs).bleu == pytest.approx(0.0)
    for tokenize in ("zh", "char"):
        s = score_translations(hyps, refs, tokenize=tokenize)
        assert s.bleu == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score)
        assert s.bleu > 0 and f"tok:{tokenize}" in s.signatures["bleu"]
        assert f"tok:{tokenize}" in s.signatures["bleu_lc"]


def test_an_unknown_tokenizer_or_one_missing_its_packages_is_refused_by_name(monkeypatch):
    assert check_tokenize("intl") == "intl"
    choices = r"tokenizers: none \| zh \| 13a \| intl \| char"
    with pytest.raises(
        ConfigError, match=rf"metrics\.tokenize=13b is not one of sacreBLEU's BLEU {choices}"
    ):
        check_tokenize("13b")
    monkeypatch.setattr(tokenizer_ja_mecab, "MeCab", None)  # as where mecab-python3 is missing
    missing = r'metrics\.tokenize=ja-mecab needs optional .*: pip install "sacrebleu\[ja\]"'
    with pytest.raises(ConfigError, match=missing):
        check_tokenize("ja-mecab")
