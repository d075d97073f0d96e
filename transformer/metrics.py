"""Corpus-level translation metrics with sacreBLEU: the one function training and evaluation use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sacrebleu.metrics import BLEU, CHRF


@dataclass
class TranslationScores:
    bleu: float
    bleu_lc: float  # lowercased BLEU
    chrf: float
    bleu_signature: str
    bleu_lc_signature: str
    chrf_signature: str
    num_sentences: int

    def to_dict(self) -> dict[str, Any]:
        """The scores as ``metrics.json`` records them: each metric, the signatures under
        ``signature``, the sentence count."""
        return {
            "bleu": self.bleu,
            "bleu_lc": self.bleu_lc,
            "chrf": self.chrf,
            "signature": {
                "bleu": self.bleu_signature,
                "bleu_lc": self.bleu_lc_signature,
                "chrf": self.chrf_signature,
            },
            "num_sentences": self.num_sentences,
        }


def score_translations(
    hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a"
) -> TranslationScores:
    """sacreBLEU BLEU, lowercased BLEU and chrF of detokenized hypotheses against one reference
    each, with their signatures. ``hypotheses[i]`` translates the source of ``references[i]``."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    hyps, refs = list(hypotheses), [list(references)]
    bleu, bleu_lc, chrf = BLEU(tokenize=tokenize), BLEU(tokenize=tokenize, lowercase=True), CHRF()
    # Ask each metric for its signature only after it has scored (sacreBLEU 2.6 fills it then).
    b = bleu.corpus_score(hyps, refs)
    blc = bleu_lc.corpus_score(hyps, refs)
    c = chrf.corpus_score(hyps, refs)
    return TranslationScores(
        bleu=b.score,
        bleu_lc=blc.score,
        chrf=c.score,
        bleu_signature=str(bleu.get_signature()),
        bleu_lc_signature=str(bleu_lc.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        num_sentences=len(hyps),
    )
