"""Importing a MarianMT directory (``python -m transformer.export.hf_import``): against
transformers' MarianMTModel and MarianTokenizer on a tiny random OPUS-MT-like model, the same ids,
logits within 1e-4, and greedy and beam translations identical to ``generate``; the checkpoint
evaluates through evaluate.py (with target prefixes and terminology constraints too), analyses
and prunes its heads, exports to CTranslate2 and fine-tunes; options that do not map are refused
by name. (docs/finetune.md's commands: ``tests/export/test_finetune_docs.py``.)"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from tests.export.tiny_marian import DROPPED, write_marian_dir
from tests.tiny import (
    TINY_VOCAB,
    compose_cfg,
    compose_eval_cfg,
    data_pairs,
    tiny_overrides,
    write_lines,
)
from transformer.checkpoints import load_checkpoint, model_from_checkpoint, tokenizer_models
from transformer.checkpoints import tokenizers_from_checkpoint as tokenizers
from transformer.config import TransformerConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer.decoding import DecodeOptions, beam_search, greedy_decode
from transformer.errors import ConfigError, DataError
from transformer.evaluation import evaluate
from transformer.export.hf_import import BLOCKED_LOGIT, import_marian, main, train_overrides
from transformer.translate import Translator

transformers = pytest.importorskip("transformers", reason="the reference: pip install transformers")

LINES = [
    "a man runs in the park",
    "the red dog sits near a small child",
    "a cat ¤ eats",  # a character neither SentencePiece model knows
    "hello",
    "the big blue ball is on the street near the woman and the child",
]
TARGETS = ["der mann läuft", "ein hund sitzt bei dem kind", "x", "hallo", "der ball"]


def import_to(marian_dir: Path, out: Path) -> Path:
    """The checkpoint ``python -m transformer.export.hf_import`` writes of ``marian_dir``."""
    main([str(marian_dir), str(out)])
    return out


def transformers_of(marian_dir: Path):
    """The reference: transformers' MarianMTModel and MarianTokenizer of ``marian_dir``."""
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(marian_dir).eval()
    return model, MarianTokenizer.from_pretrained(marian_dir)


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return write_marian_dir(tmp_path_factory.mktemp("marian") / "opus-mt-tiny")


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory) -> Path:
    return import_to(marian_dir, tmp_path_factory.mktemp("imported") / "opus.ckpt")


@pytest.fixture(scope="module")
def reference(marian_dir):
    return transformers_of(marian_dir)


@pytest.fixture(scope="module")
def separate(tmp_path_factory) -> tuple[Path, Path, tuple]:
    """A model with separate source and target vocabularies (target_vocab.json): its directory,
    its import, and transformers' model and tokenizer of it."""
    out = tmp_path_factory.mktemp("marian") / "opus-mt-tiny-sep"
    marian = write_marian_dir(out, separate=True, eos_bias=2.0)  # translations of several lengths
    checkpoint = import_to(marian, tmp_path_factory.mktemp("imported") / "sep.ckpt")
    return marian, checkpoint, transformers_of(marian)


@pytest.fixture(scope="module")
def separate_imported(separate) -> Path:
    return separate[1]


@pytest.fixture(params=["one vocabulary", "separate vocabularies"])
def case(request) -> tuple[Path, Path, tuple]:
    """(the MarianMT directory, its import, transformers' model and tokenizer) of each kind."""
    if request.param == "separate vocabularies":
        return request.getfixturevalue("separate")
    return tuple(request.getfixturevalue(name) for name in ("marian_dir", "imported", "reference"))


def ours(imported: Path) -> Translator:
    ckpt = load_checkpoint(imported)
    return Translator(model_from_checkpoint(ckpt), *tokenizers(ckpt, imported))


def marian_ids(marian_dir: Path, side: str) -> dict[str, int]:
    """A side's vocabulary: target_vocab.json for the target where the model has one."""
    separate = side == "tgt" and (marian_dir / "target_vocab.json").is_file()
    return json.loads(
        (marian_dir / ("target_vocab.json" if separate else "vocab.json")).read_text()
    )


