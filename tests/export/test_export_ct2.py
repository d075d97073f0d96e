"""Export to CTranslate2: its model computes ours (log-probabilities of every supported
configuration, greedy translations token for token, beam search on nearly every sentence), bad
input is refused by name, and evaluate.py scores an exported directory like a checkpoint."""

from __future__ import annotations

import io
import json
import math
import random
import re
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import torch.nn.functional as F

from tests.tiny import compose_eval_cfg
from transformer import Transformer, TransformerConfig
from transformer.averaging import average_checkpoints
from transformer.checkpoints import load_checkpoint, model_from_checkpoint
from transformer.checkpoints import tokenizers_from_checkpoint as tokenizers
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from transformer.decoding import DecodeOptions
from transformer.errors import CheckpointError, ConfigError, UserError
from transformer.evaluation import evaluate
from transformer.export import ct2 as export
from transformer.export import ct2_readme, ct2_translate
from transformer.export.__main__ import main as export_main
from transformer.export.ct2_translate import CT2Translator
from transformer.surgery import prune_model
from transformer.translate import Translator

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason='CTranslate2 is optional: pip install -e ".[export]"'
)

EN = "a the man woman dog cat child red blue big small runs sits eats on in near park street ball"
DE = "ein der mann frau hund katze kind rot blau groß klein läuft sitzt isst auf in bei park straße ball"  # noqa: E501
MAP = dict(zip(EN.split(), DE.split(), strict=True))


# -- random weights: every configuration scores as ours ------------------------------------


VOCAB = ["<pad>", "<unk>", "<s>", "</s>", *(f"w{i}" for i in range(4, 48))]


def random_model(**options) -> Transformer:
    """Small random model whose layer norms and biases are not at their initial values (so a
    mapping that mixed them up would show)."""
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=len(VOCAB), tgt_vocab_size=len(VOCAB), d_model=32, num_heads=4,
        num_encoder_layers=2, num_decoder_layers=2, d_ff=64, max_positions=64, **options,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def ours_log_probs(model: Transformer, src: list[int], tgt: list[int]) -> torch.Tensor:
    """Teacher-forced log-probabilities of ``tgt + eos`` given ``src + eos``: (len(tgt) + 1,)."""
    with torch.no_grad():
        logits = model(torch.tensor([src + [EOS_ID]]), torch.tensor([[BOS_ID, *tgt]]))[0]
    return logits.log_softmax(-1).gather(1, torch.tensor([*tgt, EOS_ID])[:, None])[:, 0]


