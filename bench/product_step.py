"""The product's training step, as the speed scripts run it: the Lightning module and Trainer that
``train.py`` builds from ``transformer/configs/train.yaml``
(:func:`transformer.training.run.build_module`, :func:`transformer.training.trainer.build_trainer`),
its SDPA backends selected as ``train.py`` selects them, fed prepared batches. Each step is timed
between Lightning's batch hooks (:class:`StepClock`): the forward and the loss under the precision
plugin's autocast, backward, clipping, the optimizer step, the schedule and the step's logging
calls; not the fetch of the next batch or the loggers' writes between steps.

A bench preset is a list of ``train.py`` overrides (:data:`PRESETS`); more come from the command
line. Batches come from the product's data pipeline: the data module on a corpus, or synthetic
sentences packed and padded by its sampler and collator, as the config says (``data.max_tokens``,
``data.pad_to_multiple``, ``data.num_buckets``).
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import Checkpoint
from omegaconf import DictConfig

from transformer import sdpa_backends
from transformer.config import TransformerConfig
from transformer.configs import CONFIG_DIR
from transformer.data.collate import Batch, Buckets, Collator, padded_sizes
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.tokenizer import PAD_ID
from transformer.training import config_checks as checks
from transformer.training.run import build_datamodule, build_module
from transformer.training.trainer import build_trainer, training_callbacks

# train.py overrides of each preset: transformer-base and -big with a WMT-size joint vocabulary
# of 32k (the model's; a corpus's ids index the larger table, which costs the same) and 25k-token
# batches; the GPU recipe (experiment=multi30k_en_de) as it is; the dry run's tiny model.
VOCAB_32K = ["model.src_vocab_size=32000", "model.tgt_vocab_size=32000"]
PRESETS: dict[str, list[str]] = {
    "base": ["model=base", *VOCAB_32K, "data.max_tokens=25000", "model.dropout=0.1"],
    "big": ["model=big", *VOCAB_32K, "data.max_tokens=25000", "model.dropout=0.1"],
    "recipe": ["experiment=multi30k_en_de"],
    "tiny": [
        "model=tiny",
        "model.src_vocab_size=1000",
        "model.tgt_vocab_size=1000",
        "data.max_tokens=1000",
    ],  # fmt: skip
}

# What a benchmark run of the product changes in its config: no validation, no checkpoint, no
# model summary; its own run directory (nothing is written there).
BENCH_RUN = [
    "trainer.limit_val_batches=0", "trainer.num_sanity_val_steps=0",
    "+trainer.enable_checkpointing=false", "trainer.enable_model_summary=false",
    "trainer.max_epochs=null", "logger=csv",
]  # fmt: skip


def compose_config(overrides: Sequence[str], out_dir: Path) -> DictConfig:
    """``transformer/configs/train.yaml`` with these overrides, as ``python train.py`` composes it,
    for a benchmark run (:data:`BENCH_RUN`) writing nothing outside ``out_dir``."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=[f"paths.output_dir={out_dir}", *BENCH_RUN, *overrides])


def model_config(cfg: DictConfig) -> TransformerConfig:
    """The model a composed config trains, every option checked as ``train.py`` checks it."""
    return checks.validate_config(cfg)


