"""bench/bench_train.py: ours is the step train.py runs (the same operators, on CUDA's code paths),
the FLOP formula by hand, the batches, and its dry run: a warm pass over every timed shape, a fixed
order and its reverse, totals and percentiles from the steps it keeps, the attention backend that
ran, the time by category."""

from __future__ import annotations

import importlib.util
import json
import re

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench import bench_train
from bench.bench_train import main, matrix_params, train_flops
from bench.common import logits_loss
from bench.count_kernels import cuda_code_paths
from bench.product_step import (
    StepClock,
    StepTimer,
    corpus_batches,
    padding_share,
    product,
    synthetic_batches,
)
from bench.step_profile import CATEGORIES
from tests.tiny import compose_cfg, tiny_overrides
from transformer import Transformer, TransformerConfig
from transformer.data.synthetic import write_corpus
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.errors import ConfigError
from transformer.training import train

pytestmark = pytest.mark.bench  # a script of bench/ or dev/


class Operators(TorchDispatchMode):
    """Every operator that runs, with its tensors' shapes and dtypes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        self.calls.append((str(func), [(tuple(t.shape), t.dtype) for t in tensors]))
        return func(*args, **(kwargs or {}))


RECORDED: dict[int, Operators] = {}  # train()'s recorder keeps its operators here


class RecordStep(L.Callback):
    """Records the operators of training step ``step`` (train.py's callbacks, from the config)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, module, batch, batch_idx: int) -> None:
        if batch_idx == self.step:
            RECORDED[self.step] = Operators().__enter__()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx: int) -> None:
        if batch_idx == self.step:
            RECORDED[self.step].__exit__(None, None, None)


@pytest.mark.slow
def test_ours_runs_the_operators_of_the_step_train_py_runs(corpus, tmp_path):
    """The benchmark's step of ours and a step of ``train(cfg)`` on the same batch (the second,
    after a first that initialises the optimizer's state), on CUDA's code paths in bf16: the same
    operators, in the same order, on tensors of the same shapes and dtypes. The bulk autocast
    casts, the fused loss, clipping, the optimizer, the data's padding: whatever train.py runs a
    step, the benchmark times."""
    common = [*tiny_overrides(corpus), "trainer.precision=bf16-mixed", "data.pad_to_multiple=8"]
    common += ["optim.optimizer.fused=true", "ema.decay=0.9"]  # CUDA's fused AdamW; EMA a step
    record = ["+callbacks.record._target_=tests.bench.test_bench_train.RecordStep"]
    record += ["+callbacks.record.step=1", "trainer.max_steps=2", "trainer.limit_val_batches=0"]
    with cuda_code_paths():
        train(compose_cfg([*common, *record], tmp_path / "run"))
        ours = product(common, tmp_path / "bench")
        batches = corpus_batches(ours.cfg, 2)
        bench = Operators()
        clock = StepClock(StepTimer(torch.device("cpu")), lambda k, s: None)
        clock.around = lambda k: bench if k == 1 else None
        ours.fit(batches, clock)
    trained = RECORDED.pop(1).calls
    assert len(trained) > 500  # a whole step: forward, loss, backward, clipping, AdamW
    assert any("_fused_adamw" in name for name, _ in trained)
    assert bench.calls == trained


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
    cfg = product(["model=tiny", "model.src_vocab_size=100", "model.tgt_vocab_size=100"]).model_cfg
    model = Transformer(cfg)
    n_enc, n_dec, n_kv = matrix_params(cfg)
    assert n_enc == sum(p.numel() for p in model.encoder.parameters() if p.dim() == 2)
    decoder = sum(p.numel() for p in model.decoder.parameters() if p.dim() == 2)
    assert n_dec + n_kv == decoder + model.output.weight.numel()


