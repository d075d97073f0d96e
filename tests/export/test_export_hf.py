"""Export to a Hugging Face MarianMT directory (``python -m transformer.export hf``): a tiny
post-norm model trained here loads with AutoModelForSeq2SeqLM and AutoTokenizer and computes our
logits (within 1e-4) and greedy translations; an imported OPUS-MT-like model goes import ->
export -> import unchanged, and a model with a vocabulary per side comes back with its pieces and
logits; what MarianMTModel does not compute is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.export.test_export_ct2 import pad, sentence_pairs, sentencepiece_model, train
from tests.export.tiny_marian import write_marian_dir
from transformer import Transformer, TransformerConfig
from transformer.checkpoints import load_checkpoint, model_from_checkpoint
from transformer.checkpoints import tokenizers_from_checkpoint as tokenizers
from transformer.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError
from transformer.export.__main__ import main as export_main
from transformer.export.hf import export_hf
from transformer.export.hf_import import import_marian
from transformer.export.hf_import import main as import_main
from transformer.translate import Translator

transformers = pytest.importorskip("transformers", reason="the reference: pip install transformers")


def trained_checkpoint(path: Path, steps: int = 150, **options) -> Path:
    """A tiny model (post-norm unless ``options`` say otherwise) trained ``steps`` updates on
    the word-by-word corpus of the CTranslate2 tests, in train.py's checkpoint format."""
    en, de = sentence_pairs(1000, 0)
    proto = sentencepiece_model(en + de)
    tok = Tokenizer("joint.model", model_proto=proto)
    shape = dict(d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64)
    cfg = TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, max_positions=64,
        dropout=0.0, share_all_embeddings=True, **(dict(norm_first=False) | shape | options),
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg)
    for _ in train(model, tok, en, de, steps):
        pass
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save(
        {
            "hyper_parameters": {"model": cfg.to_dict()},
            "state_dict": state,
            "datamodule_hyper_parameters": {"src_lang": "en", "tgt_lang": "de"},
            "tokenizers": {s: {"name": "joint.model", "model": proto} for s in ("src", "tgt")},
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def post_norm(tmp_path_factory) -> tuple[Path, Path]:
    """A trained post-norm checkpoint and its MarianMT directory (written by the command)."""
    root = tmp_path_factory.mktemp("hf")
    ckpt = trained_checkpoint(root / "post-norm.ckpt")
    export_main(["hf", str(ckpt), str(root / "marian")])
    return ckpt, root / "marian"


def test_the_directory_loads_with_auto_classes_and_computes_our_logits(post_norm) -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    ckpt, out = post_norm
    hf = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "MarianMTModel" and type(tok).__name__ == "MarianTokenizer"
    translator = Translator(model_from_checkpoint(load_checkpoint(ckpt)), *tokenizers(
        load_checkpoint(ckpt), ckpt
    ))  # fmt: skip
    en, de = sentence_pairs(6, 5)
    enc = tok(en, text_target=de, return_tensors="pt", padding=True)
    src = [translator.src_tokenizer.encode(line) + [EOS_ID] for line in en]
    assert enc["input_ids"].tolist() == pad(src).tolist()  # our ids, pad 0
    tgt = [[BOS_ID, *translator.tgt_tokenizer.encode(line)] for line in de]
    with torch.no_grad():
        ours = translator.model(pad(src), pad(tgt))
        theirs = hf(
            input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
            decoder_input_ids=pad(tgt),
        ).logits  # fmt: skip
    for row, t in enumerate(tgt):
        assert (ours[row, : len(t)] - theirs[row, : len(t)]).abs().max() < 1e-4


def test_generate_translates_as_our_greedy_search(post_norm) -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    ckpt, out = post_norm
    hf = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    translator = Translator(model_from_checkpoint(load_checkpoint(ckpt)), *tokenizers(
        load_checkpoint(ckpt), ckpt
    ))  # fmt: skip
    en = sentence_pairs(40, 7)[0]
    b = 20
    options = DecodeOptions(strategy="greedy", max_len_a=0.0, max_len_b=b, min_len=0)
    ours = [t[0].text for t in translator.translate(en, options)]
    generated = hf.generate(
        **tok(en, return_tensors="pt", padding=True),
        num_beams=1,
        do_sample=False,
        max_length=b + 2,
    )  # fmt: skip (the generation config's: bos to start, pad and bos banned, eos forced)
    assert tok.batch_decode(generated, skip_special_tokens=True) == ours
    assert len(set(ours)) > 30  # real translations, different ones


@pytest.mark.parametrize(
    "codes, separate",
    [((), False), ((">>fra<<", ">>deu<<"), False), ((), True)],
    ids=["bilingual", "multilingual", "separate-vocabularies"],
)
def test_import_export_import_keeps_the_model(tmp_path, codes, separate) -> None:
    """An imported OPUS-MT-like model exported and imported again: the same config, weights,
    tokenizers and logits (its added bos, the piece vocab.json lacked, a multilingual model's
    target-language tokens and a separate target vocabulary stay what they were)."""
    marian = write_marian_dir(tmp_path / "opus-mt-tiny", codes=codes, separate=separate)
    import_main([str(marian), str(tmp_path / "one.ckpt")])
    export_main(["hf", str(tmp_path / "one.ckpt"), str(tmp_path / "exported")])
    once, twice = load_checkpoint(tmp_path / "one.ckpt"), import_marian(tmp_path / "exported")
    assert twice["hyper_parameters"] == once["hyper_parameters"]
    assert twice["tokenizers"] == once["tokenizers"]
    for key, value in once["state_dict"].items():
        torch.testing.assert_close(twice["state_dict"][key], value, rtol=0, atol=0)
    a, b = (model_from_checkpoint(c).eval() for c in (once, twice))
    src, tgt = torch.tensor([[5, 9, 12, EOS_ID]]), torch.tensor([[BOS_ID, 7, 30]])
    assert a(src, tgt).equal(b(src, tgt))


def test_a_model_with_a_vocabulary_per_side_comes_back_from_its_export(tmp_path) -> None:
    """A model as ``data.joint_vocab=false`` trains it (a SentencePiece model and an embedding
    per side) exported and imported again: each side's pieces in the same ids, and the same
    logits over the target's ids (the import fills the shorter vocabulary with ids of its own)."""
    en, de = sentence_pairs(1000, 0)
    protos = {"src": sentencepiece_model(en), "tgt": sentencepiece_model(de)}
    toks = {side: Tokenizer(f"{side}.model", model_proto=m) for side, m in protos.items()}
    assert toks["src"].pieces(range(4, 20)) != toks["tgt"].pieces(range(4, 20))
    cfg = TransformerConfig(
        src_vocab_size=toks["src"].vocab_size, tgt_vocab_size=toks["tgt"].vocab_size,
        d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64,
        max_positions=64, norm_first=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    torch.save(
        {
            "hyper_parameters": {"model": cfg.to_dict()},
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "datamodule_hyper_parameters": {"src_lang": "en", "tgt_lang": "de"},
            "tokenizers": {s: {"name": f"{s}.model", "model": m} for s, m in protos.items()},
        },
        tmp_path / "two.ckpt",
    )
    export_main(["hf", str(tmp_path / "two.ckpt"), str(tmp_path / "exported")])
    again = import_marian(tmp_path / "exported")
    assert again["hyper_parameters"]["model"]["share_all_embeddings"] is False
    back = {s: Tokenizer(e["name"], model_proto=e["model"]) for s, e in again["tokenizers"].items()}
    texts = {"src": en[0], "tgt": de[0]}
    for side, tok in toks.items():
        assert back[side].pieces(range(tok.vocab_size)) == tok.pieces(range(tok.vocab_size))
        assert back[side].encode(texts[side]) == tok.encode(texts[side])
    imported = model_from_checkpoint(again).eval()
    src = torch.tensor([toks["src"].encode(en[1]) + [EOS_ID]])  # (1, S)
    tgt = torch.tensor([[BOS_ID, *toks["tgt"].encode(de[1])]])  # (1, T)
    with torch.no_grad():
        want, got = model(src, tgt), imported(src, tgt)
    torch.testing.assert_close(got[..., : cfg.tgt_vocab_size], want, rtol=0, atol=1e-5)


def test_what_marian_does_not_compute_is_refused_by_name(tmp_path) -> None:
    pre_norm = trained_checkpoint(tmp_path / "pre-norm.ckpt", steps=1, norm_first=True)
    with pytest.raises(ConfigError, match=r"model\.norm_first=True has no MarianMTModel"):
        export_hf([pre_norm], tmp_path / "out")
    with pytest.raises(SystemExit) as exited:  # the command: one line
        export_main(["hf", str(pre_norm), str(tmp_path / "out")])
    message = str(exited.value.code)
    assert message.startswith("error: model.norm_first=True") and len(message.splitlines()) == 1
    assert not (tmp_path / "out").exists()
    for options, name in (
        ({"positions": "rope"}, r"model\.positions='rope'"),
        ({"num_kv_heads": 2}, r"model\.num_kv_heads=2 \(grouped-query attention\)"),
        ({"bias": False}, r"model\.bias=False"),
    ):
        path = trained_checkpoint(tmp_path / "other.ckpt", steps=1, **options)
        with pytest.raises(ConfigError, match=name):
            export_hf([path], tmp_path / "out")
