"""bench/bench_train.py: the FLOP formula by hand, the batches, a tiny CPU run of each system."""

import importlib.util

import pytest
import torch

from bench.bench_train import main, make_batches, matrix_params, model_config, train_flops
from bench.common import logits_loss, own_loss
from transformer import Transformer, TransformerConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

TINY_RUN = ["--model", "tiny", "--device", "cpu", "--tokens", "1000", "--warmup", "1"]
TINY_RUN += ["--steps", "1", "--peak-tflops", "1", "--full-logits-too"]


@pytest.fixture(scope="module")
def result():
    return main(TINY_RUN)


def test_flops_of_a_one_layer_model_by_hand() -> None:
    cfg = TransformerConfig(
        10, 10, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16
    )
    src_lens, tgt_lens = [3, 5], [4, 2]
    n_enc = 4 * 8 * 8 + 2 * 8 * 16  # Q, K, V, output; FFN in and out: 512
    n_dec = 4 * 8 * 8 + 2 * 8 * 8 + 2 * 8 * 16 + 8 * 10  # + cross Q, output; + output proj: 720
    n_kv = 2 * 8 * 8  # cross-attention K and V, on source tokens: 128
    dense = 6 * (n_enc * 8 + n_kv * 8 + n_dec * 6)  # S = 8, T = 6: 56,640
    pairs = (9 + 25) + (10 + 3) + (3 * 4 + 5 * 2)  # encoder s^2, causal t(t+1)/2, cross s*t: 69
    assert dense + 12 * 8 * pairs == 63_264
    assert train_flops(cfg, src_lens, tgt_lens) == 63_264


def test_counted_matrices_are_the_models_weight_matrices() -> None:
    cfg = model_config("tiny", None, 0.1)
    model = Transformer(cfg)
    n_enc, n_dec, n_kv = matrix_params(cfg)
    assert n_enc == sum(p.numel() for p in model.encoder.parameters() if p.dim() == 2)
    decoder = sum(p.numel() for p in model.decoder.parameters() if p.dim() == 2)
    assert n_dec + n_kv == decoder + model.output.weight.numel()


def test_batches_are_bucketed_within_the_budget() -> None:
    batches = make_batches(4, 1000, 100, (10, 60), multiple=8)
    assert len(batches) == 4
    real, total = 0, 0
    for src, tgt_in, labels in batches:
        assert src.numel() <= 1000 and labels.numel() <= 1000 and src.size(1) % 8 == 0
        assert tgt_in[:, 0].eq(BOS_ID).all() and tgt_in.ne(PAD_ID).eq(labels.ne(PAD_ID)).all()
        lengths = labels.ne(PAD_ID).sum(1)
        assert labels[torch.arange(len(labels)), lengths - 1].eq(EOS_ID).all()
        assert lengths.min() >= 10 and lengths.max() <= 60
        real, total = real + int(lengths.sum()), total + labels.numel()
    assert real / total > 0.75  # length bucketing keeps padding small


def test_tiny_run_times_every_system(result) -> None:
    rows = {r.name: r for r in result.rows}
    assert {"ours", "ours, full logits", "torch.nn.Transformer"} <= set(rows)
    for r in rows.values():
        assert r.tokens_per_s > 0 and r.tflops > 0 and r.mfu > 0
        assert r.peak_memory_mib is None  # CPU: n/a
        assert (r.ratio is None) == (r.name == "ours")
    assert rows["torch.nn.Transformer"].ratio > 0
    installed = importlib.util.find_spec("eole") is not None
    assert ("eole" in rows) == installed
    assert ("eole: not installed (pip install eole)" in result.notes) != installed


def test_ours_own_loss_is_the_peers_loss_on_the_same_batch() -> None:
    """The bench gives ours its own training loss and the peers torch's cross entropy on full
    logits: the same objective, so the two timings compare like with like."""
    cfg = model_config("tiny", None, 0.0)
    model = Transformer(cfg)
    batch = make_batches(1, 1000, cfg.tgt_vocab_size, (10, 60), 1)[0]
    n = int(batch[2].ne(PAD_ID).sum())
    own = own_loss(model, model, 0.1)(batch, n)
    torch.testing.assert_close(own, logits_loss(model, 0.1)(batch, n))


def test_marian_is_compared_when_transformers_is_installed(result) -> None:
    reason = "MarianMTModel needs transformers, in the `bench` extra: pip install -e '.[bench]'"
    pytest.importorskip("transformers", reason=reason)
    rows = {r.name: r for r in result.rows}
    assert rows["MarianMTModel"].tokens_per_s > 0 and rows["MarianMTModel"].ratio > 0


def test_eole_model_has_our_sizes_and_interface() -> None:
    pytest.importorskip("eole", reason="eole is not installed (pip install eole)")
    from bench.common import EoleLogits

    cfg = model_config("tiny", None, dropout=0.1)
    eole, ours = EoleLogits(cfg), Transformer(cfg)
    count = sum(p.numel() for p in eole.parameters())
    assert abs(count - sum(p.numel() for p in ours.parameters())) / count < 0.02
    batch = make_batches(1, 500, cfg.tgt_vocab_size, (10, 20), multiple=1)[0]
    src, tgt_in, _ = batch
    assert eole(src, tgt_in).shape == (*tgt_in.shape, cfg.tgt_vocab_size)