def to_marian(marian_dir: Path, translator: Translator, side: str = "tgt") -> torch.Tensor:
    """(V,) the Marian id of each of a side's ids: by piece; bos is Marian's start (pad), a piece
    that the vocabulary lacks is unk."""
    vocab = marian_ids(marian_dir, side)
    config = json.loads((marian_dir / "config.json").read_text())
    tok = translator.src_tokenizer if side == "src" else translator.tgt_tokenizer
    ids = [vocab.get(p, vocab["<unk>"]) for p in tok.pieces(range(tok.vocab_size))]
    ids[BOS_ID] = config["decoder_start_token_id"]
    return torch.tensor(ids)


def from_marian(marian_dir: Path, translator: Translator) -> torch.Tensor:
    """(V_marian,) our target id of each Marian target id: by piece."""
    vocab = marian_ids(marian_dir, "tgt")
    pieces = translator.tgt_tokenizer.pieces(range(translator.model.cfg.tgt_vocab_size))
    return torch.tensor([pieces.index(p) for p, _ in sorted(vocab.items(), key=lambda x: x[1])])


def padded(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def test_the_tokenizers_give_marians_ids(case) -> None:
    """Source: the pieces and eos, numbered as vocab.json does; target the same (as
    target_vocab.json does, where the model has one). The piece that the vocabulary lacks keeps
    an id of its own (Marian's: unk), whose embedding is unk's and whose logit is blocked."""
    marian_dir, imported, (_, tok) = case
    translator = ours(imported)
    src = [translator.src_tokenizer.encode(line) + [EOS_ID] for line in LINES]
    src_marian = to_marian(marian_dir, translator, "src")
    assert [src_marian[s].tolist() for s in src] == tok(LINES)["input_ids"]
    as_marian = to_marian(marian_dir, translator)
    tgt = [translator.tgt_tokenizer.encode(line) + [EOS_ID] for line in TARGETS]
    assert [as_marian[t].tolist() for t in tgt] == tok(text_target=TARGETS)["input_ids"]
    dropped = translator.tgt_tokenizer.pieces(range(translator.model.cfg.tgt_vocab_size)).index(
        DROPPED
    )
    assert dropped in tgt[1] and as_marian[dropped] == UNK_ID  # Marian's unk is 1 too
    model = translator.model
    assert model.tgt_embed.tokens.weight[dropped].equal(model.tgt_embed.tokens.weight[UNK_ID])
    assert model.output.bias[dropped] == model.output.bias[BOS_ID] == BLOCKED_LOGIT
    assert translator.src_tokenizer.decode(src[0]) == LINES[0]


def test_logits_equal_marians_for_a_padded_batch(case) -> None:
    marian_dir, imported, (hf, tok) = case
    translator = ours(imported)
    as_marian, src_marian = (to_marian(marian_dir, translator, side) for side in ("tgt", "src"))
    src = [translator.src_tokenizer.encode(line) + [EOS_ID] for line in LINES]
    tgt = [[BOS_ID, *translator.tgt_tokenizer.encode(line)] for line in TARGETS]
    with torch.no_grad():
        logits = translator.model(padded(src, PAD_ID), padded(tgt, PAD_ID))  # (B, T, V)
        theirs = hf(
            input_ids=padded([src_marian[s].tolist() for s in src], tok.pad_token_id),
            attention_mask=padded([[1] * len(s) for s in src], 0),
            decoder_input_ids=padded([as_marian[t].tolist() for t in tgt], tok.pad_token_id),
        ).logits  # (B, T, V_marian)
    marian_ids = from_marian(marian_dir, translator)  # (V_marian,) ours
    for row, t in enumerate(tgt):  # the non-pad positions
        diff = logits[row, : len(t)][:, marian_ids] - theirs[row, : len(t)]
        assert diff.abs().max() < 1e-4
    # ours has a bos (and the extra piece): their probabilities are nil, the softmax Marian's
    lp, lp_theirs = (x.log_softmax(-1) for x in (logits, theirs))
    assert (lp[0, :3][:, marian_ids] - lp_theirs[0, :3]).abs().max() < 1e-4


@pytest.mark.parametrize("beam, len_penalty", [(1, 1.0), (4, 1.0), (4, 2.0)])
def test_greedy_and_beam_translations_equal_generate(case, beam, len_penalty) -> None:
    """The same tokens as ``generate`` with the same settings, and the same beam scores: at most
    b tokens before eos, the pad banned (``bad_words_ids``), a hypothesis finished by eos among
    the top ``beam`` candidates, a search done with ``beam`` finished (``early_stopping=True``).
    At the length limit both force eos (``forced_eos_token_id``), but generate's forced eos costs
    nothing, ours its log-probability (as CTranslate2's README says): beam search is compared on
    the sentences whose translation ended before the limit, greedy search on all."""
    marian_dir, imported, (hf, tok) = case
    translator = ours(imported)
    as_marian = to_marian(marian_dir, translator)
    lines = LINES + data_pairs(15, seed=3)[0]
    src = [translator.src_tokenizer.encode(line) + [EOS_ID] for line in lines]
    b = 12
    strategy = "greedy" if beam == 1 else "beam"
    options = DecodeOptions(
        strategy=strategy, beam_size=beam, len_penalty=len_penalty, max_len_a=0.0, max_len_b=b,
        min_len=0,
    )  # fmt: skip
    search = greedy_decode if beam == 1 else beam_search
    hyps = search(translator.model, padded(src, PAD_ID), options, bos_id=BOS_ID, eos_id=EOS_ID)
    enc = tok(lines, return_tensors="pt", padding=True)
    beams = (
        {} if beam == 1 else dict(num_beams=beam, length_penalty=len_penalty, early_stopping=True)
    )
    out = hf.generate(
        **enc, **beams, do_sample=False, max_length=b + 2, min_length=0,
        bad_words_ids=[[tok.pad_token_id]], forced_eos_token_id=tok.eos_token_id,
        output_scores=True, return_dict_in_generate=True,
    )  # fmt: skip
    specials = (tok.pad_token_id, tok.eos_token_id)
    theirs = [[i for i in row.tolist() if i not in specials] for row in out.sequences]
    mine = [as_marian[h[0].tokens].tolist() for h in hyps]
    # beam search: the sentences whose translation ended before the limit; greedy: all
    ended = [i for i, t in enumerate(theirs) if beam == 1 or len(t) < b]
    assert len(ended) >= 10 and len({tuple(t) for t in theirs}) >= 3
    assert [mine[i] for i in ended] == [theirs[i] for i in ended]
    if beam > 1:
        scores = out.sequences_scores.tolist()
        assert [hyps[i][0].score for i in ended] == pytest.approx([scores[i] for i in ended])
    texts = [t[0].text for t in translator.translate(lines, options)]
    decoded = tok.batch_decode(out.sequences, skip_special_tokens=True)
    # skip_special_tokens drops an unk, which SentencePiece writes as " ⁇ ": compared without
    plain = [i for i in ended if tok.unk_token_id not in mine[i]]
    assert len(plain) >= 8 and [texts[i] for i in plain] == [decoded[i] for i in plain]


def three_splits(root: Path, prefix: str = "") -> list[str]:
    """40 tiny pairs written to ``root`` as train (24), val (8) and test (8) files, each source
    line after ``prefix``; the sources without it."""
    src, tgt = data_pairs(40, seed=5)
    root.mkdir()
    for split, rows in (("train", slice(0, 24)), ("val", slice(24, 32)), ("test", slice(32, 40))):
        write_lines(root / f"{split}.en", [f"{prefix}{line}" for line in src[rows]])
        write_lines(root / f"{split}.de", tgt[rows])
    return src


def tuning(ckpt: Path, corpus: Path) -> list[str]:
    """train.py's options for 3 steps of fine-tuning the imported ``ckpt`` on a tiny ``corpus``:
    the options the import prints, sentences within the tiny model's 64 positions."""
    model = TransformerConfig(**load_checkpoint(ckpt)["hyper_parameters"]["model"])
    base = [o for o in tiny_overrides(corpus) if o != f"data.vocab_size={TINY_VOCAB}"]
    return [*base, *train_overrides(model), f"init_from={ckpt}", "data.max_len=60",
            "trainer.max_steps=3"]  # fmt: skip


CODES = (">>fra<<", ">>deu<<", ">>pt_br<<")  # a multilingual model's target-language tokens


@pytest.fixture(scope="module")
def multilingual_dir(tmp_path_factory) -> Path:
    """A multilingual model's directory: ``CODES`` in vocab.json (an eos bias of 5, as the other
    model's, ends every translation of these weights at once)."""
    out = tmp_path_factory.mktemp("marian") / "opus-mt-tiny-mul"
    return write_marian_dir(out, codes=CODES, eos_bias=3.0)


@pytest.fixture(scope="module")
def multilingual(multilingual_dir, tmp_path_factory) -> Path:
    return import_to(multilingual_dir, tmp_path_factory.mktemp("imported") / "mul.ckpt")


def test_a_multilingual_models_language_token_starts_the_source_as_in_marian(
    multilingual_dir, tmp_path, caplog
) -> None:
    """OPUS-MT's multilingual models are told the language to translate into by a token at the
    source line's start (``>>fra<<``), in vocab.json but in neither .spm file: imported, a line
    starting with one gives MarianTokenizer's ids (the token, then the rest as a line alone) and
    ``generate``'s greedy translations, another token other translations; the import names the
    tokens."""
    from transformers import MarianMTModel, MarianTokenizer

    with caplog.at_level(logging.INFO, logger="transformer.export.hf_import"):
        main([str(multilingual_dir), str(tmp_path / "mul.ckpt")])
    assert "a multilingual model: start each source line with the token" in caplog.text
    assert "(3: >>fra<< >>deu<< >>pt_br<<)" in caplog.text
    translator = ours(tmp_path / "mul.ckpt")
    hf = MarianMTModel.from_pretrained(multilingual_dir).eval()
    tok = MarianTokenizer.from_pretrained(multilingual_dir)
    lines = [f"{code} {line}" for code in CODES for line in LINES]
    lines += [f"{CODES[1]}{LINES[0]}", LINES[3]]
    as_marian = to_marian(multilingual_dir, translator)
    src = [translator.src_tokenizer.encode(line) + [EOS_ID] for line in lines]
    assert [as_marian[s].tolist() for s in src] == tok(lines)["input_ids"]
    pieces = translator.src_tokenizer.pieces(range(translator.model.cfg.src_vocab_size))
    assert [s[0] for s in src[:: len(LINES)][: len(CODES)]] == [pieces.index(c) for c in CODES]
    # spaces before the token: ours takes it off all the same (MarianTokenizer looks at the
    # line's first character only)
    spaced = translator.src_tokenizer.encode(f"  {CODES[2]}  {LINES[1]}")
    assert spaced == translator.src_tokenizer.encode(f"{CODES[2]} {LINES[1]}")
    greedy = DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=12, min_len=0)
    texts = [t[0].text for t in translator.translate(lines, greedy)]
    out = hf.generate(
        **tok(lines, return_tensors="pt", padding=True), do_sample=False, num_beams=1,
        max_length=14, min_length=0, bad_words_ids=[[tok.pad_token_id]],
        forced_eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    assert texts == tok.batch_decode(out, skip_special_tokens=True)
    by_code = [texts[i * len(LINES) : (i + 1) * len(LINES)] for i in range(len(CODES))]
    assert len({tuple(t) for t in by_code}) == len(CODES)


@pytest.mark.slow
def test_a_multilingual_model_scores_and_fine_tunes_on_sources_that_carry_the_token(
    multilingual, tmp_path
) -> None:
    """A corpus whose source lines start with the token: ``evaluate.py split=test`` translates
    them as the lines themselves translate, and ``init_from`` trains on them."""
    corpus = tmp_path / "corpus"
    src = three_splits(corpus, f"{CODES[1]} ")
    data = ["data.source=local", f"data.root={corpus}"]
    short = ["decode=greedy", "decode.max_len_a=0", "decode.max_len_b=12", "decode.min_len=0"]
    cfg = compose_eval_cfg([f"ckpt_path={multilingual}", *data, "split=test", *short], tmp_path)
    assert math.isfinite(evaluate(cfg)["bleu"])
    greedy = DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=12, min_len=0)
    lines = [f"{CODES[1]} {line}" for line in src[32:]]
    want = [t[0].text for t in ours(multilingual).translate(lines, greedy)]
    assert (tmp_path / "hypotheses.txt").read_text().splitlines() == want
    metrics = train_run(compose_cfg(tuning(multilingual, corpus), tmp_path / "tuned"))
    assert math.isfinite(metrics["train/loss"])


