"""The README of an exported CTranslate2 directory: translating with ``ctranslate2`` and
``sentencepiece`` alone, with the options that reproduce ``evaluate.py``'s beam search, and a
multilingual model's target tokens."""

from __future__ import annotations

from transformer.data.corpora import make_corpora
from transformer.data.source_tokens import uses_target_tokens
from transformer.decoding import DecodeOptions
from transformer.export.ct2 import INFO_FILE, SPM_FILES
from transformer.export.marian_vocab import language_tokens


def target_tokens(data: dict, source_pieces: list[str] = ()) -> list[str]:
    """The target tokens of a model: those its corpora put before their sources
    (``data.target_token``), and those of a multilingual OPUS-MT model, imported or fine-tuned
    (its source tokenizer's ``source_pieces`` of that form, ``>>fra<<``); none otherwise."""
    own = language_tokens(source_pieces)  # in the vocabulary's order
    if not uses_target_tokens(data):
        return own
    trained = {c.target_token for c in make_corpora(data.get("corpora"), data)} - {None}
    return [*own, *sorted(trained - set(own))]


def usage(max_positions: int, options: DecodeOptions, targets: list[str] = ()) -> str:
    """The exported directory's README: translating with ``ctranslate2`` and ``sentencepiece``
    alone, with the options that reproduce ``evaluate.py``'s beam search; ``targets``: the
    model's target tokens, one of which goes before each source."""
    a, b, lp = options.max_len_a, options.max_len_b, options.len_penalty
    multilingual = ""
    if targets:
        which = (
            f"This model translates into several languages: put one of {', '.join(targets)}"
            if len(targets) > 1
            else f"This model was trained with {targets[0]}: put it"
        )
        multilingual = (
            f"\n{which} before each source's pieces, `[token, *src_sp.encode(line, out_type=str)]` "
            "(SentencePiece alone would put a word start before a token written in the line).\n"
        )
    return f"""# A transformer-nmt model for CTranslate2

Written by `python -m transformer.export ct2`; `{INFO_FILE}` names the checkpoints and records
the model config and training data. Translate with `pip install ctranslate2 sentencepiece`:

```python
import math
import ctranslate2
import sentencepiece as spm

src_sp = spm.SentencePieceProcessor(model_file="MODEL_DIR/{SPM_FILES["src"]}")
tgt_sp = spm.SentencePieceProcessor(model_file="MODEL_DIR/{SPM_FILES["tgt"]}")
translator = ctranslate2.Translator("MODEL_DIR", device="cpu", intra_threads=2)

def translate(lines, beam_size={options.beam_size}):
    # The model appends </s> to each source (config.json: add_source_eos) and starts the
    # decoder from <s>. At most floor({a} * (pieces + 1)) + {b} tokens before </s>: one
    # limit per call, so sentences of the same limit are translated together.
    pieces = [src_sp.encode(line, out_type=str)[: {max_positions - 1}] for line in lines]
    groups = {{}}
    for i, p in enumerate(pieces):
        limit = min(math.floor({a} * (len(p) + 1)) + {b}, {max_positions - 1})
        groups.setdefault(limit, []).append(i)
    out = [""] * len(lines)
    for limit, rows in groups.items():
        results = translator.translate_batch(
            [pieces[i] for i in rows], beam_size=beam_size, length_penalty={lp},
            max_decoding_length=limit, min_decoding_length={options.min_len},
            suppress_sequences=[["<pad>"], ["<s>"]], max_input_length=0,
        )
        for i, r in zip(rows, results):
            out[i] = tgt_sp.decode(r.hypotheses[0])
    return out

print(translate(["A dog runs through the park."]))
```

These are `evaluate.py`'s defaults (beam {options.beam_size}, length penalty {lp}: score =
log-probability / length ** {lp}). `beam_size=1` is its greedy decoding, token for token.
A beam-5 translation can differ from ours where a hypothesis reaches the length limit
(`evaluate.py` forces `</s>` there and counts it in the score; CTranslate2 stops without it)
or, rarely, where scores tie closely: CTranslate2 removes `<pad>` and `<s>` before the softmax,
`evaluate.py` after it.
`python evaluate.py engine=ctranslate2 ckpt_path=MODEL_DIR` scores this directory on the test
split, with the same metrics as a checkpoint.

A translation that must start with given words (`evaluate.py prefixes=FILE`): pass their pieces,
`target_prefix=[tgt_sp.encode(prefix, out_type=str), ...]`, to `translate_batch`, with
`max_decoding_length` at least each prefix's length (the limit counts the prefix; CTranslate2
cuts a longer prefix, `evaluate.py` raises the limit). The hypotheses start with the prefix; their
scores leave its log-probabilities out, as `evaluate.py`'s (`decode.score_prefix=false`).
{multilingual}"""