def test_synthetic_batches_are_planned_and_padded_as_the_data_module_does() -> None:
    data = compose_cfg(["data.max_tokens=1000", "data.pad_to_multiple=8"]).data
    batches = synthetic_batches(data, 6, 100, (10, 60), seed=0)
    assert len(batches) == 6
    real, total = 0, 0
    for b in batches:
        assert b.src.numel() <= 1000 and b.labels.numel() <= 1000 and b.src.size(1) % 8 == 0
        assert b.tgt_in[:, 0].eq(BOS_ID).all() and b.tgt_in.ne(PAD_ID).eq(b.labels.ne(PAD_ID)).all()
        lengths = b.labels.ne(PAD_ID).sum(1)
        assert b.labels[torch.arange(len(b)), lengths - 1].eq(EOS_ID).all()
        assert lengths.min() >= 10 and lengths.max() <= 60 and b.num_tgt_tokens == lengths.sum()
        real, total = real + int(lengths.sum()), total + b.labels.numel()
    assert real / total > 0.75  # length bucketing keeps padding small
    bucketed = synthetic_batches(compose_cfg(["data.num_buckets=3"]).data, 20, 100, (10, 60), 0)
    assert len({tuple(b.src.shape) for b in bucketed}) <= 3  # the shapes of 3 buckets


def test_padding_share_counts_padded_rows_of_the_layers_but_labels_of_the_projection() -> None:
    cfg = TransformerConfig(
        10, 10, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16
    )
    data = compose_cfg(["data.max_tokens=1000"]).data
    (batch,) = synthetic_batches(data, 1, 10, (10, 60), seed=0)
    assert padding_share(cfg, [batch]) == pytest.approx(0.0, abs=0.2)
    src_real, tgt_real = int(batch.src.ne(PAD_ID).sum()), batch.num_tgt_tokens
    enc = 2 * 8 * 8 + 2 * 8 * 8 + 2 * 8 * 16  # Q, output; K, V; FFN: 384 a source position
    kv, dec = 2 * 8 * 8, 4 * 8 * 8 + 2 * 8 * 8 + 2 * 8 * 16  # 128; 640 a target position
    padded = (enc + kv) * batch.src.numel() + dec * batch.labels.numel() + 8 * 10 * tgt_real
    real = (enc + kv) * src_real + dec * tgt_real + 8 * 10 * tgt_real
    assert padding_share(cfg, [batch]) == pytest.approx(1 - real / padded)


@pytest.mark.slow
def test_corpus_batches_go_on_into_the_next_epochs_when_one_is_too_short(tmp_path) -> None:
    # Multi30k at base's 25,000 tokens is 25 batches an epoch, fewer than 50 timed ones.
    root = write_corpus(tmp_path / "corpus", {"train": 60, "val": 8, "test_2016_flickr": 8}, ".gz")
    data = [f"data.root={root}", "data.vocab_size=60", "data.max_tokens=200", "data.num_workers=0"]
    data += [f"data.cache_dir={tmp_path / 'cache'}", "data.download=false"]
    cfg = product(["model=tiny", *data]).cfg
    batches = corpus_batches(cfg, 9)
    epoch = corpus_batches(cfg, 1)
    assert len(batches) == 9
    assert sum(len(b) for b in batches) > 60  # more sentences than one epoch holds
    assert torch.equal(batches[0].src, epoch[0].src)  # the first epoch first, as before


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """The dry run (tiny, CPU) with a variant of ours, its steps kept."""
    out = tmp_path_factory.mktemp("bench") / "steps.json"
    result = main(["--dry-run", "--variant", "rope", "model.positions=rope", "--out", str(out)])
    return result, json.loads(out.read_text())


@pytest.mark.slow
def test_every_timed_shape_is_warmed_up_first_for_every_system(dry) -> None:
    result, _ = dry
    names = [r.name for r in result.rows]
    assert names[:2] == ["ours", "ours, rope"] and "torch.nn.Transformer" in names
    for name in names:
        mine = [s for s in result.steps if s.system == name]
        phases = [s.phase for s in mine]
        assert phases == sorted(phases, key=["warm", "timed"].index)  # all warm steps first
        warm = {(s.src_shape, s.tgt_shape) for s in mine if s.phase == "warm"}
        timed = [(s.src_shape, s.tgt_shape) for s in mine if s.phase == "timed"]
        assert len(timed) == 4 and len(set(timed)) > 1 and set(timed) <= warm