@pytest.mark.slow
def test_data_target_token_puts_the_models_token_before_sources_that_lack_it(
    multilingual, tmp_path
) -> None:
    """A corpus whose source lines do not carry the token: ``data.target_token='>>deu<<'`` puts
    it there, so ``evaluate.py split=test`` and ``input=FILE`` translate as the lines written
    with it do, and ``init_from`` fine-tunes with it (the tuned checkpoint records it and puts
    it before its inputs); a token the model lacks is refused, naming the model's."""
    corpus = tmp_path / "corpus"
    src = three_splits(corpus)
    token = f"data.target_token='{CODES[1]}'"
    data = ["data.source=local", f"data.root={corpus}", token]
    short = ["decode=greedy", "decode.max_len_a=0", "decode.max_len_b=12", "decode.min_len=0"]
    greedy = DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=12, min_len=0)
    written = [f"{CODES[1]} {line}" for line in src[32:]]
    want = [t[0].text for t in ours(multilingual).translate(written, greedy)]
    assert want != [t[0].text for t in ours(multilingual).translate(src[32:], greedy)]
    run = tmp_path / "split"
    evaluate(compose_eval_cfg([f"ckpt_path={multilingual}", *data, "split=test", *short], run))
    assert (run / "hypotheses.txt").read_text().splitlines() == want
    run, text = tmp_path / "input", write_lines(tmp_path / "input.en", src[32:])
    evaluate(compose_eval_cfg([f"ckpt_path={multilingual}", f"input={text}", token, *short], run))
    assert (run / "hypotheses.txt").read_text().splitlines() == want
    # a line that names its own language keeps it
    own = [f"{CODES[0]} {src[32]}", *src[33:]]
    run, mixed = tmp_path / "mixed", write_lines(tmp_path / "mixed.en", own)
    evaluate(compose_eval_cfg([f"ckpt_path={multilingual}", f"input={mixed}", token, *short], run))
    fra = [t[0].text for t in ours(multilingual).translate(own[:1], greedy)]
    assert fra != want[:1]
    assert (run / "hypotheses.txt").read_text().splitlines() == [*fra, *want[1:]]

    train_run(compose_cfg([*tuning(multilingual, corpus), token], tmp_path / "tuned"))
    tuned = tmp_path / "tuned" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(tuned)["datamodule_hyper_parameters"]["target_token"] == CODES[1]
    run = tmp_path / "tuned_input"
    evaluate(compose_eval_cfg([f"ckpt_path={tuned}", f"input={text}", *short], run))
    assert (run / "hypotheses.txt").read_text().splitlines() == [
        t[0].text for t in ours(tuned).translate(written, greedy)
    ]
    with pytest.raises(DataError, match=r"no piece >>de<<; its own tokens are >>fra<<, >>deu<<"):
        evaluate(compose_eval_cfg(
            [f"ckpt_path={multilingual}", *data[:2], "data.target_token='>>de<<'", *short],
            tmp_path / "wrong",
        ))  # fmt: skip


