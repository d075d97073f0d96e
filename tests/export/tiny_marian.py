"""A tiny OPUS-MT-like MarianMT directory, written with transformers: random weights, SentencePiece
models trained on made-up source and target text, vocab.json from their pieces with Marian's
special ids (eos 0, unk 1, pad last, the decoder starting from pad)."""

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
        model.model.shared.weight[pad] = 0.0
        bias = model.final_logits_bias  # (1, V), a buffer
        bias.copy_(0.5 * torch.randn(bias.shape, generator=g))
        bias[0, eos] = eos_bias


def write_marian_dir(
    out: Path, activation: str = "swish", codes: tuple[str, ...] = (), eos_bias: float = 5.0
) -> Path:
    """The MarianMT directory (model.safetensors, config.json, source.spm, target.spm,
    vocab.json, tokenizer_config.json, generation_config.json) at ``out``; ``codes``: a
    multilingual model's target-language tokens (``>>fra<<``), in vocab.json and in neither
    SentencePiece model, as OPUS-MT's."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    src_text, tgt_text = data_pairs(400, seed=11)
    spms = {"source.spm": spm_model(src_text, 60), "target.spm": spm_model(tgt_text, 60)}
    out.mkdir(parents=True)
    words = dict.fromkeys(p for m in spms.values() for p in pieces(m) if p != DROPPED)
    words |= dict.fromkeys(codes)
    vocab = {"</s>": 0, "<unk>": 1} | {p: i + 2 for i, p in enumerate(words)}
    vocab["<pad>"] = pad = len(vocab)
    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp)
        for name, model in spms.items():
            (files / name).write_bytes(model)
        (files / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
        tokenizer = MarianTokenizer(
            str(files / "source.spm"), str(files / "target.spm"), str(files / "vocab.json"),
            source_lang="en", target_lang="de",
        )  # fmt: skip
        tokenizer.save_pretrained(out)
    config = MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, activation_function=activation, scale_embedding=True,
        max_position_embeddings=64, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=0, dropout=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config)
    randomize(model, pad, eos=0, eos_bias=eos_bias)
    model.generation_config.bad_words_ids = [[pad]]
    model.save_pretrained(out)
    return out