@pytest.mark.slow
def test_ours_and_the_peers_take_turns_in_a_fixed_order_and_its_reverse(dry) -> None:
    """The peers run beside ours (its variants alone, after): ours first on even batches, last
    on odd ones."""
    result, _ = dry
    names = ["ours", *[r.name for r in result.rows if not r.name.startswith("ours")]]
    timed = [s for s in result.steps if s.phase == "timed"]
    for batch in range(4):
        order = [s.system for s in timed if s.batch == batch and s.system in names]
        assert order == (names if batch % 2 == 0 else names[::-1])
        positions = [s.position for s in timed if s.batch == batch and s.system in names]
        assert positions == list(range(len(names)))
    variant = [s.system for s in result.steps if s.system == "ours, rope"]
    assert result.steps[-len(variant) :] == [s for s in result.steps if s.system == "ours, rope"]


@pytest.mark.slow
def test_totals_and_percentiles_come_from_the_steps_kept(dry) -> None:
    result, kept = dry
    steps = [s for s in kept["steps"] if s["phase"] == "timed"]
    rate = {}
    for row in kept["systems"]:
        mine = [s for s in steps if s["system"] == row["name"]]
        seconds = [s["seconds"] for s in mine]
        rate[row["name"]] = sum(s["tokens"] for s in mine) / sum(seconds)
        assert row["tokens_per_s"] == pytest.approx(rate[row["name"]])
        p10, p50, p90 = row["step_ms"]
        assert p10 <= p50 <= p90
        assert [p10, p50, p90] == pytest.approx(np.percentile(seconds, [10, 50, 90]) * 1e3)
        assert row["mfu"] > 0 and row["peak_memory_mib"] is None  # CPU: n/a
    for row in kept["systems"][1:]:
        assert row["ratio"] == pytest.approx(rate["ours"] / rate[row["name"]])
    assert [r.name for r in result.rows] == [r["name"] for r in kept["systems"]]


@pytest.mark.slow
def test_the_time_by_category_adds_up_to_the_profiled_steps(dry) -> None:
    """Ours and its variant are profiled over steps of their own: every category measured, the
    loss (the fused projection) and the matrix products among them; the peers are not."""
    rows = {r.name: r for r in dry[0].rows}
    for name in ("ours", "ours, rope"):
        split = rows[name].categories
        assert split["steps"] == 2 and set(split) == {*CATEGORIES, "steps"}
        assert split["loss"] > 0 and split["matrix products"] > 0 and split["host gaps"] > 0
        assert min(split[c] for c in CATEGORIES) >= 0
    assert rows["torch.nn.Transformer"].categories is None
    assert 0 < rows["ours"].padding < 0.5 and rows["torch.nn.Transformer"].padding is None


@pytest.mark.slow
def test_no_profiled_steps_leaves_the_time_by_category_out(capsys) -> None:
    result = main(["--dry-run", "--no-peers", "--profile-steps", "0"])
    assert result.rows[0].name == "ours" and result.rows[0].tokens_per_s > 0
    assert result.rows[0].categories is None
    assert "by category" not in capsys.readouterr().out


@pytest.mark.slow
def test_the_attention_backend_that_ran_is_named(dry) -> None:
    """From the operators of a profiled step: the peer calls SDPA once per attention layer (2
    encoder self-attention, 2 decoder self- and 2 cross-attention)."""
    rows = {r.name: r for r in dry[0].rows}
    assert rows["ours"].profile.kernels > 100 and rows["ours"].profile.gpu_busy is None
    assert sum(rows["torch.nn.Transformer"].profile.sdpa.values()) == 6
    installed = importlib.util.find_spec("eole") is not None
    assert ("eole" in rows) == installed
    assert ("eole: not installed (pip install eole)" in dry[0].notes) != installed