def test_a_multilingual_model_exports_to_ctranslate2_with_its_tokens(
    multilingual, tmp_path
) -> None:
    """Exported to CTranslate2, lines that start with a token translate as ours, and the
    directory's README names the tokens."""
    pytest.importorskip("ctranslate2", reason='CTranslate2 is optional: pip install -e ".[export]"')
    from transformer.export.ct2 import export_ct2
    from transformer.export.ct2_translate import CT2Translator

    export_ct2([multilingual], tmp_path / "ct2")
    assert "put one of >>fra<<, >>deu<<, >>pt_br<< before each source" in (
        (tmp_path / "ct2" / "README.md").read_text()
    )
    lines = [f"{code} {line}" for code in CODES for line in LINES]
    greedy = DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=12, min_len=0)
    want = [t[0].text for t in ours(multilingual).translate(lines, greedy)]
    got = CT2Translator(tmp_path / "ct2", threads=1).translate(lines, greedy)
    assert [t[0].text for t in got] == want


def test_a_direction_for_an_imported_model_is_refused_naming_it(imported) -> None:
    """An imported model records no corpus: from Python, a direction is refused by name (not
    read as a corpus it never had), and without one it translates."""
    with pytest.raises(ConfigError, match=r"^direction='en-de': the checkpoint records no corpus"):
        Translator.from_checkpoint(imported, device="cpu", direction="en-de")
    assert Translator.from_checkpoint(imported, device="cpu").src_tokenizer.prefix == ()


