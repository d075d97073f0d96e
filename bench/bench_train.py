"""Training speed: ours vs torch.nn.Transformer vs Hugging Face MarianMTModel (vs eole).

Every system is built with the same sizes, trains from scratch on the same token-budget batches
and runs a training step: forward, label-smoothed cross entropy over the non-pad targets (fp32
log-probabilities), backward, fused AdamW (every system, CPU too). The peers' loss is torch's
cross entropy on their full (B, T, V) logits, as a Hugging Face or fairseq loop computes it; ours
is its own training loss (TranslationModule's): the output projection fused with the loss, in
chunks, over the non-pad positions only (transformer/training/loss.py). --full-logits-too adds
"ours, full logits": a copy of ours trained with the peers' loss. --compiled-too adds "ours,
compiled": a copy of ours under torch.compile, beside the eager one. --positions-too P,... adds
"ours, positions=P": ours with another position encoding (model.positions), its own loss.
--tgt-pad-mask-too adds torch.nn.Transformer given the target padding mask, as users usually call it
(causality alone guards right-padded targets, so the others go without).

How it is timed:
  1. a warm pass: every distinct batch shape of the timed steps, once for every system (cuDNN's
     attention plans, torch.compile's graphs and the allocator's blocks are made here, not in a
     timed step), plus --warmup extra steps on the first batch;
  2. the timed steps: every batch, every system on it, the systems in a fixed order on even
     batches and in the reverse order on odd ones; each step alone (the device synchronised
     before it) and timed with CUDA events on a GPU, the wall clock on CPU;
  3. one more step of each system under torch.profiler: the SDPA backend that ran (the aten op
     each attention call dispatched to), and kernels a step, GPU busy share and host ms.

Per system: target tokens/s = all timed target tokens / all timed seconds; step time p10, p50, p90;
model TFLOP/s and MFU from the same totals; peak memory (CUDA); ours / system = the system's total
time over ours (the same batches). --out FILE keeps every step (warm and timed, with its batch
shape, order and seconds) as JSON.

    python bench/bench_train.py --preset base                 # bf16 on a GPU, fp32 on CPU
    python bench/bench_train.py --preset big --compiled-too
    python bench/bench_train.py --preset recipe --data data/multi30k --out steps.json
    python bench/bench_train.py --dry-run                     # tiny, CPU, seconds

Presets (--model, --vocab, --tokens, --dropout override them):
  base    transformer-base: 512 wide, 8 heads, 6+6 layers, FFN 2048, vocabulary 32k, 25k-token
          batches
  big     transformer-big: 1024 wide, 16 heads, 6+6, FFN 4096, vocabulary 32k, 25k-token batches
  recipe  the GPU recipe (experiment=multi30k_en_de): model=mini (128 wide, 4 heads, 4+4, FFN
          256, dropout 0.3), vocabulary 6k, 4,096-token batches
  tiny    the dry run's: 64 wide, 4 heads, 2+2, FFN 128, vocabulary 1k, 1,000-token batches

Batches: with --data DIR (a Multi30k folder), the project's own pipeline makes them
(TranslationDataModule: SentencePiece with --data-vocab pieces, the token-budget sampler and
collator, shuffled training batches); the model's vocabulary stays the preset's (ids index a
larger table, which costs the same). Without it: synthetic sentences, log-normal lengths around 25
pieces, length-bucketed into the budget.

Systems:
  ours                   transformer.Transformer: pre-norm, one embedding shared by encoder,
                         decoder and output projection, scaled by sqrt(d_model), sinusoidal
                         positions.
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
datasheet figures picked from torch.cuda.get_device_name(): bf16 runs against the bf16 peak; fp32
runs, whose matrix multiplications use TF32 (allow_tf32), against the TF32 peak. On CPU the peak is
measured: the best of a few large matrix multiplications in the run's precision. --peak-tflops
overrides.

Peak memory (CUDA): the model's parameters and optimizer state, plus the largest rise of
torch.cuda.max_memory_allocated above the allocation at the start of its steps (activations,
gradients, temporaries; no gradients are kept between steps). On CPU: n/a.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.util
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import numpy as np
import torch
from torch import Tensor, nn

from bench.common import (
    Batch,
    EoleLogits,
    MarianLogits,
    TorchTransformer,
    autocast_factory,
    logits_loss,
    own_loss,
    synchronize,
    train_step,
)
from transformer import Transformer, TransformerConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

# d_model, heads, encoder and decoder layers, FFN width, default vocabulary (base/big: a WMT-size
# joint BPE vocabulary; mini: the Multi30k recipes' model; small: an earlier Multi30k size; tiny:
# CPU tests).
SIZES = {
    "tiny": (64, 4, 2, 128, 1000),
    "mini": (128, 4, 4, 256, 6000),  # the Multi30k recipes' model=mini
    "small": (256, 4, 4, 1024, 8000),
    "base": (512, 8, 6, 2048, 32000),
    "big": (1024, 16, 6, 4096, 32000),
}


@dataclass(frozen=True)
class Preset:
    model: str
    vocab: int
    tokens: int  # batch budget, padding included
    dropout: float


PRESETS = {
    "base": Preset("base", 32000, 25000, 0.1),
    "big": Preset("big", 32000, 25000, 0.1),
    "recipe": Preset("mini", 6000, 4096, 0.3),  # experiment=multi30k_en_de
    "tiny": Preset("tiny", 1000, 1000, 0.1),
}

# Dense TFLOP/s (no sparsity): name fragment of torch.cuda.get_device_name(), bf16, tf32, fp32.
# The first match wins. fp32 (non-tensor-core) peaks are listed for reference only.
GPU_PEAKS = (
    ("H100 PCIe", 756.0, 378.0, 51.0),
    ("H100", 989.0, 495.0, 67.0),  # SXM
    ("H200", 989.0, 495.0, 67.0),  # the H100 SXM's compute (GH200 too)
    ("A100", 312.0, 156.0, 19.5),
)

# The aten op an SDPA call dispatches to, as torch.profiler names it -> its backend.
SDPA_BACKENDS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "mem-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "cpu-flash",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}

FULL_LOGITS = "ours, full logits"  # a copy of ours trained with the peers' loss
COMPILED = "ours, compiled"  # a copy of ours under torch.compile
POSITIONS = "ours, positions="  # + a model.positions value: ours with that position encoding
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
class StepProfile:
    """One step under torch.profiler. ``kernels``: CUDA kernels (on CPU: aten ops that call no
    other aten op); ``gpu_busy``: the share of the step's span (host start to the last kernel's
    end) when a kernel ran; ``host_ms``: the host's time to issue the step."""

    kernels: int
    gpu_busy: float | None
    host_ms: float
    sdpa: dict[str, int]  # backend -> forward calls
    attention_kernels: list[str]  # CUDA kernel names of attention (forward and backward)


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