def test_the_peers_loss_is_ours_on_the_same_batch(tmp_path) -> None:
    """The peers train on torch's cross entropy over full logits, ours on its own fused loss:
    the same objective, so the two timings compare like with like."""
    ours = product(["model=tiny", "model.dropout=0", "trainer.precision=32-true"], tmp_path)
    model = ours.module.eval()
    data = ours.cfg.data
    (batch,) = synthetic_batches(data, 1, ours.model_cfg.tgt_vocab_size, (10, 60), 0)
    loss_sum, _, n = model._loss(batch, compiled=False)
    peers = logits_loss(model.model, float(ours.cfg.loss.label_smoothing))
    full = peers((batch.src, batch.tgt_in, batch.labels), batch.num_tgt_tokens)
    torch.testing.assert_close(loss_sum / n, full)


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

    cfg = product(["model=tiny", "model.src_vocab_size=100", "model.tgt_vocab_size=100"]).model_cfg
    eole, ours = EoleLogits(cfg), Transformer(cfg)
    count = sum(p.numel() for p in eole.parameters())
    assert abs(count - sum(p.numel() for p in ours.parameters())) / count < 0.02
    data = compose_cfg(["data.max_tokens=500"]).data
    (batch,) = synthetic_batches(data, 1, cfg.tgt_vocab_size, (10, 20), 0)
    assert eole(batch.src, batch.tgt_in).shape == (*batch.tgt_in.shape, cfg.tgt_vocab_size)


def test_a_variant_is_ours_with_more_train_py_overrides() -> None:
    args = bench_train.parse_args(["--preset", "base", "--set", "data.pad_to_multiple=8"])
    base = bench_train.overrides(args, torch.device("cpu"))
    assert base[:2] == ["model=base", "model.src_vocab_size=32000"]
    assert "data.max_tokens=25000" in base and base[-1] == "data.pad_to_multiple=8"
    variant = product([*base, "model.positions=rope"])
    assert variant.model_cfg.positions == "rope" and variant.model_cfg.d_model == 512
    assert variant.cfg.data.pad_to_multiple == 8


def test_compose_only_checks_the_presets_own_config_and_each_variant_and_builds_nothing(
    capsys, monkeypatch
) -> None:
    def no_product(*args, **kwargs):
        raise AssertionError("--compose-only built a model")

    monkeypatch.setattr(bench_train, "product", no_product)
    variant = ["--variant", "graphs", "compile=true data.num_buckets=4"]
    result = main(["--preset", "big", "--compose-only", "--device", "cpu", *variant])
    assert result.rows == [] and result.steps == []
    ours, graphs = capsys.readouterr().out.splitlines()[-2:]
    assert ours.startswith("ours: d_model=1024 heads=16 layers=6+6 d_ff=4096 vocab=32000 ")
    assert " compile=False; train.py model=big " in ours and ours.endswith(" seed=0")
    assert graphs.startswith("ours, graphs: d_model=1024 ") and " compile=True; " in graphs
    assert graphs.endswith("seed=0 compile=true data.num_buckets=4")
    with pytest.raises(ConfigError, match=r"loss\.kernel=compild"):  # as train.py refuses it
        main(["--preset", "base", "--compose-only", "--variant", "typo", "loss.kernel=compild"])
    with pytest.raises(SystemExit):  # --dry-run would compose the tiny preset instead
        bench_train.parse_args(["--preset", "big", "--compose-only", "--dry-run"])


def test_padding_only_prints_each_systems_padding_and_runs_no_step(capsys) -> None:
    result = main(["--dry-run", "--padding-only", "--variant", "buckets", "data.num_buckets=2"])
    assert result.rows == [] and result.steps == []
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("ours: ") and out[-1].startswith("ours, buckets: ")
    assert re.search(r"\(4 batches, [12] shapes\)$", out[-1])  # of the 2 buckets