def test_the_checkpoint_translates_a_file_with_evaluate_py(imported, tmp_path) -> None:
    text = tmp_path / "input.txt"
    text.write_text("\n".join(LINES) + "\n")
    options = ["decode=greedy", "decode.max_len_a=0", "decode.max_len_b=12", "decode.min_len=0"]
    cfg = compose_eval_cfg([f"ckpt_path={imported}", f"input={text}", *options], tmp_path)
    result = evaluate(cfg)
    assert result["lines"] == len(LINES)
    greedy = DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=12, min_len=0)
    want = [t[0].text for t in ours(imported).translate(LINES, greedy)]
    assert (tmp_path / "hypotheses.txt").read_text().splitlines() == want


@pytest.mark.parametrize("checkpoint", ["imported", "separate_imported"])
def test_the_checkpoint_exports_to_ctranslate2_and_translates_as_ours(
    checkpoint, request, tmp_path
) -> None:
    imported = request.getfixturevalue(checkpoint)
    pytest.importorskip("ctranslate2", reason='CTranslate2 is optional: pip install -e ".[export]"')
    from transformer.export.ct2 import export_ct2
    from transformer.export.ct2_translate import CT2Translator

    export_ct2([imported], tmp_path / "ct2")
    for options in (
        DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=12, min_len=0),
        DecodeOptions(beam_size=4, max_len_a=0.0, max_len_b=12, min_len=0),
    ):
        want = [t[0].text for t in ours(imported).translate(LINES, options)]
        got = CT2Translator(tmp_path / "ct2", threads=1).translate(LINES, options)
        assert [t[0].text for t in got] == want


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["imported", "separate_imported"])
def test_the_checkpoint_fine_tunes_with_init_from(checkpoint, request, corpus, tmp_path) -> None:
    """A few steps on another corpus with the options the import prints: a finite loss, and the
    run's checkpoint carries the imported tokenizers and model options unchanged (with one
    vocabulary or two)."""
    imported = request.getfixturevalue(checkpoint)
    metrics = train_run(compose_cfg(tuning(imported, corpus), tmp_path))
    assert math.isfinite(metrics["train/loss"])
    tuned = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    start = load_checkpoint(imported)
    assert tokenizer_models(tuned) == tokenizer_models(start)  # (their names: the run's cache's)
    assert tuned["hyper_parameters"]["model"] == start["hyper_parameters"]["model"]


