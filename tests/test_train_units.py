"""Unit tests of the training pieces: schedule, parameter groups, loss, metrics, greedy decoding."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from transformer.config import TransformerConfig
from transformer.lit_module import label_smoothed_loss
from transformer.metrics import score_translations
from transformer.model import Transformer
from transformer.optim import (
    build_optimizer,
    inverse_sqrt_factor,
    param_groups,
    warmup_inverse_sqrt,
)


def tiny_model(**kw) -> Transformer:
    base = dict(
        src_vocab_size=20, tgt_vocab_size=20, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=64, dropout=0.0,
    )  # fmt: skip
    return Transformer(TransformerConfig(**{**base, **kw}))


def test_schedule_warms_up_linearly_then_decays_as_inverse_sqrt():
    w = 100
    assert inverse_sqrt_factor(0, w) == pytest.approx(1 / w)
    assert inverse_sqrt_factor(49, w) == pytest.approx(0.5)
    assert inverse_sqrt_factor(w - 1, w) == pytest.approx(1.0)
    assert inverse_sqrt_factor(4 * w - 1, w) == pytest.approx(0.5)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = warmup_inverse_sqrt(opt, warmup_steps=4)
    lrs = []
    for _ in range(8):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert lrs[7] == pytest.approx(2.0 * math.sqrt(4 / 8))


def test_weight_decay_only_on_weight_matrices():
    model = tiny_model(tie_output_embeddings=True)
    decay, no_decay = param_groups(model, 0.1)
    embeddings = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    ids_decay = {id(p) for p in decay["params"]}
    assert embeddings and not any(id(e) in ids_decay for e in embeddings)
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 or p.shape[0] == 20 for p in no_decay["params"])  # vectors, embeddings
    assert model.output.weight.data_ptr() not in {p.data_ptr() for p in decay["params"]}
    n_params = len(list(model.parameters()))
    assert len(decay["params"]) + len(no_decay["params"]) == n_params
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    opt = build_optimizer(model, partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1), 0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_label_smoothed_loss_matches_torch_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.tensor([[4, 5, 6, 3, 0], [7, 3, 0, 0, 0]])
    loss, nll, n = label_smoothed_loss(logits, labels, 0.1, pad_id=0)
    ref = F.cross_entropy(
        logits.view(-1, 11), labels.view(-1), ignore_index=0, label_smoothing=0.1, reduction="sum"
    )
    ref_nll = F.cross_entropy(logits.view(-1, 11), labels.view(-1), ignore_index=0, reduction="sum")
    assert n == 6
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref_nll)


def test_scores_and_signatures():
    hyps = ["The cat sat on the mat.", "A dog runs."]
    refs = ["The cat sat on the mat.", "a dog runs."]
    s = score_translations(hyps, refs)
    assert 0 < s.bleu < 100 and s.bleu_lc == pytest.approx(100.0)
    assert "case:lc" in s.bleu_lc_signature and "tok:13a" in s.bleu_signature
    assert s.chrf_signature.startswith("nrefs:1") and s.num_sentences == 2
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_translations(hyps, refs[:1])
