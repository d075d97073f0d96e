"""Training speed: the product's own step against torch.nn.Transformer and Hugging Face
MarianMTModel (and eole), on the same batches.

Ours is the training step ``train.py`` runs (bench/product_step.py): the Lightning module and
Trainer built from transformer/configs/train.yaml with the preset's overrides (and --set's), its
precision, bulk autocast casts, SDPA backends, gradient clipping, fused AdamW and schedule (on CPU
glibc's heap set as ``train()`` sets it, for the whole process), fed the product's own batches
(its budget, padding and shape buckets), each step timed between Lightning's batch hooks.
--variant NAME "OVERRIDES" adds "ours, NAME": ours with more train.py overrides (compile=true,
data.num_buckets=8, model.positions=rope, ...), its batches made by its own config, timed in a fit
of its own after ours.

The peers keep their own best settings: a plain loop of forward, torch's cross entropy on their
full (B, T, V) logits (fp32 log-probabilities, the same label smoothing), backward and fused
AdamW, under the autocast of ours's precision, on ours's batches. --tgt-pad-mask-too adds
torch.nn.Transformer given the target padding mask, as users usually call it (causality alone
guards right-padded targets, so the others go without).

How it is timed:
  1. a warm pass: every distinct batch shape of the timed steps, once for every system (cuDNN's
     attention plans, torch.compile's graphs and the allocator's blocks are made here, not in a
     timed step), plus --warmup extra steps on the first batch;
  2. the timed steps: every batch, every system on it, the systems in a fixed order on even
     batches and in the reverse order on odd ones (ours first or last, the peers' steps run
     between Lightning's steps); each step alone (the device synchronised before it) and timed
     with CUDA events on a GPU, the wall clock on CPU;
  3. one more step of each system under torch.profiler: the SDPA backend that ran (the aten op
     each attention call dispatched to), kernels a step, GPU busy share and host ms;
  4. ours and its variants: --profile-steps more steps under torch.profiler, their time split
     by category (bench/step_profile.py): matrix products, attention, loss, norms and
     elementwise, optimizer, host gaps.

Per system: target tokens/s = all timed target tokens / all timed seconds; step time p10, p50, p90;
model TFLOP/s and MFU from the same totals; peak memory (CUDA); ours / system = the system's total
time over ours (the same batches). Per batch list: the share of the matrix products' FLOPs spent
on padding. --out FILE keeps every step (warm and timed, with its batch shape, order and seconds),
the profiles and the categories as JSON.

    python bench/bench_train.py --preset base                 # bf16 on a GPU (the product's auto)
    python bench/bench_train.py --preset big --variant compiled "compile=true"
    python bench/bench_train.py --preset recipe --data data/multi30k --out steps.json
    python bench/bench_train.py --preset base --set data.pad_to_multiple=8 --no-peers \\
        --variant graphs "compile=true data.num_buckets=8"
    python bench/bench_train.py --dry-run                     # tiny, CPU, seconds
    python bench/bench_train.py --preset big --compose-only   # its config, checked; no step

Presets (train.py overrides, bench/product_step.py; --model, --vocab, --tokens, --dropout
override them):
  base    model=base (512 wide, 8 heads, 6+6 layers, FFN 2048), vocabulary 32k, 25k-token batches
  big     model=big (1024 wide, 16 heads, 6+6, FFN 4096), vocabulary 32k, 25k-token batches
  recipe  experiment=multi30k_en_de, the GPU recipe: model=mini (128 wide, 4 heads, 4+4, FFN 256,
          dropout 0.3), vocabulary 6k, 4,096-token batches
  tiny    the dry run's: model=tiny (64 wide, 4 heads, 2+2, FFN 128), vocabulary 1k, 1,000-token
          batches

Batches: with --data DIR (a Multi30k folder), the product's data module makes them
(SentencePiece with --data-vocab pieces, the token-budget sampler and collator, shuffled training
batches); the model's vocabulary stays the preset's (ids index a larger table, which costs the
same). Without it: synthetic sentences, log-normal lengths around 25 pieces, through the same
sampler and collator.

Systems:
  ours                   transformer.Transformer in transformer.training.TranslationModule:
                         pre-norm, one embedding shared by encoder, decoder and output
                         projection, scaled by sqrt(d_model), sinusoidal positions; its loss the
                         output projection fused with the label-smoothed loss over the non-pad
                         positions only (transformer/training/loss.py).
  torch.nn.Transformer   the same sizes, norm_first, inside our embedding and tied output
                         projection (bench/common.py); its dropout also acts on the attention
                         weights and inside the feed-forward block.
  MarianMTModel          transformers' model from a MarianConfig of the same sizes, vocabulary,
                         shared and tied embeddings, dropout and activation; Marian's own
                         architecture otherwise: post-norm, embedding scale sqrt(d_model),
                         sinusoidal positions, a final logits bias.
  eole                   when installed (pip install eole): its EncoderDecoderModel of the same
                         sizes (bench/common.py).

Model FLOPs of one training step, the same count for every system, from the real (non-pad)
lengths s_i (source, eos included) and t_i (target = labels, eos included) of the batch's
sentences, S = sum s_i, T = sum t_i:

    6 * (N_enc * S + N_kv * S + N_dec * T)
      + 12 * d_model * (L_enc * sum s_i^2 + L_dec * sum t_i (t_i + 1) / 2 + L_dec * sum s_i t_i)

  N_enc  the encoder layers' weight matrices: Q, K, V, output, both feed-forward matrices;
  N_dec  the decoder layers' weight matrices that run on target positions: self-attention Q, K,
         V, output; cross-attention Q and output; both feed-forward matrices; plus the output
         projection d_model x V (tied or not);
  N_kv   the decoder's cross-attention K and V matrices, which run on the encoder output, hence
         once per source token and decoder layer.
  6 = 2 FLOPs per multiply-add x 3 (forward; backward to the inputs and to the weights).
  Attention per layer: QK^T and AV, 2 x 2 x d_model FLOPs per (query, key) pair forward, x 3
  with the backward: 12 x d_model x pairs; encoder self-attention s_i^2 pairs, cross-attention
  t_i s_i, causal decoder self-attention only the t_i (t_i + 1) / 2 pairs it may use (half).
  Not counted: padding, embedding lookups and positions, biases, layer norms, softmax, dropout,
  the loss and the optimizer.

MFU = model FLOPs / time / peak FLOP/s, over all timed steps. GPU peaks are dense (no sparsity)
datasheet figures picked from torch.cuda.get_device_name(): bf16 runs against the bf16 peak, fp32
runs against the fp32 peak (the product leaves TF32 off). On CPU the peak is measured: the best of
a few large matrix multiplications in the run's precision. --peak-tflops overrides.

Peak memory (CUDA): the model's parameters and optimizer state, plus the largest rise of
torch.cuda.max_memory_allocated above the allocation at the start of its steps (activations,
gradients, temporaries). On CPU: n/a.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from bench.common import (
    EoleLogits,
    MarianLogits,
    TorchTransformer,
    autocast_factory,
    logits_loss,
    train_step,
)
from bench.product_step import (
    PRESETS,
    Product,
    StepClock,
    StepTimer,
    as_tensors,
    compose_config,
    corpus_batches,
    model_config,
    padding_share,
    product,
    synthetic_batches,
)
from bench.step_profile import (
    CATEGORIES,
    STEP_MARK,
    StepProfile,
    categories,
    one_step,
    profile_step,
    profiler,
)
from transformer.allocator import bound_kernel_caches, keep_freed_memory
from transformer.config import TransformerConfig
from transformer.data.collate import Batch
from transformer.data.tokenizer import PAD_ID
from transformer.precision import cpu_matmul_seconds
from transformer.training.trainer import precision_dtype, resolve_precision

# Dense TFLOP/s (no sparsity): name fragment of torch.cuda.get_device_name(), bf16, tf32, fp32.
# The first match wins.
GPU_PEAKS = (
    ("H100 PCIe", 756.0, 378.0, 51.0),
    ("H100", 989.0, 495.0, 67.0),  # SXM
    ("H200", 989.0, 495.0, 67.0),  # the H100 SXM's compute (GH200 too)
    ("A100", 312.0, 156.0, 19.5),
)

OURS = "ours"
TORCH_TGT_PAD = "torch.nn.Transformer, target padding mask"  # as users usually call it


@dataclass
class Step:
    """One training step of one system, ``phase`` warm or timed."""

    phase: str
    system: str
    batch: int  # index in the timed batches
    position: int  # the system's place in this batch's order (0 = first)
    src_shape: tuple[int, int]
    tgt_shape: tuple[int, int]
    tokens: int  # target (non-pad) tokens
    seconds: float


@dataclass
class Row:
    name: str
    parameters: int
    tokens_per_s: float  # all timed target (non-pad) tokens / all timed seconds
    step_ms: tuple[float, float, float]  # p10, p50, p90
    tflops: float  # model FLOPs of all timed steps / their seconds
    mfu: float | None
    peak_memory_mib: float | None  # None on CPU
    ratio: float | None  # this system's total time / ours; None for ours
    profile: StepProfile | None = None
    categories: dict[str, float] | None = None  # ms a step by category (ours and its variants)
    padding: float | None = None  # share of the matrix products' FLOPs on padding (its batches)


@dataclass
class Result:
    rows: list[Row]
    notes: list[str]  # systems skipped, and why
    steps: list[Step] = field(default_factory=list)  # every step run, in order


def matrix_params(cfg: TransformerConfig) -> tuple[int, int, int]:
    """(N_enc, N_dec, N_kv) of the FLOP formula: weight-matrix entries, see the docstring."""
    d, f = cfg.d_model, cfg.d_ff
    d_kv = cfg.num_kv_heads * cfg.head_dim
    self_attn = 2 * d * d + 2 * d * d_kv  # Q and output; K and V
    ffn = 2 * d * f
    n_enc = cfg.num_encoder_layers * (self_attn + ffn)
    n_dec = cfg.num_decoder_layers * (self_attn + 2 * d * d + ffn) + d * cfg.tgt_vocab_size
    n_kv = cfg.num_decoder_layers * 2 * d * d_kv
    return n_enc, n_dec, n_kv


def train_flops(cfg: TransformerConfig, src_lens: Sequence[int], tgt_lens: Sequence[int]) -> int:
    """Model FLOPs of one training step on sentences of these real lengths (the docstring's)."""
    n_enc, n_dec, n_kv = matrix_params(cfg)
    S, T = sum(src_lens), sum(tgt_lens)
    enc_pairs = sum(s * s for s in src_lens)
    dec_pairs = sum(t * (t + 1) // 2 for t in tgt_lens)
    cross_pairs = sum(s * t for s, t in zip(src_lens, tgt_lens, strict=True))
    dense = 6 * ((n_enc + n_kv) * S + n_dec * T)
    pairs = cfg.num_encoder_layers * enc_pairs + cfg.num_decoder_layers * (dec_pairs + cross_pairs)
    return dense + 12 * cfg.d_model * pairs


def batch_flops(cfg: TransformerConfig, batch: Batch) -> int:
    src_lens = batch.src.ne(PAD_ID).sum(1).tolist()
    tgt_lens = batch.labels.ne(PAD_ID).sum(1).tolist()
    return train_flops(cfg, src_lens, tgt_lens)


def peak_tflops(device: torch.device, dtype: str, n: int = 2048, repeats: int = 10) -> float | None:
    """Datasheet peak for a known GPU (None for an unknown one); measured on CPU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment, bf16, _tf32, fp32 in GPU_PEAKS:
            if fragment in name:
                return fp32 if dtype == "fp32" else bf16
        return None
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    return 2 * n**3 / cpu_matmul_seconds((torch_dtype,), n, repeats)[torch_dtype] / 1e12


def build_peers(
    cfg: TransformerConfig, notes: list[str], tgt_pad_mask_too: bool = False
) -> dict[str, nn.Module]:
    """The peers of ours, built from its model config."""
    torch.manual_seed(0)
    # causal mask only, like ours and Marian (right-padded targets need no padding mask)
    peers: dict[str, nn.Module] = {"torch.nn.Transformer": TorchTransformer(cfg, False)}
    if tgt_pad_mask_too:
        peers[TORCH_TGT_PAD] = TorchTransformer(cfg, tgt_pad_mask=True)
    if importlib.util.find_spec("transformers") is None:
        notes.append("MarianMTModel: transformers not installed (pip install -e '.[bench]')")
    else:
        peers["MarianMTModel"] = MarianLogits(cfg)
    if importlib.util.find_spec("eole") is None:
        notes.append("eole: not installed (pip install eole)")
    else:
        peers["eole"] = EoleLogits(cfg)
        notes.append(f"eole {importlib.metadata.version('eole')}: its EncoderDecoderModel")
    return peers


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="base")
    p.add_argument(
        "--model", default=None, help="a transformer/configs/model option (default: the preset's)"
    )
    p.add_argument("--vocab", type=int, default=None, help="the model's (default: the preset's)")
    p.add_argument("--tokens", type=int, default=None, help="batch budget, padding included")
    p.add_argument("--dropout", type=float, default=None, help="default: the preset's")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a train.py override for ours and its variants (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--variant", nargs=2, action="append", default=[], metavar=("NAME", "OVERRIDES"),
        help="add 'ours, NAME': ours with these train.py overrides (repeatable)",
    )  # fmt: skip
    p.add_argument("--data", type=Path, default=None, help="a Multi30k folder: real batches")
    p.add_argument("--data-vocab", type=int, default=6000, help="SentencePiece pieces of --data")
    p.add_argument("--cache-dir", type=Path, default=Path("data/cache"), help="for --data")
    p.add_argument("--min-len", type=int, default=10, help="synthetic: shortest, eos included")
    p.add_argument("--max-len", type=int, default=60, help="synthetic: longest, eos included")
    p.add_argument(
        "--dtype", choices=["fp32", "bf16"], default=None,
        help="trainer.precision 32-true or bf16-mixed (default: the product's auto)",
    )  # fmt: skip
    p.add_argument(
        "--tgt-pad-mask-too", action="store_true",
        help=f"add '{TORCH_TGT_PAD}': torch.nn.Transformer given the target padding mask too",
    )  # fmt: skip
    p.add_argument("--no-peers", action="store_true", help="ours (and its variants) only")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--steps", type=int, default=50, help="timed batches (each system, each one)")
    p.add_argument("--warmup", type=int, default=2, help="extra untimed steps on the first batch")
    p.add_argument(
        "--profile-steps", type=int, default=20,
        help="steps of ours (and each variant) profiled for the time by category (0: none)",
    )  # fmt: skip
    p.add_argument(
        "--padding-only", action="store_true",
        help="print each system's batches' padding (of its products' FLOPs) and stop: no step",
    )  # fmt: skip
    p.add_argument(
        "--compose-only", action="store_true",
        help="compose and check ours and each variant as train.py does, print them and stop: no "
        "batch, no model, no step",
    )  # fmt: skip
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's peak")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="every step, as JSON")
    p.add_argument(
        "--dry-run", action="store_true",
        help="the tiny preset on CPU, 4 timed batches: every code path in seconds",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.compose_only and (args.padding_only or args.dry_run):
        p.error("--compose-only composes the preset's config: not with --padding-only or --dry-run")
    if args.profile_steps < 0:
        p.error(f"--profile-steps {args.profile_steps}: a number of steps, 0 or more")
    if args.dry_run:
        args.preset, args.device, args.steps, args.warmup = "tiny", "cpu", 4, 1
        args.profile_steps = min(args.profile_steps, 2)
        args.peak_tflops = args.peak_tflops or 1.0
        args.threads = args.threads or 1  # OpenMP threads stall on a shared machine
    return args


def overrides(args: argparse.Namespace, device: torch.device) -> list[str]:
    """The train.py overrides of ours: the preset's, then the options', then --set's."""
    out = list(PRESETS[args.preset])
    out.append(f"trainer.accelerator={'gpu' if device.type == 'cuda' else 'cpu'}")
    if args.model is not None:
        out.append(f"model={args.model}")
    if args.vocab is not None:
        out += [f"model.src_vocab_size={args.vocab}", f"model.tgt_vocab_size={args.vocab}"]
    if args.tokens is not None:
        out.append(f"data.max_tokens={args.tokens}")
    if args.dropout is not None:
        out.append(f"model.dropout={args.dropout}")
    if args.dtype is not None:
        out.append(f"trainer.precision={'bf16-mixed' if args.dtype == 'bf16' else '32-true'}")
    if args.data is not None:
        out += [
            "data=multi30k", f"data.root={args.data.resolve()}", "data.download=false",
            f"data.vocab_size={args.data_vocab}", f"data.cache_dir={args.cache_dir.resolve()}",
            "data.num_workers=0",
        ]  # fmt: skip
    out.append(f"seed={args.seed}")
    return [*out, *args.set]


@dataclass(frozen=True)
class PlannedStep:
    phase: str  # warm, timed, profile (the one-step profile) or categories
    batch: int  # index in the timed batches
    turn: int  # even: the systems in the fixed order, odd: in its reverse


def plan(timed: Sequence[Batch], warmup: int, profile_steps: int) -> list[PlannedStep]:
    """The steps of a product system's fit: the first batch --warmup times, the first batch of
    each timed shape (the warm pass), every timed batch, the first batch profiled alone, then
    --profile-steps timed batches profiled for the time by category."""
    first: dict[tuple, int] = {}
    for i, b in enumerate(timed):
        first.setdefault((tuple(b.src.shape), tuple(b.labels.shape)), i)
    steps = [PlannedStep("warm", 0, 0)] * warmup
    steps += [PlannedStep("warm", i, k) for k, i in enumerate(first.values())]
    steps += [PlannedStep("timed", i, i) for i in range(len(timed))]
    steps += [PlannedStep("profile", 0, 0)]
    return steps + [PlannedStep("categories", i % len(timed), 0) for i in range(profile_steps)]


def shapes(batch: Batch) -> tuple[tuple[int, int], tuple[int, int]]:
    return tuple(batch.src.shape), tuple(batch.labels.shape)


class Run:
    """One bench run: every step kept (:attr:`log`), each system's memory rise, profiles."""

    def __init__(self, device: torch.device, peers: dict[str, Callable[[Batch], Tensor]]) -> None:
        self.device, self.peers = device, peers
        self.timer = StepTimer(device)
        self.log: list[Step] = []
        self.rise: dict[str, int] = {}
        self.profiles: dict[str, StepProfile | None] = {}
        self.categories: dict[str, dict[str, float]] = {}

    def keep(self, name: str, step: PlannedStep, batch: Batch, position: int, s: float) -> None:
        self.log.append(Step(step.phase, name, step.batch, position, *shapes(batch),
                             batch.num_tgt_tokens, s))  # fmt: skip
        self.rise[name] = max(self.rise.get(name, 0), self.timer.rise)

    def peer(self, name: str, step: PlannedStep, batch: Batch, position: int) -> None:
        seconds = self.timer(lambda: self.peers[name](batch))
        self.keep(name, step, batch, position, seconds)

    def fit(
        self, name: str, system: Product, timed: list[Batch], args: argparse.Namespace,
        with_peers: bool,
    ) -> None:  # fmt: skip
        """``system``'s fit over its plan; ``with_peers``, the peers' steps on the same batches,
        before or after its step as the batch's turn orders them."""
        steps = plan(timed, args.warmup, args.profile_steps)
        order = [name, *(self.peers if with_peers else [])]
        first_category = next((k for k, s in enumerate(steps) if s.phase == "categories"), None)
        state: dict[str, object] = {}

        def turn(k: int) -> tuple[list[str], int]:
            names = order if steps[k].turn % 2 == 0 else order[::-1]
            return names, names.index(name)

        def before(k: int) -> None:
            if k == first_category:
                state["categories"] = profiler(self.device).__enter__()
            if steps[k].phase in ("warm", "timed"):
                names, mine = turn(k)
                for position, peer in enumerate(names[:mine]):
                    self.peer(peer, steps[k], timed[steps[k].batch], position)

        def around(k: int):
            if steps[k].phase == "profile":
                state["profile"] = ProfiledStep(self.device)
                return state["profile"]
            if steps[k].phase == "categories":
                return torch.profiler.record_function(STEP_MARK)
            return None

        def record(k: int, seconds: float) -> None:
            if steps[k].phase in ("warm", "timed"):
                self.keep(name, steps[k], timed[steps[k].batch], turn(k)[1], seconds)

        def after(k: int) -> None:
            if steps[k].phase in ("warm", "timed"):
                names, mine = turn(k)
                for position, peer in enumerate(names[mine + 1 :], start=mine + 1):
                    self.peer(peer, steps[k], timed[steps[k].batch], position)
            if k == len(steps) - 1 and first_category is not None:
                prof = state["categories"]
                prof.__exit__(None, None, None)
                self.categories[name] = categories(prof, self.device)

        clock = StepClock(self.timer, record, before, after, around)
        system.fit([timed[s.batch] for s in steps], clock)
        self.profiles[name] = state["profile"].result


class ProfiledStep:
    """A context that profiles the step inside it (:func:`one_step`): :attr:`result`."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.result = device, None
        self._prof = profiler(device)
        self._mark = torch.profiler.record_function(STEP_MARK)

    def __enter__(self) -> ProfiledStep:
        self._prof.__enter__()
        self._mark.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mark.__exit__(*exc)
        self._prof.__exit__(*exc)
        self.result = one_step(self._prof, self.device)


def make_batches(system: Product, args: argparse.Namespace, device: torch.device) -> list[Batch]:
    """``--steps`` training batches as ``system``'s config makes them, on ``device``."""
    cfg = system.cfg
    if args.data is not None:
        made = corpus_batches(cfg, args.steps)
    else:
        lengths = (args.min_len, args.max_len)
        vocab = system.model_cfg.src_vocab_size
        made = synthetic_batches(cfg.data, args.steps, vocab, lengths, args.seed)
    tensors = ("src", "tgt_in", "labels", "src_pad_mask")
    return [replace(b, **{f: getattr(b, f).to(device) for f in tensors}) for b in made]


def peer_state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Parameters (tied ones once) and optimizer state: what a model holds between steps."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    return params + sum(t.numel() * t.element_size() for t in state)


def row(
    name: str,
    run: Run,
    cfg: TransformerConfig,
    batches: list[Batch],
    parameters: int,
    state_bytes: Callable[[], int],
    peak: float | None,
    product_system: bool,
) -> Row:
    """A system's row from its timed steps (on ``batches``)."""
    mine = [s for s in run.log if s.phase == "timed" and s.system == name]
    seconds = [s.seconds for s in mine]
    total = sum(seconds)
    tflops = sum(batch_flops(cfg, batches[s.batch]) for s in mine) / total / 1e12
    memory = (state_bytes() + run.rise[name]) / 2**20 if run.device.type == "cuda" else None
    p10, p50, p90 = (float(x) * 1e3 for x in np.percentile(seconds, [10, 50, 90]))
    return Row(
        name, parameters, sum(s.tokens for s in mine) / total, (p10, p50, p90), tflops,
        tflops / peak if peak else None, memory, None, run.profiles.get(name),
        run.categories.get(name), padding_share(cfg, batches) if product_system else None,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> Result:
    args = parse_args(argv)
    bound_kernel_caches()  # oneDNN's kernel caches as train() bounds them
    if args.threads:
        torch.set_num_threads(args.threads)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    if device.type == "cpu":
        keep_freed_memory()  # glibc's heap as train() sets it: the process's, the peers' too
    notes: list[str] = []
    base = overrides(args, device)
    configs = {OURS: base, **{f"ours, {n}": [*base, *shlex.split(e)] for n, e in args.variant}}
    if args.compose_only:
        for name, changes in configs.items():
            print(composed(name, changes))
        return Result([], notes)
    systems = {name: product(changes) for name, changes in configs.items()}
    ours = systems[OURS]
    cfg = ours.model_cfg
    precision = resolve_precision(ours.cfg.trainer)
    dtype = precision_dtype(precision)

    batches: dict[str, list[Batch]] = {}
    made: dict[str, list[Batch]] = {}  # by data config: systems with the same one share them
    for name, system in systems.items():
        key = json.dumps(OmegaConf.to_container(system.cfg.data, resolve=True), sort_keys=True)
        if key not in made:
            made[key] = make_batches(system, args, device)
        batches[name] = made[key]
    if args.padding_only:
        for name, system in systems.items():
            share = padding_share(system.model_cfg, batches[name])
            shapes = len({tuple(b.src.shape) for b in batches[name]})
            print(f"{name}: {share:.1%} of the matrix products' FLOPs on padding "
                  f"({len(batches[name])} batches, {shapes} shapes)")  # fmt: skip
        return Result([], notes)

    peers = {} if args.no_peers else build_peers(cfg, notes, args.tgt_pad_mask_too)
    steps: dict[str, Callable[[Batch], Tensor]] = {}
    opts: dict[str, torch.optim.Optimizer] = {}
    autocast = autocast_factory(device, dtype)
    for name, model in peers.items():
        model.to(device).train()
        opts[name] = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        loss = logits_loss(model, float(ours.cfg.loss.label_smoothing))
        steps[name] = lambda b, loss=loss, opt=opts[name]: train_step(
            loss, opt, as_tensors(b), b.num_tgt_tokens, autocast
        )

    run = Run(device, steps)
    for name, system in systems.items():  # the peers alongside ours; each variant alone
        run.fit(name, system, batches[name], args, with_peers=name == OURS)
    for name, step in steps.items():  # one more step each, under the profiler
        try:
            run.profiles[name] = profile_step(lambda step=step: step(batches[OURS][0]), device)
        except Exception as err:  # a profiler that fails must not cost the timings
            run.profiles[name] = None
            notes.append(f"{name}: torch.profiler failed ({type(err).__name__}: {err})")

    peak = args.peak_tflops or peak_tflops(device, "fp32" if dtype == torch.float32 else "bf16")
    rows = [
        row(name, run, system.model_cfg, batches[name], system.parameters, system.state_bytes,
            peak, product_system=True)
        for name, system in systems.items()
    ]  # fmt: skip
    for name, model in peers.items():
        parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        state = lambda model=model, opt=opts[name]: peer_state_bytes(model, opt)  # noqa: E731
        rows.append(row(name, run, cfg, batches[OURS], parameters, state, peak, False))
    for r in rows[1:]:
        r.ratio = rows[0].tokens_per_s / r.tokens_per_s
    result = Result(rows, notes, run.log)
    report(args, ours, device, precision, peak, batches[OURS], result)
    if args.out is not None:
        write_steps(args.out, args, ours, device, precision, result)
    return result


def composed(name: str, changes: list[str]) -> str:
    """A system's config as ``train.py`` composes and checks it (a bad option raises here), in
    a line: its model, precision and compile setting, and its overrides."""
    with tempfile.TemporaryDirectory() as out:  # the run directory it names; nothing is written
        cfg = compose_config(changes, Path(out))
    m = model_config(cfg)
    return (
        f"{name}: d_model={m.d_model} heads={m.num_heads} layers={m.num_encoder_layers}+"
        f"{m.num_decoder_layers} d_ff={m.d_ff} vocab={m.tgt_vocab_size} "
        f"precision={cfg.trainer.precision} compile={cfg.get('compile')}; "
        f"train.py {' '.join(changes)}"
    )


def environment(device: torch.device) -> str:
    """Device, torch, CUDA and cuDNN versions, and the flash-attention implementation."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    flash = getattr(torch.nn.attention, "current_flash_attention_impl", lambda: None)()
    return (
        f"device={name} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"cuda={torch.version.cuda} cudnn={cudnn} flash_impl={flash}"
    )


def report(
    args: argparse.Namespace,
    ours: Product,
    device: torch.device,
    precision: str,
    peak: float | None,
    batches: list[Batch],
    result: Result,
) -> None:
    def pad_share(field: str) -> float:
        tensors = [getattr(b, field) for b in batches]
        return 1 - sum(int(t.ne(PAD_ID).sum()) for t in tensors) / sum(t.numel() for t in tensors)

    cfg, data = ours.model_cfg, ours.cfg.data
    n = len(batches)
    if args.peak_tflops:
        peak_source = "given (--peak-tflops)"
    elif device.type == "cuda":
        peak_source = "datasheet, dense"
    else:
        peak_source = "measured: best of 10 2048x2048 matmuls"
    source = f"Multi30k in {args.data} ({args.data_vocab} pieces)" if args.data else "synthetic"
    flops = sum(batch_flops(cfg, b) for b in batches)
    print(
        f"{environment(device)}\nours: train.py {' '.join(overrides(args, device))}\n"
        f"precision={precision} compile={ours.cfg.get('compile')} "
        f"d_model={cfg.d_model} heads={cfg.num_heads} layers={cfg.num_encoder_layers}+"
        f"{cfg.num_decoder_layers} d_ff={cfg.d_ff} vocab={cfg.tgt_vocab_size} dropout="
        f"{cfg.dropout} label_smoothing={ours.cfg.loss.label_smoothing} clip="
        f"{ours.cfg.trainer.gradient_clip_val}\nbatches: {source}, budget {data.max_tokens} "
        f"tokens, padded to multiples of {data.pad_to_multiple}, {data.num_buckets} buckets; per "
        f"batch on average {sum(len(b) for b in batches) / n:.0f} sentences, "
        f"{sum(int(b.src.ne(PAD_ID).sum()) for b in batches) / n:,.0f} source and "
        f"{sum(b.num_tgt_tokens for b in batches) / n:,.0f} target tokens, padding "
        f"{pad_share('src'):.1%} (source) {pad_share('labels'):.1%} (target), "
        f"{result.rows[0].padding:.1%} of the matrix products' FLOPs; "
        f"{flops / n / 1e12:.3f} model TFLOP/step\n"
        f"steps: a warm pass over every batch shape + {args.warmup} for every system, then "
        f"{n} timed batches per system, the systems in a fixed order and its reverse "
        f"alternately (variants of ours in fits of their own); "
        f"{'CUDA events' if device.type == 'cuda' else 'wall clock'}; peak "
        + (f"{peak:.3g} TFLOP/s ({peak_source})" if peak else "unknown (pass --peak-tflops)")
    )
    print(
        "| system | parameters | target tokens/s | step ms p10 / p50 / p90 | TFLOP/s | MFU "
        "| peak memory | SDPA | ours / system |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in result.rows:
        memory = f"{r.peak_memory_mib:,.0f} MiB" if r.peak_memory_mib is not None else "n/a"
        mfu = f"{r.mfu:.1%}" if r.mfu is not None else "n/a"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        ms = " / ".join(f"{x:.3g}" for x in r.step_ms)
        print(
            f"| {r.name} | {r.parameters / 1e6:.1f}M | {r.tokens_per_s:,.0f} | {ms} | "
            f"{r.tflops:.3g} | {mfu} | {memory} | {sdpa_label(r.profile)} | {ratio} |"
        )
    print(
        "tokens/s, TFLOP/s, MFU: all timed tokens and FLOPs over all timed seconds; ours / "
        "system: ours's target tokens/s over the system's. Ours is the product's training step "
        "(projection fused with the loss, non-pad positions only, clipping, its schedule), the "
        "peers a plain loop with cross entropy on full (B, T, V) logits. MarianMTModel is "
        "post-norm with its own embedding scale; torch.nn.Transformer runs pre-norm like ours."
    )
    kernels = "CUDA kernels" if device.type == "cuda" else "operators (leaves)"
    print(f"\none step under torch.profiler (batch 0)\n| system | {kernels} | GPU busy | host ms |")
    print("|---|---|---|---|")
    for r in result.rows:
        p = r.profile
        if p is None:
            print(f"| {r.name} | profiler failed | | |")
            continue
        busy = f"{p.gpu_busy:.0%}" if p.gpu_busy is not None else "n/a"
        print(f"| {r.name} | {p.kernels} | {busy} | {p.host_ms:.1f} |")
    for r in result.rows:
        if r.profile is not None and r.profile.attention_kernels:
            print(f"{r.name}: attention kernels {', '.join(r.profile.attention_kernels)}")
    profiled = [r for r in result.rows if r.categories]
    if profiled:
        steps = profiled[0].categories["steps"]
        work = "GPU kernels" if device.type == "cuda" else "CPU operators"
        print(
            f"\nms a step by category ({work}; {steps:.0f} profiled steps; bench/step_profile.py)"
        )
        print("| system | " + " | ".join(CATEGORIES) + " | step |")
        print("|---|" + "---|" * (len(CATEGORIES) + 1))
        for r in profiled:
            cells = [r.categories[c] for c in CATEGORIES]
            total = sum(cells)
            print(f"| {r.name} | " + " | ".join(f"{x:.2f} ({x / total:.0%})" for x in cells)
                  + f" | {total:.2f} |")  # fmt: skip
    if device.type == "cpu":
        print("peak memory: n/a on CPU (one process's peak RSS cannot be split between systems)")
    for note in result.notes:
        print(note)


def sdpa_label(profile: StepProfile | None) -> str:
    """The SDPA backends of a profiled step, e.g. ``flash x18``; ``none`` for attention by hand."""
    if profile is None:
        return "?"
    return ", ".join(f"{k} x{v}" for k, v in sorted(profile.sdpa.items())) or "none"


def write_steps(
    path: Path,
    args: argparse.Namespace,
    ours: Product,
    device: torch.device,
    precision: str,
    result: Result,
) -> None:
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = {
        "environment": environment(device),
        "dtype": precision,
        "options": options,
        "overrides": overrides(args, device),
        "batch_tokens": ours.cfg.data.max_tokens,
        "model": ours.model_cfg.to_dict(),
        "systems": [asdict(r) for r in result.rows],
        "notes": result.notes,
        "steps": [asdict(s) for s in result.steps],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