@pytest.mark.slow
def test_the_checkpoint_analyses_and_prunes_its_heads(imported, corpus, tmp_path) -> None:
    """``evaluate.py analysis=heads`` on a local corpus's test split ranks the 24 heads;
    ``python -m transformer.prune --heads`` removes the quarter it ranks least important (by
    gradient), and the pruned checkpoint still scores the split."""
    from transformer.prune import main as prune

    data = ["data.source=local", f"data.root={corpus}", "split=test"]
    short = ["decode=greedy", "decode.max_len_a=0", "decode.max_len_b=12"]
    heads = ["analysis=heads", "analysis_options.importance=gradient"]
    heads += ["analysis_options.sentences=4", "analysis_options.prune_step=0.5"]
    cfg = compose_eval_cfg([f"ckpt_path={imported}", *data, *short, *heads], tmp_path / "heads")
    result = evaluate(cfg)
    assert len(result["heads"]) == 3 * 2 * 4  # types x layers x heads
    ranked = sorted(result["heads"], key=lambda h: h["gradient"])
    least = [(h["kind"], h["layer"], h["head"]) for h in ranked[:6]]
    pruned = tmp_path / "pruned.ckpt"
    prune([str(imported), str(pruned), "--heads", ",".join(f"{k}:{i}:{h}" for k, i, h in least)])
    ckpt = load_checkpoint(pruned)
    assert sorted(map(tuple, ckpt["pruned_heads"][-1])) == sorted(least)
    assert sum(map(sum, ckpt["hyper_parameters"]["model"]["heads_per_layer"].values())) == 18
    scored = evaluate(compose_eval_cfg([f"ckpt_path={pruned}", *data, *short], tmp_path / "eval"))
    assert math.isfinite(scored["bleu"])
    assert len((tmp_path / "eval" / "hypotheses.txt").read_text().splitlines()) == 32


