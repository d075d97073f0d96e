"""Scores and their sacreBLEU signatures."""

import pytest

from transformer.metrics import score_translations


def test_scores_and_signatures():
    hyps = ["The cat sat on the mat.", "A dog runs."]
    refs = ["The cat sat on the mat.", "a dog runs."]
    s = score_translations(hyps, refs)
    assert 0 < s.bleu < 100 and s.bleu_lc == pytest.approx(100.0)
    assert "case:lc" in s.bleu_lc_signature and "tok:13a" in s.bleu_signature
    assert s.chrf_signature.startswith("nrefs:1") and s.num_sentences == 2
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_translations(hyps, refs[:1])
