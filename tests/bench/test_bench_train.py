"""bench/bench_train.py: the FLOP formula by hand, the batches, and its dry run: a warm pass over
every timed shape, a fixed order and its reverse, totals and percentiles from the steps it keeps,
the attention backend that ran."""

import importlib.util
import json

import numpy as np
import pytest
import torch

from bench import bench_train
from bench.bench_train import main, make_batches, matrix_params, model_config, train_flops
from bench.common import logits_loss, own_loss, train_step
from transformer import Transformer, TransformerConfig
from transformer.data.synthetic import write_corpus
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

pytestmark = pytest.mark.bench  # a script of bench/ or dev/


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """The dry run (tiny, CPU) with ours on full logits too, its steps kept, and the shapes of
    the batches every training step really got, in call order."""
    out = tmp_path_factory.mktemp("bench") / "steps.json"
    shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def spy(loss, opt, batch, num_labels, autocast):
        shapes.append((tuple(batch[0].shape), tuple(batch[2].shape)))
        return train_step(loss, opt, batch, num_labels, autocast)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench_train, "train_step", spy)
        result = main(["--dry-run", "--full-logits-too", "--out", str(out)])
    return result, shapes, json.loads(out.read_text())


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


@pytest.mark.slow
def test_corpus_batches_go_on_into_the_next_epochs_when_one_is_too_short(tmp_path) -> None:
    # Multi30k at base's 25,000 tokens is 25 batches an epoch, fewer than 50 timed ones.
    root = write_corpus(tmp_path / "corpus", {"train": 60, "val": 8, "test_2016_flickr": 8}, ".gz")
    batches = bench_train.corpus_batches(root, 9, 200, 60, 1, tmp_path / "cache", seed=0)
    epoch = [b[0] for b in bench_train.corpus_batches(root, 1, 200, 60, 1, tmp_path / "c2", 0)]
    assert len(batches) == 9
    assert sum(b[0].size(0) for b in batches) > 60  # more sentences than one epoch holds
    assert torch.equal(batches[0][0], epoch[0])  # the first epoch first, as before


def test_the_steps_kept_are_the_steps_run(dry) -> None:
    result, shapes, _ = dry
    assert [(s.src_shape, s.tgt_shape) for s in result.steps] == shapes[
        : len(shapes) - len(result.rows)
    ]  # then one profiled step per system


@pytest.mark.slow
def test_every_timed_shape_is_warmed_up_first_for_every_system(dry) -> None:
    result, _, _ = dry
    names = [r.name for r in result.rows]
    assert names[:2] == ["ours", "ours, full logits"] and "torch.nn.Transformer" in names
    for name in names:
        mine = [s for s in result.steps if s.system == name]
        phases = [s.phase for s in mine]
        assert phases == sorted(phases, key=["warm", "timed"].index)  # all warm steps first
        warm = {(s.src_shape, s.tgt_shape) for s in mine if s.phase == "warm"}
        timed = [(s.src_shape, s.tgt_shape) for s in mine if s.phase == "timed"]
        assert len(timed) == 4 and len(set(timed)) > 1 and set(timed) <= warm


@pytest.mark.slow
def test_systems_take_turns_in_a_fixed_order_and_its_reverse(dry) -> None:
    result, _, _ = dry
    names = [r.name for r in result.rows]
    timed = [s for s in result.steps if s.phase == "timed"]
    for batch in range(4):
        order = [s.system for s in timed if s.batch == batch]
        assert order == (names if batch % 2 == 0 else names[::-1])
        assert [s.position for s in timed if s.batch == batch] == list(range(len(names)))


@pytest.mark.slow
def test_totals_and_percentiles_come_from_the_steps_kept(dry) -> None:
    result, _, kept = dry
    steps = [s for s in kept["steps"] if s["phase"] == "timed"]
    total = {}
    for row in kept["systems"]:
        mine = [s for s in steps if s["system"] == row["name"]]
        seconds = [s["seconds"] for s in mine]
        total[row["name"]] = sum(seconds)
        assert row["tokens_per_s"] == pytest.approx(sum(s["tokens"] for s in mine) / sum(seconds))
        p10, p50, p90 = row["step_ms"]
        assert p10 <= p50 <= p90
        assert [p10, p50, p90] == pytest.approx(np.percentile(seconds, [10, 50, 90]) * 1e3)
        assert row["mfu"] > 0 and row["peak_memory_mib"] is None  # CPU: n/a
    for row in kept["systems"][1:]:
        assert row["ratio"] == pytest.approx(total[row["name"]] / total["ours"])
    assert [r.name for r in result.rows] == [r["name"] for r in kept["systems"]]


@pytest.mark.slow
def test_the_attention_backend_that_ran_is_named(dry) -> None:
    """From the aten ops of a profiled step: ours calls SDPA once per attention layer (2 encoder
    self-attention, 2 decoder self- and 2 cross-attention: CPU's flash kernel in float32)."""
    rows = {r.name: r for r in dry[0].rows}
    assert rows["ours"].profile.sdpa == {"cpu-flash": 6}
    assert rows["ours"].profile.kernels > 100 and rows["ours"].profile.gpu_busy is None
    assert sum(rows["torch.nn.Transformer"].profile.sdpa.values()) == 6
    installed = importlib.util.find_spec("eole") is not None
    assert ("eole" in rows) == installed
    assert ("eole: not installed (pip install eole)" in dry[0].notes) != installed


def test_ours_own_loss_is_the_peers_loss_on_the_same_batch() -> None:
    """The bench gives ours its own training loss and the peers torch's cross entropy on full
    logits: the same objective, so the two timings compare like with like."""
    cfg = model_config("tiny", None, 0.0)
    model = Transformer(cfg)
    batch = make_batches(1, 1000, cfg.tgt_vocab_size, (10, 60), 1)[0]
    n = int(batch[2].ne(PAD_ID).sum())
    own = own_loss(model, model, 0.1)(batch, n)
    torch.testing.assert_close(own, logits_loss(model, 0.1)(batch, n))


@pytest.mark.slow
def test_marian_is_compared_when_transformers_is_installed(dry) -> None:
    reason = "MarianMTModel needs transformers, in the `bench` extra: pip install -e '.[bench]'"
    pytest.importorskip("transformers", reason=reason)
    rows = {r.name: r for r in dry[0].rows}
    assert rows["MarianMTModel"].tokens_per_s > 0 and rows["MarianMTModel"].ratio > 0
    assert sum(rows["MarianMTModel"].profile.sdpa.values()) == 6


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


def test_positions_too_times_ours_with_each_position_encoding() -> None:
    result = main(["--dry-run", "--no-peers", "--positions-too", "rope,relative"])
    systems = [row.name for row in result.rows]
    assert systems == ["ours", "ours, positions=rope", "ours, positions=relative"]
    built = bench_train.build_systems(model_config("tiny", 64, 0.0), [], positions_too=["rope"])
    assert built["ours, positions=rope"].cfg.positions == "rope"
    assert built["ours"].cfg.positions == "sinusoidal"