@pytest.mark.slow
def test_the_checkpoint_is_pruned_by_share_on_a_corpus_named_for_it(
    imported, corpus, tmp_path, capsys
) -> None:
    """An imported checkpoint records no corpus: ``--share`` without one is refused naming the
    options (not read as Multi30k's), and ``--data-source local --data-root DIR`` ranks its heads
    on that corpus's split."""
    from transformer.prune import main as prune

    with pytest.raises(SystemExit):
        prune([str(imported), str(tmp_path / "no.ckpt"), "--share", "0.25"])
    assert "records no corpus to score heads on; name one (--data-source local" in (
        capsys.readouterr().err
    )
    out = tmp_path / "pruned.ckpt"
    prune([str(imported), str(out), "--share", "0.25", "--sentences", "4", "--split", "test",
           "--data-source", "local", "--data-root", str(corpus)])  # fmt: skip
    ckpt = load_checkpoint(out)
    assert sum(map(sum, ckpt["hyper_parameters"]["model"]["heads_per_layer"].values())) == 18


def test_pruning_ranks_a_multilingual_models_heads_on_sources_with_its_token(
    multilingual, tmp_path
) -> None:
    """``--share`` scores the heads on the split's sources with the model's target token before
    them, as the lines written with it score: ``--target-token`` for an imported model, the
    checkpoint's own (``data.target_token``) for one trained with it; without it, other scores.
    ``--data-tgt-lang`` names the corpus's target files in place of the checkpoint's language."""
    from transformer.prune import checkpoint_scores
    from transformer.prune import main as prune

    src, tgt = data_pairs(12, seed=5)
    plain, written = tmp_path / "plain", tmp_path / "written"
    for root, lines in ((plain, src), (written, [f"{CODES[1]} {line}" for line in src])):
        root.mkdir()
        write_lines(root / "val.en", lines)
        write_lines(root / "val.de", tgt)
    write_lines(plain / "val.fr", tgt)  # the same references, named for another language
    ckpt = load_checkpoint(multilingual)

    def scores(ckpt: dict, root: Path, token: str | None = None, tgt: str | None = None) -> dict:
        data = {"root": str(root), "source": "local", "tgt_lang": tgt, "target_token": token}
        return checkpoint_scores(ckpt, multilingual, "gradient", "val", 8, data)

    want = scores(ckpt, written)
    assert scores(ckpt, plain, CODES[1]) == pytest.approx(want, rel=1e-6)
    assert scores(ckpt, plain, CODES[1], "fr") == pytest.approx(want, rel=1e-6)
    assert scores(ckpt, plain) != pytest.approx(want, rel=1e-3)
    settings = {**ckpt["datamodule_hyper_parameters"], "target_token": CODES[1]}
    recorded = {**ckpt, "datamodule_hyper_parameters": settings}  # as a tuned model records it
    assert scores(recorded, plain) == pytest.approx(want, rel=1e-6)
    out = tmp_path / "pruned.ckpt"
    prune([str(multilingual), str(out), "--share", "0.25", "--sentences", "8", "--data-source",
           "local", "--data-root", str(plain), "--data-tgt-lang", "fr", "--target-token",
           CODES[1]])  # fmt: skip
    assert out.is_file()


