"""Word alignments from cross-attention: on a model built so that its attention is known, and the
merge of pieces into words against a brute-force computation."""

import random

import pytest
import torch

from transformer import Transformer, TransformerConfig
from transformer.decoding.alignment import cross_attention, format_alignment, word_alignment
from transformer.errors import ConfigError

PAD, BOS = 0, 2
TOKENS = range(4, 20)  # the ids the constructed model tells apart: 16, one per key dimension


def attending_model(layers: dict[int, list[tuple[dict[int, int], float]]]) -> Transformer:
    """A 2+2-layer, 2-head model whose decoder layer l, head h, sends the query of input token a
    to the source token ``f[a]`` for each ``(f, sharpness)`` in ``layers[l]`` (one per head);
    other layers attend at random.

    Every sublayer's output is zeroed, so each layer's input is the token embedding (30 x a unit
    vector per id; the sinusoids hardly move it) and the encoder's output its layer norm. Key
    dimension ``a - 4`` of each head then reads token a, and the head's queries map a to ``f[a]``
    there: the scores of the keys holding ``f[a]`` exceed all others by ~8 x sharpness^2.
    """
    sizes = dict(d_model=32, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=32)
    cfg = TransformerConfig(32, 32, **sizes, dropout=0.0, share_all_embeddings=True)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.src_embed.tokens.weight.copy_(30 * torch.eye(32))
        model.src_embed.tokens.weight[PAD] = 0
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            attns = [layer.self_attn] + ([layer.cross_attn] if hasattr(layer, "cross_attn") else [])
            for attn in attns:
                attn.out_proj.weight.zero_()
            layer.ffn.fc2.weight.zero_()
        for index, heads in layers.items():
            attn = model.decoder.layers[index].cross_attn
            attn.q_proj.weight.zero_()
            attn.kv_proj.weight[:32].zero_()  # the keys; values do not matter
            for h, (f, sharpness) in enumerate(heads):
                for a in TOKENS:
                    attn.kv_proj.weight[16 * h + a - 4, a] = sharpness
                for a, b in f.items():
                    attn.q_proj.weight[16 * h + b - 4, a] = sharpness
    return model


def permutation(seed: int) -> dict[int, int]:
    """A map of each query input (bos, and TOKENS but the first) to a distinct token of TOKENS."""
    targets = list(TOKENS)
    random.Random(seed).shuffle(targets)
    return dict(zip([BOS, *TOKENS[1:]], targets, strict=True))


def expected(f: dict[int, int], src: list[int], tgt_in: list[int]) -> list[tuple[int, int]]:
    """Target piece i (predicted at input i) aligned to the source position holding f[input]."""
    return [(src.index(f[a]), i) for i, a in enumerate(tgt_in)]


def test_alignment_follows_the_known_attention_of_the_chosen_layer_and_head() -> None:
    f0, f1, g = permutation(0), permutation(1), permutation(2)
    model = attending_model({1: [(f0, 3.0), (f1, 0.5)], 0: [(g, 3.0), (g, 3.0)]})
    src = list(TOKENS)
    random.Random(3).shuffle(src)
    tgt_in = [BOS, 7, 12, 5, 19, 7, 9]  # inputs: bos and TOKENS but 4
    words = list(range(len(tgt_in)))  # one piece a word
    for layer, head, f in [(-1, 0, f0), (1, 1, f1), (-1, None, f0), (0, None, g), (0, 1, g)]:
        weights = cross_attention(model, torch.tensor([src]), torch.tensor([tgt_in]), layer, head)
        assert word_alignment(weights[0], words, list(range(len(src)))) == expected(f, src, tgt_in)
    sharp = cross_attention(model, torch.tensor([src]), torch.tensor([tgt_in]), -1, 0)[0]
    assert sharp.max(-1).values.min() > 0.999  # the construction holds: one-hot rows
    soft = cross_attention(model, torch.tensor([src]), torch.tensor([tgt_in]), -1, 1)[0]
    assert soft.max(-1).values.max() < 0.9


def test_an_ensemble_aligns_on_its_models_mean_attention_and_bad_choices_are_named() -> None:
    f0, f1 = permutation(0), permutation(1)
    a = attending_model({1: [(f0, 3.0), (f0, 3.0)]})
    b = attending_model({1: [(f1, 3.0), (f1, 3.0)]})
    src, tgt_in = torch.tensor([list(TOKENS)]), torch.tensor([[BOS, 5, 6]])
    both = cross_attention([a, b], src, tgt_in)
    torch.testing.assert_close(
        both, (cross_attention(a, src, tgt_in) + cross_attention(b, src, tgt_in)) / 2
    )
    with pytest.raises(ConfigError, match=r"decode\.alignment_layer=2, but the model has 2"):
        cross_attention(a, src, tgt_in, layer=2)
    with pytest.raises(
        ConfigError, match=r"decode\.alignment_head=2, but the model's layers have 2"
    ):
        cross_attention(a, src, tgt_in, head=2)


def random_words(pieces: int, rng: random.Random) -> list[int]:
    """Each piece's word: 0 for the first, then the same word or the next one."""
    words = [0]
    for _ in range(pieces - 1):
        words.append(words[-1] + (rng.random() < 0.5))
    return words


def test_pieces_merge_into_words_as_sums_over_keys_and_means_over_queries() -> None:
    rng = random.Random(0)
    for _ in range(20):
        T, S = rng.randint(1, 8), rng.randint(1, 8)
        weights = torch.tensor([[rng.random() for _ in range(S)] for _ in range(T)])
        tgt_words, src_words = random_words(T, rng), random_words(S, rng)
        brute = []
        for t in range(tgt_words[-1] + 1):
            rows = [i for i, w in enumerate(tgt_words) if w == t]
            totals = [
                sum(float(weights[i, j]) for i in rows for j, v in enumerate(src_words) if v == s)
                / len(rows)
                for s in range(src_words[-1] + 1)
            ]
            brute.append((totals.index(max(totals)), t))
        assert word_alignment(weights, tgt_words, src_words) == brute
    assert word_alignment(torch.zeros(0, 3), [], [0, 1, 2]) == []
    assert format_alignment([(0, 0), (2, 1)]) == "0-0 2-1"