def sentence_lengths(
    n: int, min_len: int, max_len: int, g: torch.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths (eos included): log-normal around 25, clipped to the range;
    targets 0.9-1.3x their source, like subword pieces of news sentences."""
    median = min(max(25.0, min_len), max_len)
    src = (torch.randn(n, generator=g) * 0.45 + math.log(median)).exp()
    tgt = src * (0.9 + 0.4 * torch.rand(n, generator=g))
    src, tgt = (x.round().long().clamp(min_len, max_len).numpy() for x in (src, tgt))
    return src, tgt


def synthetic_batches(
    data: DictConfig, n: int, vocab: int, lengths: tuple[int, int], seed: int
) -> list[Batch]:
    """The first ``n`` training batches of random sentences (ids in [4, vocab), lengths from
    :func:`sentence_lengths`), planned and padded as ``TranslationDataModule.train_dataloader``
    plans and pads a corpus's: the token-budget sampler, shuffled, and the collator, with the
    config's budget, padding and shape buckets; epoch after epoch until there are ``n``."""
    g = torch.Generator().manual_seed(seed)
    pool = max(4 * n * int(data.max_tokens) // lengths[0], 64)
    src_len, tgt_len = sentence_lengths(pool, *lengths, g)
    rng = np.random.default_rng(seed)
    examples = [
        (i, rng.integers(4, vocab, s - 1), rng.integers(4, vocab, t - 1))
        for i, (s, t) in enumerate(zip(src_len, tgt_len, strict=True))
    ]
    sizes = padded_sizes(src_len - 1, tgt_len - 1)
    multiple, max_tokens = int(data.pad_to_multiple), data.max_tokens
    buckets = None
    if data.num_buckets:
        buckets = Buckets.at_quantiles(
            np.maximum(*sizes), int(data.num_buckets), multiple, max_tokens, data.batch_size
        )
    sampler = TokenBudgetBatchSampler(
        *sizes, max_tokens=max_tokens, batch_size=data.batch_size, shuffle=True,
        seed=int(data.seed), pad_to_multiple=multiple, buckets=buckets,
    )  # fmt: skip
    collate = Collator(multiple, PAD_ID, buckets)
    batches: list[Batch] = []
    for epoch in range(n):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batches.append(collate([examples[i] for i in indices]))
            if len(batches) == n:
                return batches
    raise AssertionError("unreachable: every epoch yields a batch")


def corpus_batches(cfg: DictConfig, n: int) -> list[Batch]:
    """The first ``n`` shuffled training batches of the corpus ``cfg.data`` names, as the
    product's data module makes them (epoch after epoch while one holds fewer than ``n``)."""
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    batches: list[Batch] = []
    for epoch in range(n):
        loader = dm.train_dataloader()
        loader.batch_sampler.set_epoch(epoch)
        for batch in loader:
            batches.append(batch)
            if len(batches) == n:
                return batches
        if not batches:
            raise ValueError(f"{cfg.data.root}: the training split has no batch")
    return batches


def as_tensors(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source, decoder input, labels): what the peers' steps take."""
    return batch.src, batch.tgt_in, batch.labels


class StepTimer:
    """Seconds of one step: CUDA events around it on a GPU (the device idle before it and
    synchronised after), the wall clock on CPU; and on CUDA the rise of the allocated memory
    over the step (:attr:`rise`). :meth:`start` and :meth:`stop` may be called from two hooks;
    calling the timer on a function times it."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._start, self._base, self.rise = 0.0, 0, 0

    def start(self) -> None:
        if not self.cuda:
            self._start = time.perf_counter()
            return
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._base = torch.cuda.memory_allocated()
        self.events[0].record()

    def stop(self) -> float:
        if not self.cuda:
            return time.perf_counter() - self._start
        self.events[1].record()
        self.events[1].synchronize()
        self.rise = torch.cuda.max_memory_allocated() - self._base
        return self.events[0].elapsed_time(self.events[1]) / 1e3

    def __call__(self, step: Callable[[], object]) -> float:
        self.start()
        step()
        return self.stop()


class StepClock:
    """Times each training step of a fit from the first callback's ``on_train_batch_start`` to
    the last one's ``on_train_batch_end`` (:attr:`first`, :attr:`last`), and hands it to
    ``record(batch_idx, seconds)``; ``before(batch_idx)`` and ``after(batch_idx)`` run outside
    the timed span (other systems' steps on the same batch); ``around(batch_idx)`` may return a
    context entered for the step (a profiler, a recorder)."""

    def __init__(
        self,
        timer: StepTimer,
        record: Callable[[int, float], None],
        before: Callable[[int], None] = lambda i: None,
        after: Callable[[int], None] = lambda i: None,
        around: Callable[[int], Any] = lambda i: None,
    ) -> None:
        self.timer, self.record = timer, record
        self.before, self.after, self.around = before, after, around
        self._context: Any = None
        clock = self

        class First(L.Callback):
            def on_train_batch_start(self, trainer, module, batch, batch_idx: int) -> None:
                clock.before(batch_idx)
                clock._context = clock.around(batch_idx)
                if clock._context is not None:
                    clock._context.__enter__()
                clock.timer.start()

        class Last(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx: int) -> None:
                seconds = clock.timer.stop()
                if clock._context is not None:
                    clock._context.__exit__(None, None, None)
                    clock._context = None
                clock.record(batch_idx, seconds)
                clock.after(batch_idx)

        self.first, self.last = First(), Last()


class Loader:
    """Prepared batches as Lightning takes one loader's (a list would be a list of loaders)."""

    def __init__(self, batches: Sequence[Batch]) -> None:
        self.batches = list(batches)

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class Product:
    """Ours, as ``train.py`` builds it from ``cfg``: :meth:`fit` runs its training steps on
    ``batches``, one each, in order."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.model_cfg = model_config(cfg)
        L.seed_everything(int(cfg.seed), workers=True, verbose=False)
        self.module = build_module(cfg, self.model_cfg)
        self.backends = sdpa_backends.parse(cfg.get("sdpa_backends"))

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters() if p.requires_grad)

    def state_bytes(self) -> int:
        """Parameters and optimizer state: what the module holds between steps."""
        params = sum(p.numel() * p.element_size() for p in self.module.parameters())
        opt = self.module.trainer.optimizers[0]
        state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
        return params + sum(t.numel() * t.element_size() for t in state)

    def fit(self, batches: Sequence[Batch], clock: StepClock | None = None) -> None:
        """Lightning's fit loop over ``batches`` (one epoch of them) with the run's callbacks
        that act on training steps (checkpoint writers left out), timed by ``clock``."""
        cfg = copy.deepcopy(self.cfg)
        cfg.trainer.max_steps = len(batches)
        steps = [c for c in training_callbacks(cfg) if not isinstance(c, Checkpoint)]
        if clock is not None:
            steps = [clock.first, *steps, clock.last]
        trainer = build_trainer(cfg, [], steps)
        with sdpa_backends.selected(self.module.model, self.backends):
            trainer.fit(self.module, train_dataloaders=Loader(batches))


def product(overrides: Sequence[str], out_dir: Path | None = None) -> Product:
    """:class:`Product` of ``transformer/configs/train.yaml`` with ``overrides`` (a temporary run
    directory unless ``out_dir``)."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="bench-run-"))
    return Product(compose_config(overrides, out))


def padding_share(cfg: TransformerConfig, batches: Sequence[Batch]) -> float:
    """The share of a step's matrix-product FLOPs spent on padding: the layers' products run on
    every position of the padded source and target rows; the output projection (fused with the
    loss) only on the labels. Attention is left out (its padded keys are masked, and its cost is
    the kernel's)."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size
    d_kv = cfg.num_kv_heads * cfg.head_dim
    enc = cfg.num_encoder_layers * (2 * d * d + 2 * d * d_kv + 2 * d * f)  # per source position
    kv = cfg.num_decoder_layers * 2 * d * d_kv  # cross-attention K and V, per source position
    dec = cfg.num_decoder_layers * (2 * d * d + 2 * d * d_kv + 2 * d * d + 2 * d * f)
    padded = real = 0
    for b in batches:
        s_real, t_real = int(b.src.ne(PAD_ID).sum()), b.num_tgt_tokens
        padded += (enc + kv) * b.src.numel() + dec * b.labels.numel() + d * v * t_real
        real += (enc + kv) * s_real + dec * t_real + d * v * t_real
    return 1 - real / padded
