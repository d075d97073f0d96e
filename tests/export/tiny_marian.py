"""A tiny OPUS-MT-like MarianMT directory, written with transformers: random weights, SentencePiece
models trained on made-up source and target text, vocab.json from their pieces with Marian's
special ids (eos 0, unk 1, pad last, the decoder starting from pad); or, with separate
vocabularies, vocab.json from the source's pieces and target_vocab.json from the target's, of one
size as Marian's converter makes them."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import sentencepiece as spm
import torch

from tests.tiny import data_pairs

DROPPED = "▁sitzt"  # a target piece left out of vocab.json: MarianTokenizer reads it as unk


def spm_model(texts: list[str], vocab_size: int) -> bytes:
    """A unigram model with SentencePiece's default ids (unk 0, <s> 1, </s> 2), as OPUS-MT's."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


def pieces(model: bytes) -> list[str]:
    sp = spm.SentencePieceProcessor(model_proto=model)
    normal = range(sp.get_piece_size())
    return [sp.id_to_piece(i) for i in normal if not (sp.is_control(i) or sp.is_unknown(i))]


def randomize(model: torch.nn.Module, pad: int, eos: int, eos_bias: float) -> None:
    """Weights far from initialisation (layer norms and biases too: a mapping that mixed them up
    would show), a zero padding row as Hugging Face keeps it, and an output bias that lets beam
    search finish hypotheses before the length limit."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                start = 1.0 if name.endswith("weight") else 0.0
                p.copy_(start + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.normal_(0.0, 0.2, generator=g)
        for embedding in {model.model.encoder.embed_tokens, model.model.decoder.embed_tokens}:
            embedding.weight[pad] = 0.0
        bias = model.final_logits_bias  # (1, V), a buffer
        bias.copy_(0.5 * torch.randn(bias.shape, generator=g))
        bias[0, eos] = eos_bias


def marian_vocab(words: list[str]) -> dict[str, int]:
    """Marian's numbering of ``words``: eos 0, unk 1, the words, pad last."""
    vocab = {"</s>": 0, "<unk>": 1} | {p: i + 2 for i, p in enumerate(words)}
    return vocab | {"<pad>": len(vocab)}


def write_marian_dir(
    out: Path,
    activation: str = "swish",
    codes: tuple[str, ...] = (),
    eos_bias: float = 5.0,
    separate: bool = False,
) -> Path:
    """The MarianMT directory (model.safetensors, config.json, source.spm, target.spm,
    vocab.json, tokenizer_config.json, generation_config.json) at ``out``; ``codes``: a
    multilingual model's target-language tokens (``>>fra<<``), in vocab.json and in neither
    SentencePiece model, as OPUS-MT's; ``separate``: target_vocab.json too, the source's pieces
    in vocab.json and the target's there (the shorter list filled with pieces that neither model
    produces, so that pad is the last id of both), and an embedding for each side."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    src_text, tgt_text = data_pairs(400, seed=11)
    spms = {"source.spm": spm_model(src_text, 60), "target.spm": spm_model(tgt_text, 60)}
    out.mkdir(parents=True)
    words = {
        name: [*dict.fromkeys(p for p in pieces(model) if p != DROPPED)]
        for name, model in spms.items()
    }
    if separate:
        src_words, tgt_words = [*words["source.spm"], *codes], words["target.spm"]
        width = max(len(src_words), len(tgt_words))
        src_words += [f"▁src{i}" for i in range(width - len(src_words))]
        tgt_words += [f"▁tgt{i}" for i in range(width - len(tgt_words))]
        vocab, target_vocab = marian_vocab(src_words), marian_vocab(tgt_words)
    else:
        vocab = marian_vocab([*dict.fromkeys([*words["source.spm"], *words["target.spm"]]), *codes])
    pad = vocab["<pad>"]
    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp)
        for name, model in spms.items():
            (files / name).write_bytes(model)
        (files / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
        target = files / "target_vocab.json"
        if separate:
            target.write_text(json.dumps(target_vocab, ensure_ascii=False))
        tokenizer = MarianTokenizer(
            str(files / "source.spm"), str(files / "target.spm"), str(files / "vocab.json"),
            str(target) if separate else None, source_lang="en", target_lang="de",
            separate_vocabs=separate,
        )  # fmt: skip
        tokenizer.save_pretrained(out)
    config = MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=32, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function=activation,
        scale_embedding=True, max_position_embeddings=64, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=0, dropout=0.1,
        share_encoder_decoder_embeddings=not separate,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config)
    randomize(model, pad, eos=0, eos_bias=eos_bias)
    model.generation_config.bad_words_ids = [[pad]]
    model.save_pretrained(out)
    return out