@dataclass
class Result:
    rows: list[Row]
    notes: list[str]  # systems skipped, and why
    steps: list[Step] = field(default_factory=list)  # every step run, in order


def model_config(size: str, vocab: int | None, dropout: float) -> TransformerConfig:
    d_model, heads, layers, d_ff, default_vocab = SIZES[size]
    vocab = vocab or default_vocab
    return TransformerConfig(
        vocab, vocab, d_model=d_model, num_heads=heads, num_encoder_layers=layers,
        num_decoder_layers=layers, d_ff=d_ff, dropout=dropout, share_all_embeddings=True,
    )  # fmt: skip


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
    src, _, labels = batch
    src_lens = src.ne(PAD_ID).sum(1).tolist()
    tgt_lens = labels.ne(PAD_ID).sum(1).tolist()
    return train_flops(cfg, src_lens, tgt_lens)


def sentence_lengths(
    n: int, min_len: int, max_len: int, g: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Source and target lengths (eos included): log-normal around 25, clipped to the range;
    targets 0.9-1.3x their source, like subword pieces of news sentences."""
    median = min(max(25.0, min_len), max_len)
    src = (torch.randn(n, generator=g) * 0.45 + math.log(median)).exp()
    tgt = src * (0.9 + 0.4 * torch.rand(n, generator=g))
    return (
        src.round().long().clamp(min_len, max_len),
        tgt.round().long().clamp(min_len, max_len),
    )


def pack(src_len: Tensor, tgt_len: Tensor, max_tokens: int, multiple: int) -> list[Tensor]:
    """Sentence indices per batch: sorted by length, each batch within ``max_tokens`` counted as
    sentences x longest padded row on either side (the data module's budget)."""
    longest = torch.maximum(src_len, tgt_len)
    width = (longest + multiple - 1) // multiple * multiple
    order = torch.argsort(longest * 1000 + src_len, stable=True).tolist()
    batches, current = [], []
    for i in order:  # ascending: the newest sentence is the widest
        if current and (len(current) + 1) * int(width[i]) > max_tokens:
            batches.append(torch.tensor(current))
            current = []
        current.append(i)
    return batches  # the last, partial batch is left out


def fill(src_len: Tensor, tgt_len: Tensor, vocab: int, multiple: int, g: torch.Generator) -> Batch:
    """Right-padded random ids: source ... eos; decoder input bos ...; labels ... eos."""

    def padded(lengths: Tensor) -> Tensor:
        width = -(-int(lengths.max()) // multiple) * multiple
        ids = torch.randint(4, vocab, (lengths.numel(), width), generator=g)
        return ids.masked_fill(torch.arange(width) >= lengths.unsqueeze(1), PAD_ID)

    src = padded(src_len)
    src[torch.arange(src.size(0)), src_len - 1] = EOS_ID
    labels = padded(tgt_len)
    labels[torch.arange(labels.size(0)), tgt_len - 1] = EOS_ID
    tgt_in = torch.cat([torch.full((labels.size(0), 1), BOS_ID), labels[:, :-1]], 1)
    tgt_in = tgt_in.masked_fill(labels.eq(PAD_ID), PAD_ID)
    return src, tgt_in, labels


def make_batches(
    n: int, max_tokens: int, vocab: int, lengths: tuple[int, int], multiple: int, seed: int = 0
) -> list[Batch]:
    """``n`` length-bucketed batches drawn at random from a pool of packed sentences."""
    g = torch.Generator().manual_seed(seed)
    pool = max(n * max_tokens // lengths[0], 64)  # about 2.5 n full batches or more
    src_len, tgt_len = sentence_lengths(pool, *lengths, g)
    packed = pack(src_len, tgt_len, max_tokens, multiple)
    if len(packed) < n:
        raise ValueError(f"--tokens {max_tokens} gives only {len(packed)} batches, need {n}")
    chosen = torch.randperm(len(packed), generator=g)[:n].tolist()
    return [fill(src_len[packed[i]], tgt_len[packed[i]], vocab, multiple, g) for i in chosen]


def corpus_batches(
    root: Path, n: int, max_tokens: int, vocab: int, multiple: int, cache_dir: Path, seed: int
) -> list[Batch]:
    """The first ``n`` shuffled training batches of the Multi30k files in ``root`` (over as many
    epochs as that takes), as the project's data module makes them (SentencePiece with ``vocab``
    pieces, the token-budget sampler, the collator; tokenizer and token ids cached in
    ``cache_dir``)."""
    from transformer.data.datamodule import TranslationDataModule

    dm = TranslationDataModule(
        source="multi30k", root=str(root), vocab_size=vocab, max_tokens=max_tokens,
        pad_to_multiple=multiple, num_workers=0, seed=seed, cache_dir=str(cache_dir),
        download=False,
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    batches: list[Batch] = []
    while True:  # epoch after epoch (each reshuffled) while one holds fewer than n batches
        epoch = len(batches)
        for b in dm.train_dataloader():
            batches.append((b.src, b.tgt_in, b.labels))
            if len(batches) == n:
                return batches
        if len(batches) == epoch:
            raise ValueError(f"{root}: the training split at --tokens {max_tokens} has no batch")


def peak_tflops(device: torch.device, dtype: str, n: int = 2048, repeats: int = 10) -> float | None:
    """Datasheet peak for a known GPU (None for an unknown one); measured on CPU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment, bf16, tf32, _fp32 in GPU_PEAKS:
            if fragment in name:
                return bf16 if dtype == "bf16" else tf32
        return None
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(n, n, dtype=torch_dtype)
    b = torch.randn(n, n, dtype=torch_dtype)
    best = math.inf
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Parameters (tied ones once) and optimizer state: what a model holds between steps."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = opt.state.values()
    return params + sum(t.numel() * t.element_size() for s in state for t in s.values())


def build_systems(
    cfg: TransformerConfig,
    notes: list[str],
    full_logits_too: bool = False,
    tgt_pad_mask_too: bool = False,
    compiled_too: bool = False,
    peers: bool = True,
    positions_too: Sequence[str] = (),
) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    systems: dict[str, nn.Module] = {"ours": Transformer(cfg)}
    if full_logits_too:
        systems[FULL_LOGITS] = copy.deepcopy(systems["ours"])
    if compiled_too:
        systems[COMPILED] = copy.deepcopy(systems["ours"])
    for positions in positions_too:
        torch.manual_seed(0)
        systems[POSITIONS + positions] = Transformer(replace(cfg, positions=positions))
    if not peers:
        return systems
    # causal mask only, like ours and Marian (right-padded targets need no padding mask)
    systems["torch.nn.Transformer"] = TorchTransformer(cfg, tgt_pad_mask=False)
    if tgt_pad_mask_too:
        systems[TORCH_TGT_PAD] = TorchTransformer(cfg, tgt_pad_mask=True)
    if importlib.util.find_spec("transformers") is None:
        notes.append("MarianMTModel: transformers not installed (pip install -e '.[bench]')")
    else:
        systems["MarianMTModel"] = MarianLogits(cfg)
    if importlib.util.find_spec("eole") is None:
        notes.append("eole: not installed (pip install eole)")
    else:
        systems["eole"] = EoleLogits(cfg)
        notes.append(f"eole {importlib.metadata.version('eole')}: its EncoderDecoderModel")
    return systems


class StepTimer:
    """Seconds of one step: CUDA events around it on a GPU (the device idle before it and
    synchronised after), the wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def __call__(self, step: Callable[[], object]) -> float:
        if not self.cuda:
            start = time.perf_counter()
            step()
            return time.perf_counter() - start
        torch.cuda.synchronize()
        self.events[0].record()
        step()
        self.events[1].record()
        self.events[1].synchronize()
        return self.events[0].elapsed_time(self.events[1]) / 1e3


def profile_step(step: Callable[[], object], device: torch.device) -> StepProfile:
    """Run ``step`` once under torch.profiler: :class:`StepProfile`."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    with profile(activities=activities) as prof:
        with record_function("bench_step"):
            step()
        synchronize(device)
    events = prof.events()
    (mark,) = [e for e in events if e.name == "bench_step" and e.device_type == DeviceType.CPU]
    host = mark.time_range
    sdpa = Counter(SDPA_BACKENDS[e.name] for e in events if e.name in SDPA_BACKENDS)
    on_gpu = [e for e in events if e.device_type == DeviceType.CUDA]
    kernels = [
        e for e in on_gpu
        if not getattr(e, "is_user_annotation", False)  # record_function's GPU-side ranges
        and e.name != "bench_step" and not e.name.startswith(("Memcpy", "Memset"))
    ]  # fmt: skip
    if device.type != "cuda":  # the ops that do the work: aten ops calling no other aten op
        ops = [e for e in events if e.name.startswith("aten::")]
        leaves = [e for e in ops if not any(c.name.startswith("aten::") for c in e.cpu_children)]
        return StepProfile(len(leaves), None, host.elapsed_us() / 1e3, dict(sdpa), [])
    if not kernels:
        raise RuntimeError("the profile holds no CUDA kernel")
    busy, end = 0.0, host.start  # the union of the kernels' intervals
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        start = max(e.time_range.start, end)
        busy += max(0.0, e.time_range.end - start)
        end = max(end, e.time_range.end)
    span = max(end, host.end) - host.start
    attention = sorted({e.name[:120] for e in kernels if _attention_kernel(e.name)})
    return StepProfile(len(kernels), busy / span, host.elapsed_us() / 1e3, dict(sdpa), attention)


def _attention_kernel(name: str) -> bool:
    lowered = name.lower()
    return any(k in lowered for k in ("flash", "fmha", "attention", "sdpa", "cudnn"))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="base")
    p.add_argument("--model", choices=list(SIZES), default=None, help="default: the preset's")
    p.add_argument("--vocab", type=int, default=None, help="default: the preset's")
    p.add_argument("--tokens", type=int, default=None, help="batch budget, padding included")
    p.add_argument("--dropout", type=float, default=None, help="default: the preset's")
    p.add_argument("--data", type=Path, default=None, help="a Multi30k folder: real batches")
    p.add_argument("--data-vocab", type=int, default=6000, help="SentencePiece pieces of --data")
    p.add_argument("--cache-dir", type=Path, default=Path("data/cache"), help="for --data")
    p.add_argument("--min-len", type=int, default=10, help="synthetic: shortest, eos included")
    p.add_argument("--max-len", type=int, default=60, help="synthetic: longest, eos included")
    p.add_argument("--pad-to-multiple", type=int, default=1)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: bf16 on CUDA")
    p.add_argument("--compile", action="store_true", help="torch.compile every system")
    p.add_argument("--compile-mode", default=None, help="torch.compile's mode (default: its own)")
    p.add_argument("--compiled-too", action="store_true", help=f"add '{COMPILED}'")
    p.add_argument(
        "--full-logits-too", action="store_true",
        help=f"add '{FULL_LOGITS}': a copy of ours trained with the peers' loss",
    )  # fmt: skip
    p.add_argument(
        "--tgt-pad-mask-too", action="store_true",
        help=f"add '{TORCH_TGT_PAD}': torch.nn.Transformer given the target padding mask too",
    )  # fmt: skip
    p.add_argument(
        "--positions-too", default="", metavar="P,...",
        help=f"add '{POSITIONS}P' for each model.positions value P (learned, rope, relative)",
    )  # fmt: skip
    p.add_argument("--no-peers", action="store_true", help="ours (and its variants) only")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--steps", type=int, default=50, help="timed batches (each system, each one)")
    p.add_argument("--warmup", type=int, default=2, help="extra untimed steps on the first batch")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's peak")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="every step, as JSON")
    p.add_argument(
        "--dry-run", action="store_true",
        help="the tiny preset on CPU, 4 timed batches: every code path in seconds",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.dry_run:
        args.preset, args.device, args.steps, args.warmup = "tiny", "cpu", 4, 1
        args.peak_tflops = args.peak_tflops or 1.0
        args.threads = args.threads or 1  # OpenMP threads stall on a shared machine
    preset = PRESETS[args.preset]
    for name in ("model", "vocab", "tokens", "dropout"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
    return args


def main(argv: Sequence[str] | None = None) -> Result:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 runs: TF32 matrix multiplications
        torch.backends.cudnn.allow_tf32 = True
    cfg = model_config(args.model, args.vocab, args.dropout)
    notes: list[str] = []
    systems = build_systems(
        cfg, notes, args.full_logits_too, args.tgt_pad_mask_too, args.compiled_too,
        peers=not args.no_peers, positions_too=[p for p in args.positions_too.split(",") if p],
    )  # fmt: skip
    steps: dict[str, Callable[[Batch, int], Tensor]] = {}
    opts, params = {}, {}
    autocast = autocast_factory(device, dtype)
    for name, model in systems.items():
        model.to(device).train()
        params[name] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        opts[name] = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        compiled = args.compile or name == COMPILED
        runner = torch.compile(model, mode=args.compile_mode) if compiled else model
        if name in ("ours", COMPILED) or name.startswith(POSITIONS):
            loss = own_loss(model, runner, args.label_smoothing)
        else:
            loss = logits_loss(runner, args.label_smoothing)
        steps[name] = lambda batch, n, loss=loss, opt=opts[name]: train_step(
            loss, opt, batch, n, autocast
        )

    if args.data is not None:
        batches = corpus_batches(
            args.data, args.steps, args.tokens, args.data_vocab, args.pad_to_multiple,
            args.cache_dir, args.seed,
        )  # fmt: skip
    else:
        lengths = (args.min_len, args.max_len)
        batches = make_batches(
            args.steps, args.tokens, cfg.tgt_vocab_size, lengths, args.pad_to_multiple, args.seed
        )
    counts = [int(b[2].ne(PAD_ID).sum()) for b in batches]  # on the host, as the collator does
    flops = [batch_flops(cfg, b) for b in batches]
    batches = [tuple(t.to(device) for t in b) for b in batches]

    names = list(systems)
    timer = StepTimer(device)
    log: list[Step] = []
    rise: dict[str, int] = dict.fromkeys(names, 0)

    def run(phase: str, i: int, order: Sequence[str]) -> None:
        batch = batches[i]
        for position, name in enumerate(order):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            seconds = timer(lambda name=name: steps[name](batch, counts[i]))
            if device.type == "cuda":
                rise[name] = max(rise[name], torch.cuda.max_memory_allocated(device) - base)
            shapes = tuple(batch[0].shape), tuple(batch[2].shape)
            log.append(Step(phase, name, i, position, *shapes, counts[i], seconds))

    def order(i: int) -> list[str]:
        return names if i % 2 == 0 else names[::-1]  # the fixed order, then its reverse

    first_of_shape: dict[tuple, int] = {}
    for i, b in enumerate(batches):
        first_of_shape.setdefault((b[0].shape, b[2].shape), i)
    for _ in range(args.warmup):
        run("warm", 0, names)
    for k, i in enumerate(first_of_shape.values()):
        run("warm", i, order(k))
    for i in range(len(batches)):
        run("timed", i, order(i))

    profiles: dict[str, StepProfile | None] = {}
    for name in names:  # one more step each, under the profiler
        try:
            profiles[name] = profile_step(
                lambda name=name: steps[name](batches[0], counts[0]), device
            )
        except Exception as err:  # a profiler that fails must not cost the timings
            profiles[name] = None
            notes.append(f"{name}: torch.profiler failed ({type(err).__name__}: {err})")

    peak = args.peak_tflops or peak_tflops(device, dtype)
    timed = [s for s in log if s.phase == "timed"]
    total = {n: sum(s.seconds for s in timed if s.system == n) for n in names}
    rows = []
    for name in names:
        seconds = [s.seconds for s in timed if s.system == name]
        tflops = sum(flops) / total[name] / 1e12
        memory = None
        if device.type == "cuda":
            memory = (state_bytes(systems[name], opts[name]) + rise[name]) / 2**20
        p10, p50, p90 = (float(x) * 1e3 for x in np.percentile(seconds, [10, 50, 90]))
        rows.append(
            Row(name, params[name], sum(counts) / total[name], (p10, p50, p90), tflops,
                tflops / peak if peak else None, memory,
                None if name == "ours" else total[name] / total["ours"], profiles[name])
        )  # fmt: skip
    result = Result(rows, notes, log)
    report(args, cfg, device, dtype, peak, batches, flops, len(first_of_shape), result)
    if args.out is not None:
        write_steps(args.out, args, cfg, device, dtype, result)
    return result


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
    cfg: TransformerConfig,
    device: torch.device,
    dtype: str,
    peak: float | None,
    batches: list[Batch],
    flops: list[int],
    shapes: int,
    result: Result,
) -> None:
    def pad_share(side: int) -> float:
        return 1 - sum(int(b[side].ne(PAD_ID).sum()) for b in batches) / sum(
            b[side].numel() for b in batches
        )

    n = len(batches)
    if args.peak_tflops:
        peak_source = "given (--peak-tflops)"
    elif device.type == "cuda":
        peak_source = "datasheet, dense" + (", TF32" if dtype == "fp32" else "")
    else:
        peak_source = f"measured: best of 10 2048x2048 {dtype} matmuls"
    source = f"Multi30k in {args.data} ({args.data_vocab} pieces)" if args.data else "synthetic"
    print(
        f"{environment(device)}\ndtype={dtype} compile={args.compile} "
        f"compile_mode={args.compile_mode}\npreset={args.preset} model={args.model}: "
        f"d_model={cfg.d_model} heads={cfg.num_heads} layers={cfg.num_encoder_layers}+"
        f"{cfg.num_decoder_layers} d_ff={cfg.d_ff} vocab={cfg.tgt_vocab_size} (shared, tied) "
        f"dropout={cfg.dropout} label_smoothing={args.label_smoothing}\nbatches: {source}, "
        f"budget {args.tokens} tokens, padded to multiples of {args.pad_to_multiple}; per batch "
        f"on average {sum(b[0].size(0) for b in batches) / n:.0f} sentences, "
        f"{sum(int(b[0].ne(PAD_ID).sum()) for b in batches) / n:,.0f} source and "
        f"{sum(int(b[2].ne(PAD_ID).sum()) for b in batches) / n:,.0f} target tokens, "
        f"padding {pad_share(0):.1%} (source) {pad_share(2):.1%} (target); "
        f"{sum(flops) / n / 1e12:.3f} model TFLOP/step\n"
        f"steps: a warm pass over the {shapes} batch shapes + {args.warmup} for every system, "
        f"then {n} timed batches per system, the systems in a fixed order and its reverse "
        f"alternately; {'CUDA events' if device.type == 'cuda' else 'wall clock'}; peak "
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
        "system: the system's total time over ours on the same batches. Ours trains with its "
        "own loss (projection fused with the loss, non-pad positions only), the peers with "
        "cross entropy on full (B, T, V) logits. MarianMTModel is post-norm with its own "
        "embedding scale; torch.nn.Transformer runs pre-norm like ours."
    )
    kernels = "CUDA kernels" if device.type == "cuda" else "aten ops (leaves)"
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
    cfg: TransformerConfig,
    device: torch.device,
    dtype: str,
    result: Result,
) -> None:
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = {
        "environment": environment(device),
        "dtype": dtype,
        "options": options,
        "model": cfg.to_dict(),
        "systems": [asdict(r) for r in result.rows],
        "notes": result.notes,
        "steps": [asdict(s) for s in result.steps],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