def ct2_log_probs(model_dir: Path, pairs: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    results = translator.score_batch(
        [[VOCAB[i] for i in s] for s, _ in pairs], [[VOCAB[i] for i in t] for _, t in pairs]
    )
    return [torch.tensor(r.log_probs) for r in results]


def random_pairs() -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(1)
    lengths = [(5, 7), (17, 2), (1, 30), (40, 12)]  # one batch, padded on both sides
    return [
        (torch.randint(4, len(VOCAB), (s,), generator=g).tolist(),
         torch.randint(4, len(VOCAB), (t,), generator=g).tolist())
        for s, t in lengths
    ]  # fmt: skip


CONFIGURATIONS = {
    "pre-norm relu": {},
    "post-norm": {"norm_first": False},
    "gelu": {"activation": "gelu"},
    "silu": {"activation": "silu"},
    "output bias": {"output_bias": True},
    "opus-mt's": {
        "norm_first": False,
        "activation": "silu",
        "output_bias": True,
        "share_all_embeddings": True,
    },
    "no bias": {"bias": False},
    "grouped-query": {"num_kv_heads": 2},
    "multi-query": {"num_kv_heads": 1},
    "untied output": {"tie_output_embeddings": False},
    "shared embeddings": {"share_all_embeddings": True},
    "post-norm gelu multi-query no bias": {
        "norm_first": False,
        "activation": "gelu",
        "num_kv_heads": 1,
        "bias": False,
    },  # fmt: skip
    "layer_norm_eps 1e-3": {"layer_norm_eps": 1e-3},
    "learned positions": {"positions": "learned"},
    "rotary positions": {"positions": "rope"},
    "rotary grouped-query": {"positions": "rope", "num_kv_heads": 2},
    "relative positions": {"positions": "relative"},
    "relative post-norm multi-query": {
        "positions": "relative",
        "norm_first": False,
        "num_kv_heads": 1,
    },
}


@pytest.mark.parametrize("options", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
def test_score_batch_equals_our_teacher_forced_log_probs(options, tmp_path) -> None:
    model = random_model(**options)
    export.save_spec(export.transformer_spec(model, VOCAB, VOCAB), tmp_path)
    pairs = random_pairs()
    for (src, tgt), theirs in zip(pairs, ct2_log_probs(tmp_path, pairs), strict=True):
        ours = ours_log_probs(model, src, tgt)
        assert theirs.shape == ours.shape
        assert (theirs - ours).abs().max() < 1e-4


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["multi-head", "grouped-query"])
def test_pruned_models_score_as_ours(kv_heads, tmp_path) -> None:
    """CTranslate2 has one head count per stack: the removed heads go back in as zeros."""
    full = random_model(num_kv_heads=kv_heads)
    heads = [("encoder_self", 0, 0), ("encoder_self", 0, 1), ("cross", 1, 2), ("cross", 1, 3)]
    heads += [(kind, 0, h) for kind in ("decoder_self", "cross") for h in range(4)]  # none left
    model = prune_model(full, heads)
    export.save_spec(export.transformer_spec(model, VOCAB, VOCAB), tmp_path)
    pairs = random_pairs()
    for (src, tgt), theirs in zip(pairs, ct2_log_probs(tmp_path, pairs), strict=True):
        assert (theirs - ours_log_probs(model, src, tgt)).abs().max() < 1e-4


def test_a_relative_model_pruned_to_its_first_heads_scores_as_ours(tmp_path) -> None:
    """CTranslate2 gives every layer the bias of heads 0, 1, ...: a layer whose removed heads
    were its last ones (restored as zeros) still reads the right columns; others are refused."""
    full = random_model(positions="relative")
    model = prune_model(
        full, [("encoder_self", 1, 3), ("decoder_self", 0, 2), ("decoder_self", 0, 3)]
    )
    export.save_spec(export.transformer_spec(model, VOCAB, VOCAB), tmp_path)
    pairs = random_pairs()
    for (src, tgt), theirs in zip(pairs, ct2_log_probs(tmp_path, pairs), strict=True):
        assert (theirs - ours_log_probs(model, src, tgt)).abs().max() < 1e-4
    model = prune_model(full, [("encoder_self", 1, 0)])
    with pytest.raises(
        ConfigError,
        match=r"positions=relative cannot be exported to CTranslate2 "
        r"with encoder_self layer 1 pruned to heads \[1, 2, 3\]",
    ):
        export.transformer_spec(model, VOCAB, VOCAB)


def test_ctranslate2s_own_position_table_is_not_ours(tmp_path) -> None:
    """Why the table is exported: CTranslate2's built-in sinusoids (from position 1, sin and cos
    in halves) score differently."""
    model = random_model()
    spec = export.transformer_spec(model, VOCAB, VOCAB)
    from ctranslate2.specs.model_spec import OPTIONAL

    spec.encoder.position_encodings.encodings = OPTIONAL  # left to CTranslate2
    spec.decoder.position_encodings.encodings = OPTIONAL
    export.save_spec(spec, tmp_path)
    pairs = random_pairs()
    theirs = ct2_log_probs(tmp_path, pairs)
    diffs = [t - ours_log_probs(model, s, g) for (s, g), t in zip(pairs, theirs, strict=True)]
    assert max(d.abs().max() for d in diffs) > 1e-2


# -- refusals ---------------------------------------------------------------------------


def test_every_config_option_is_converted_or_refused() -> None:
    """A new TransformerConfig option is refused until the conversion maps it."""
    from dataclasses import fields

    assert {f.name for f in fields(TransformerConfig)} == export.CONVERTED_OPTIONS


def test_unmapped_option_and_head_masks_are_refused_by_name(monkeypatch) -> None:
    model = random_model(bias=False)
    monkeypatch.setattr(export, "CONVERTED_OPTIONS", export.CONVERTED_OPTIONS - {"bias"})
    with pytest.raises(ConfigError, match=r"model\.bias=False .*model\.bias=True"):
        export.transformer_spec(model, VOCAB, VOCAB)
    monkeypatch.undo()
    model.set_head_mask("cross", 1, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ConfigError, match="cross attention of layer 1 has a head mask.*prune"):
        export.transformer_spec(model, VOCAB, VOCAB)


def test_without_ctranslate2_the_error_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import raises ImportError
    with pytest.raises(UserError, match=r'pip install -e "\.\[export\]"'):
        export.transformer_spec(random_model(), VOCAB, VOCAB)


# -- a trained model -------------------------------------------------------------------


def sentence_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """English sentences of 2-9 words and their word-by-word German, verb moved to the end."""
    rng, words = random.Random(seed), EN.split()
    en, de = [], []
    for _ in range(n):
        sentence = [rng.choice(words) for _ in range(rng.randint(2, 9))]
        en.append(" ".join(sentence))
        german = [MAP[w] for w in sentence]
        de.append(" ".join(german[:1] + german[2:] + german[1:2]))
    return en, de


def sentencepiece_model(texts: list[str]) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=72, model_type="unigram",
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, hard_vocab_limit=False,
        minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[list[Path], Path]:
    """Two checkpoints (after 150 and 300 updates) of a tiny model trained on a synthetic
    corpus written to a folder, in train.py's checkpoint format, and the corpus folder."""
    root = tmp_path_factory.mktemp("ct2")
    corpus = root / "corpus"
    corpus.mkdir()
    for split, n, seed in (("train", 2000, 0), ("val", 100, 1), ("test", 100, 2)):
        en, de = sentence_pairs(n, seed)
        (corpus / f"{split}.en").write_text("\n".join(en) + "\n")
        (corpus / f"{split}.de").write_text("\n".join(de) + "\n")
    en, de = sentence_pairs(2000, 0)
    proto = sentencepiece_model(en + de)
    tok = Tokenizer("joint.model", model_proto=proto)
    cfg = TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=32, num_heads=4,
        num_encoder_layers=2, num_decoder_layers=2, d_ff=64, max_positions=64, dropout=0.0,
        share_all_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg)
    data = {
        "datamodule_hyper_parameters": {
            "source": "local",
            "root": str(corpus),
            "src_lang": "en",
            "tgt_lang": "de",
            "vocab_size": tok.vocab_size,
            "cache_dir": str(root / "cache"),
            "num_workers": 0,
            "val_split": "val",
            "test_split": "test",
        },
        "tokenizers": {side: {"name": "joint.model", "model": proto} for side in ("src", "tgt")},
    }
    paths = []
    for step in train(model, tok, en, de, 300):
        if step in (150, 300):
            paths.append(root / f"step{step}.ckpt")
            state = {f"model.{k}": v for k, v in model.state_dict().items()}
            hparams = {"model": cfg.to_dict()}
            torch.save({"hyper_parameters": hparams, "state_dict": state, **data}, paths[-1])
    return paths, corpus


