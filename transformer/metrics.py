"""Corpus-level translation metrics with sacreBLEU: the one function training and evaluation use,
and the check of the BLEU tokenizer option (``metrics.tokenize``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric

from transformer.errors import ConfigError

# The metrics, by the name metrics.json, evaluate's print-out and validation's val/<name> use.
# chrf_pp is chrF++ (chrF with word unigrams and bigrams, sacreBLEU's chrF2++); ter is lower-better.
METRICS = ("bleu", "bleu_lc", "chrf", "chrf_pp", "ter")
TOKENIZE = "13a"  # sacreBLEU's default BLEU tokenizer (mteval-v13a)


def _metrics(tokenize: str) -> dict[str, Metric]:
    """sacreBLEU's metric objects, by name; ``tokenize`` is BLEU's tokenizer (chrF works on
    characters, TER on its own tercom tokens)."""
    return {
        "bleu": BLEU(tokenize=tokenize),
        "bleu_lc": BLEU(tokenize=tokenize, lowercase=True),
        "chrf": CHRF(),
        "chrf_pp": CHRF(word_order=2),
        "ter": TER(),
    }


def check_tokenize(tokenize: Any, option: str = "metrics.tokenize") -> str:
    """``tokenize`` when it names a BLEU tokenizer the installed sacreBLEU offers and can build;
    otherwise a :class:`ConfigError` naming ``option`` and the choices, or the ``pip install``
    command of the tokenizer's missing optional dependency (ja-mecab, ko-mecab)."""
    choices = list(BLEU.TOKENIZERS)
    if not isinstance(tokenize, str) or tokenize not in choices:
        raise ConfigError(
            f"{option}={tokenize} is not one of sacreBLEU's BLEU tokenizers: "
            f"{' | '.join(choices)} (13a for most languages, zh for Chinese, ja-mecab for "
            "Japanese, ko-mecab for Korean, char for characters)"
        )
    try:
        BLEU(tokenize=tokenize)  # builds the tokenizer: its optional packages, its model
    except Exception as err:  # sacreBLEU's own: RuntimeError, ImportError, a failed download
        said = " ".join(str(err).split())
        pip = re.search(r"pip install (\S+)", said)
        why = (
            f'needs optional packages that are not installed: pip install "{pip.group(1)}"'
            if pip
            else f"cannot be built by sacreBLEU ({said})"
        )
        raise ConfigError(
            f"{option}={tokenize} {why}; or choose another tokenizer: {' | '.join(choices)}"
        ) from err
    return tokenize


@dataclass
class TranslationScores:
    bleu: float
    bleu_lc: float  # lowercased BLEU
    chrf: float
    chrf_pp: float  # chrF++
    ter: float  # translation edit rate: lower is better
    signatures: dict[str, str]  # sacreBLEU's signature of each metric, by name
    num_sentences: int

    def to_dict(self) -> dict[str, Any]:
        """The scores as ``metrics.json`` records them: each metric, the signatures under
        ``signature``, the sentence count."""
        return {
            **{name: getattr(self, name) for name in METRICS},
            "signature": dict(self.signatures),
            "num_sentences": self.num_sentences,
        }


def score_translations(
    hypotheses: Sequence[str], references: Sequence[str], tokenize: str = TOKENIZE
) -> TranslationScores:
    """sacreBLEU's BLEU, lowercased BLEU, chrF, chrF++ and TER of detokenized hypotheses against
    one reference each, with their signatures; ``tokenize``: BLEU's tokenizer (sacreBLEU's name,
    :func:`check_tokenize`). ``hypotheses[i]`` translates the source of ``references[i]``."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    hyps, refs = list(hypotheses), [list(references)]
    metrics = _metrics(tokenize)
    scores = {name: metric.corpus_score(hyps, refs).score for name, metric in metrics.items()}
    # Ask each metric for its signature only after it has scored (sacreBLEU 2.6 fills it then).
    signatures = {name: str(metric.get_signature()) for name, metric in metrics.items()}
    return TranslationScores(**scores, signatures=signatures, num_sentences=len(hyps))