@pytest.mark.slow  # two evaluate.py runs
def test_the_checkpoint_decodes_with_prefixes_and_constraints(imported, tmp_path) -> None:
    """``evaluate.py input=FILE prefixes=FILE``: each translation starts with its line's prefix
    (an empty line: none); ``constraints=FILE`` (beam search): each holds its line's phrases."""
    text = write_lines(tmp_path / "input.en", LINES[:3])
    prefixes = write_lines(tmp_path / "prefixes.de", ["der mann", "", "ein"])
    terms = ['["hund"]', "[]", '["der ball", "kind"]']
    constraints = write_lines(tmp_path / "terms.jsonl", terms)
    short = ["decode.beam_size=4", "decode.max_len_a=0", "decode.max_len_b=16"]
    for guide, path in (("prefixes", prefixes), ("constraints", constraints)):
        out = tmp_path / f"translated-{guide}.de"
        options = [f"ckpt_path={imported}", f"input={text}", f"{guide}={path}", f"output={out}"]
        assert evaluate(compose_eval_cfg([*options, *short], tmp_path / guide))["lines"] == 3
        translations = out.read_text().splitlines()
        assert len(translations) == 3
        if guide == "prefixes":
            assert translations[0].startswith("der mann") and translations[2].startswith("ein")
        else:
            for line, phrases in zip(translations, map(json.loads, terms), strict=True):
                assert all(phrase in line for phrase in phrases), (line, phrases)


def train_run(cfg) -> dict:
    from transformer.training import train

    return train(cfg)


def test_a_marian_option_that_does_not_map_is_refused_naming_its_field(
    marian_dir, tmp_path, capsys
) -> None:
    config = json.loads((marian_dir / "config.json").read_text())
    for field, value, message in (
        ("activation_function", "gelu_new", r"activation_function='gelu_new' is not one of"),
        ("scale_embedding", False, r"scale_embedding=False has no equivalent"),
        ("decoder_attention_heads", 2, r"decoder_attention_heads=2 differs from"),
        ("decoder_vocab_size", 7, r"decoder_vocab_size=7 differs from vocab_size=\d+, but "),
        ("tie_word_embeddings", False, r"tie_word_embeddings=False has no equivalent"),
    ):
        changed = tmp_path / field
        changed.mkdir()
        for f in marian_dir.iterdir():
            (changed / f.name).symlink_to(f)
        (changed / "config.json").unlink()
        (changed / "config.json").write_text(json.dumps({**config, field: value}))
        with pytest.raises(ConfigError, match=r"^config\.json: " + message):
            import_marian(changed)
    with pytest.raises(SystemExit):
        main([str(changed), str(tmp_path / "out.ckpt")])
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: config.json: tie_word_embeddings=False")
    assert len(err.splitlines()) == 1 and not (tmp_path / "out.ckpt").exists()


def test_separate_vocabularies_need_both_files_and_the_specials_on_both_sides(
    separate, tmp_path
) -> None:
    """Without target_vocab.json, or with a source vocabulary that lacks the target's eos piece,
    the import stops naming the file."""

    def changed(name: str, without: str) -> Path:
        out = tmp_path / name
        out.mkdir()
        for f in separate[0].iterdir():
            if f.name != without:
                (out / f.name).symlink_to(f)
        return out

    with pytest.raises(DataError, match=r"target_vocab\.json does not exist"):
        import_marian(changed("no-target", without="target_vocab.json"))
    vocab = json.loads((separate[0] / "vocab.json").read_text())
    vocab["<eos>"] = vocab.pop("</s>")
    lacking = changed("no-eos", without="vocab.json")
    (lacking / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(DataError, match=r"vocab\.json has no '</s>', target_vocab\.json's eos"):
        import_marian(lacking)