def train(model: Transformer, tok: Tokenizer, en: list[str], de: list[str], steps: int):
    """Adam updates of ``model`` on batches of 32 of the pairs (en, de), each seeded by its step;
    yields the number of updates made after each."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    src_ids = [ids + [EOS_ID] for ids in tok.encode_batch(en)]
    tgt_ids = tok.encode_batch(de)
    for step in range(steps):
        rows = random.Random(step).sample(range(len(en)), 32)
        src = pad([src_ids[i] for i in rows])
        tgt_in = pad([[BOS_ID, *tgt_ids[i]] for i in rows])
        tgt_out = pad([[*tgt_ids[i], EOS_ID] for i in rows])
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        yield step + 1


def pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD_ID)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "model"
    export_main(["ct2", str(trained[0][-1]), str(out)])
    return out


def ours_and_theirs(trained, exported, options: DecodeOptions, lines: list[str]):
    ckpt = load_checkpoint(trained[0][-1])
    ours = Translator(model_from_checkpoint(ckpt), *tokenizers(ckpt, trained[0][-1]))
    theirs = CT2Translator(exported, threads=1)
    return ours.translate(lines, options), theirs.translate(lines, options)


def source_lines(trained) -> list[str]:
    corpus = trained[1]
    return [*(corpus / "test.en").read_text().splitlines(), "", "a dog ¤ runs"]  # blank, unk


@pytest.mark.parametrize(
    "options",
    [
        DecodeOptions(strategy="greedy"),
        DecodeOptions(strategy="greedy", min_len=12),  # eos banned until 12 tokens
        DecodeOptions(strategy="greedy", max_len_a=0.5, max_len_b=1),  # most hit the limit
        DecodeOptions(strategy="greedy", no_repeat_ngram_size=1),
    ],
    ids=["greedy", "min_len", "max_len", "no_repeat"],
)
@pytest.mark.slow
def test_greedy_translations_equal_ours(trained, exported, options) -> None:
    ours, theirs = ours_and_theirs(trained, exported, options, source_lines(trained))
    assert [t[0].text for t in theirs] == [t[0].text for t in ours]
    assert len({t[0].text for t in ours}) > 90  # real, different translations


@pytest.mark.slow
def test_one_call_for_all_limits_lets_sentences_exceed_their_own(trained, exported) -> None:
    options = DecodeOptions(strategy="greedy", max_len_a=0.5, max_len_b=1)
    lines = source_lines(trained)
    ours, _ = ours_and_theirs(trained, exported, options, lines)
    one_call = CT2Translator(exported, threads=1, exact_limits=False).translate(lines, options)
    longer = [len(t[0].text) > len(o[0].text) for o, t in zip(ours, one_call, strict=True)]
    assert sum(longer) > 10


@pytest.mark.slow
def test_beam_translations_agree_on_nearly_all_sentences(trained, exported) -> None:
    """Beam 5: the same translations on >= 97% of the sentences. CTranslate2 removes the ids it
    bans (eos before min_len, pad, bos) before its softmax, we after ours: its scores are ours
    renormalised over the allowed ids, a little higher; that and the length limit (ours forces
    and scores eos there, it stops) are where translations can differ."""
    lines = source_lines(trained) + sentence_pairs(200, 3)[0]
    options = DecodeOptions(beam_size=5, nbest=2)
    ours, theirs = ours_and_theirs(trained, exported, options, lines)
    same = [o[0].text == t[0].text for o, t in zip(ours, theirs, strict=True)]
    assert sum(same) / len(same) >= 0.97, f"{sum(same)}/{len(same)} identical"  # here: 302/302
    for o, t, agree in zip(ours, theirs, same, strict=True):
        assert len(t) == len(o)
        if agree and o[0].score is not None:
            assert o[0].score - 1e-5 <= t[0].score <= o[0].score + 0.02


@pytest.mark.slow
def test_beam_scores_equal_ours_where_nothing_is_banned(trained, exported) -> None:
    """min_len=0 and no banned ids: the same search, so the same hypotheses with the same scores
    (log-probability with eos / length ** len_penalty)."""
    lines = (trained[1] / "test.en").read_text().splitlines()
    options = DecodeOptions(beam_size=5, min_len=0, len_penalty=0.6)
    ours, _ = ours_and_theirs(trained, exported, options, lines)
    theirs = CT2Translator(exported, threads=1)
    kwargs = ct2_translate.search_kwargs(options, "<pad>", "<s>")
    del kwargs["suppress_sequences"]
    for line, o in zip(lines, ours, strict=True):
        pieces = [theirs.src_tokenizer.pieces(theirs.src_tokenizer.encode(line))]
        limit = math.floor(1.2 * (len(pieces[0]) + 1)) + 10
        r = theirs.translator.translate_batch(pieces, max_decoding_length=limit, **kwargs)[0]
        assert theirs.tgt_tokenizer.decode(theirs.tgt_ids[p] for p in r.hypotheses[0]) == o[0].text
        assert r.scores[0] == pytest.approx(o[0].score, abs=1e-5)


@pytest.mark.slow
def test_export_of_several_checkpoints_is_that_of_their_average(trained, tmp_path) -> None:
    paths = [str(p) for p in trained[0]]
    torch.save(average_checkpoints(paths), tmp_path / "avg.ckpt")
    export.export_ct2([tmp_path / "avg.ckpt"], tmp_path / "one")
    export_main(["ct2", *paths, str(tmp_path / "two")])
    one, two = ((tmp_path / d / "model.bin").read_bytes() for d in ("one", "two"))
    assert one == two
    assert (tmp_path / "two" / "shared_vocabulary.json").is_file()
    readme = (tmp_path / "two" / "README.md").read_text()
    assert "beam_size=5" in readme and "length_penalty=1.0" in readme


def cpu_has_avx512() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return not cpuinfo.is_file() or "avx512bw" in cpuinfo.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["int8", "bfloat16"])
def test_quantized_models_translate_nearly_as_float32(trained, exported, tmp_path, quantization):
    """Greedy translations of the tiny model (many near ties) mostly as float32's. On a CPU
    without AVX512 CTranslate2 runs int8 on its AVX2 kernels, which drift further: 58 of 102
    lines identical on such a CPU, the same before and after this project's decoder changes
    (2026-11-26), against >= 90% with AVX512; a broken export would share few."""
    export_main(["ct2", str(trained[0][-1]), str(tmp_path / "q"), "--quantization", quantization])
    options, lines = DecodeOptions(strategy="greedy"), source_lines(trained)
    full = CT2Translator(exported, threads=1).translate(lines, options)
    quantized = CT2Translator(tmp_path / "q", threads=1)
    size = [(d / "model.bin").stat().st_size for d in (exported, tmp_path / "q")]
    assert size[1] < 0.6 * size[0]  # 8- or 16-bit weights
    translated = quantized.translate(lines, options)
    same = [a[0].text == b[0].text for a, b in zip(full, translated, strict=True)]
    bar = 0.9 if quantization != "int8" or cpu_has_avx512() else 0.4
    assert sum(same) / len(same) >= bar


@pytest.mark.slow
def test_export_refuses_bad_arguments(trained, exported, tmp_path, capsys) -> None:
    ckpt = str(trained[0][-1])
    with pytest.raises(SystemExit, match="exists and is not empty; choose another OUT_DIR"):
        export_main(["ct2", ckpt, str(exported)])
    with pytest.raises(SystemExit, match=f"checkpoint {tmp_path}/none.ckpt does not exist"):
        export_main(["ct2", str(tmp_path / "none.ckpt"), str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        export_main(["ct2", ckpt, str(tmp_path / "out"), "--quantization", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--quantization int4"):
        export.export_ct2([ckpt], tmp_path / "out", "int4")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_force_replaces_an_earlier_export_whole_and_nothing_else(trained, tmp_path) -> None:
    """--force swaps a new export in for an earlier one; an export directory holding a file the
    export does not write is refused after the build, unchanged, and no temporary one is left."""
    ckpt, out = str(trained[0][-1]), tmp_path / "model"
    export_main(["ct2", ckpt, str(out), "--quantization", "int8"])
    export_main(["ct2", ckpt, str(out), "--force"])
    assert json.loads((out / export.INFO_FILE).read_text())["quantization"] == "float32"
    (out / "notes.txt").write_text("mine\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit, match=r"model holds notes.txt, which this command does not "
                       r"write; --force replaces only what it writes"):  # fmt: skip
        export_main(["ct2", ckpt, str(out), "--force"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.mark.slow
def test_exported_readme_translates_as_our_greedy_search(trained, exported) -> None:
    block = re.search(r"```python\n(.*?)```", (exported / "README.md").read_text(), re.S)[1]
    scope: dict = {}
    exec(block.replace("MODEL_DIR", str(exported)), scope)
    lines = (trained[1] / "test.en").read_text().splitlines()[:40]
    ours, _ = ours_and_theirs(trained, exported, DecodeOptions(strategy="greedy"), lines)
    assert scope["translate"](lines, beam_size=1) == [t[0].text for t in ours]


# -- evaluate.py engine=ctranslate2 ------------------------------------------------------


def evaluate_with(overrides: list[str], out_dir: Path) -> dict:
    return evaluate(compose_eval_cfg(overrides, out_dir))


@pytest.mark.slow
def test_evaluate_scores_an_exported_directory_as_its_checkpoint(trained, exported, tmp_path):
    ours = evaluate_with([f"ckpt_path={trained[0][-1]}", "decode=greedy"], tmp_path / "torch")
    theirs = evaluate_with(
        [f"ckpt_path={exported}", "engine=ctranslate2", "decode=greedy"], tmp_path / "ct2"
    )
    hyps = [(tmp_path / d / "hypotheses.txt").read_text() for d in ("torch", "ct2")]
    assert hyps[0] == hyps[1] and len(hyps[0].splitlines()) == 100
    assert theirs["bleu"] == ours["bleu"] > 20 and theirs["chrf"] == ours["chrf"]
    assert (theirs["engine"], ours["engine"]) == ("ctranslate2", "torch")
    assert theirs["dtype"] == "float32" and theirs["translate_seconds"] > 0
    assert theirs["checkpoints"] == [str(exported)]


@pytest.mark.slow
def test_evaluate_engine_ctranslate2_refuses_what_it_cannot_do(trained, exported, tmp_path):
    ct2 = [f"ckpt_path={exported}", "engine=ctranslate2"]
    with pytest.raises(ConfigError, match="analysis=heads reads our model's attention"):
        evaluate_with([*ct2, "analysis=heads"], tmp_path)
    with pytest.raises(ConfigError, match="dtype=bfloat16 is for engine=torch"):
        evaluate_with([*ct2, "dtype=bfloat16"], tmp_path)
    with pytest.raises(ConfigError, match="needs ckpt_path=DIR"):
        evaluate_with([f"ckpt_path={trained[0][-1]}", "engine=ctranslate2"], tmp_path)
    with pytest.raises(CheckpointError, match="holds no transformer_nmt.json"):
        evaluate_with([f"ckpt_path={tmp_path}", "engine=ctranslate2"], tmp_path)
    with pytest.raises(ConfigError, match="engine=onnx: choose torch or ctranslate2"):
        evaluate_with([f"ckpt_path={trained[0][-1]}", "engine=onnx"], tmp_path)


def test_a_multilingual_models_readme_names_its_target_tokens() -> None:
    data = {  # as a checkpoint records the data settings
        "source": "multi30k", "root": "data/multi30k", "src_lang": "en", "tgt_lang": "de",
        "target_token": True, "corpora": [{}, {"tgt_lang": "fr"}],
    }  # fmt: skip
    assert ct2_readme.target_tokens(data) == ["<2de>", "<2fr>"]
    readme = ct2_readme.usage(256, DecodeOptions(), ["<2de>", "<2fr>"])
    assert "put one of <2de>, <2fr> before each source" in readme
    assert ct2_readme.target_tokens({"tgt_lang": "de"}) == []
    user = ["<bt>", ">>fra<<", ">>deu<<"]  # a source tokenizer's user-defined pieces
    assert ct2_readme.target_tokens({"tgt_lang": None}, user) == [">>fra<<", ">>deu<<"]
    assert "several languages" not in ct2_readme.usage(256, DecodeOptions())
    # fine-tuned with a token given as it is: its own, and those the model came with, once each
    tuned = {**data, "target_token": ">>deu<<", "corpora": None}
    assert ct2_readme.target_tokens(tuned) == [">>deu<<"]
    assert ct2_readme.target_tokens(tuned, user) == [">>fra<<", ">>deu<<"]
    readme = ct2_readme.usage(256, DecodeOptions(), [">>deu<<"])
    assert "This model was trained with >>deu<<: put it before each source" in readme


# -- target prefixes: ours equal CTranslate2's target_prefix ------------------------------


def prefixed_lines(trained) -> tuple[list[str], list[str]]:
    """The test sources, each with the first 0-3 words of the reference of the line before as
    its prefix (a start the model would not choose)."""
    corpus = trained[1]
    src = (corpus / "test.en").read_text().splitlines()
    tgt = (corpus / "test.de").read_text().splitlines()
    return src, [" ".join(tgt[i - 1].split()[: i % 4]) for i in range(len(tgt))]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_prefixed_translations_equal_ctranslate2s_target_prefix(trained, exported, strategy):
    """Through CT2Translator (``translate_batch(..., target_prefix=...)``), bans included: the
    same translations, each starting with its prefix, many changed by it."""
    lines, prefixes = prefixed_lines(trained)
    options = DecodeOptions(strategy=strategy, **({"beam_size": 4} if strategy == "beam" else {}))
    ckpt = load_checkpoint(trained[0][-1])
    ours = Translator(model_from_checkpoint(ckpt), *tokenizers(ckpt, trained[0][-1]))
    theirs = CT2Translator(exported, threads=1)
    forced = ours.translate(lines, options, prefixes=prefixes)
    assert [t[0].text for t in theirs.translate(lines, options, prefixes=prefixes)] == [
        t[0].text for t in forced
    ]
    assert all(t[0].text.startswith(p) for t, p in zip(forced, prefixes, strict=True))
    free = ours.translate(lines, options)
    assert sum(f[0].text != t[0].text for f, t in zip(forced, free, strict=True)) > 20


@pytest.mark.slow
def test_prefixed_beam_scores_equal_ctranslate2s(trained, exported) -> None:
    """min_len=0 and no banned ids (as above): the 3 best hypotheses and their scores equal
    CTranslate2's, which leave out the prefix's log-probabilities (decode.score_prefix=false)
    and divide by the whole length, prefix included. (Not with len_penalty=0, where CTranslate2
    stops a sentence once its best candidate ends, with or without prefixes.)"""
    lines, prefixes = prefixed_lines(trained)
    options = DecodeOptions(beam_size=5, nbest=3, min_len=0, len_penalty=0.6)
    ckpt = load_checkpoint(trained[0][-1])
    ours = Translator(model_from_checkpoint(ckpt), *tokenizers(ckpt, trained[0][-1]))
    out = ours.translate(lines, options, prefixes=prefixes)
    theirs = CT2Translator(exported, threads=1)
    kwargs = ct2_translate.search_kwargs(options, "<pad>", "<s>")
    del kwargs["suppress_sequences"]
    tok, src_tok = theirs.tgt_tokenizer, theirs.src_tokenizer
    for line, prefix, o in zip(lines, prefixes, out, strict=True):
        pieces = [src_tok.pieces(src_tok.encode(line))]
        limit = math.floor(1.2 * (len(pieces[0]) + 1)) + 10
        target = [tok.pieces(tok.encode(prefix))] if prefix else None  # (as CT2Translator)
        r = theirs.translator.translate_batch(
            pieces, target_prefix=target, max_decoding_length=limit, **kwargs
        )[0]
        texts = [tok.decode(theirs.tgt_ids[p] for p in hyp) for hyp in r.hypotheses]
        assert texts == [h.text for h in o]
        assert r.scores == pytest.approx([h.score for h in o], abs=1e-5)


@pytest.mark.slow
def test_evaluate_engine_ctranslate2_translates_an_input_file_as_ours(trained, exported, tmp_path):
    source = tmp_path / "source.txt"
    source.write_text("".join(line + "\n" for line in sentence_pairs(20, seed=9)[0]))
    ours = [f"ckpt_path={trained[0][-1]}", f"input={source}", "decode=greedy"]
    evaluate_with([*ours, f"output={tmp_path / 'ours.txt'}"], tmp_path / "torch")
    theirs = [f"ckpt_path={exported}", "engine=ctranslate2", f"input={source}", "decode=greedy"]
    evaluate_with([*theirs, f"output={tmp_path / 'theirs.txt'}"], tmp_path / "ct2")
    written = [(tmp_path / name).read_text() for name in ("ours.txt", "theirs.txt")]
    assert written[0] == written[1] and len(written[0].splitlines()) == 20
