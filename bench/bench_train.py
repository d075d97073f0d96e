"""Training speed: ours vs torch.nn.Transformer vs Hugging Face MarianMTModel (vs eole).

Every system is built with the same sizes, trains from scratch on the same token-budget batches,
alternating step by step (the order rotates each step), and runs a training step: forward, label-
smoothed cross entropy over the non-pad targets (fp32 log-probabilities), backward, AdamW (fused
on CUDA). The peers' loss is torch's cross entropy on their full (B, T, V) logits, as a Hugging
Face or fairseq loop computes it; ours is its own training loss (TranslationModule's): the output
projection fused with the loss, in chunks, over the non-pad positions only (transformer/loss.py).
--full-logits-too adds a system "ours, full logits": a copy of ours trained with the peers' loss,
which times our model alone and, against ours, what the fused loss gains. --tgt-pad-mask-too
adds "torch.nn.Transformer, target padding mask": torch's model given the target padding mask,
as users usually call it (causality alone guards right-padded targets, so the others go
without). Per system, each the median over the timed steps (robust to a busy machine's
stalls): target (non-pad) tokens/s, achieved model TFLOP/s and MFU, and the per-batch speed
ratio ours / system; and peak memory.

    python bench/bench_train.py                          # base; bf16 on a GPU, fp32 on CPU
    python bench/bench_train.py --model big --compile
    python bench/bench_train.py --model tiny --device cpu --tokens 4000 --steps 5
    python bench/bench_train.py --model base --vocab 8000 --full-logits-too --tgt-pad-mask-too

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
                         sinusoidal positions, a final logits bias. Our loss on its logits.
  eole                   when installed (pip install eole): its EncoderDecoderModel of the same
                         sizes (bench/common.py): pre-norm, shared and tied embeddings,
                         sinusoidal positions; on CPU its attention is its own matmul-softmax
                         code (it uses PyTorch's fused kernel on GPUs only).

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
  Not counted: embedding lookups and positions, biases, layer norms, softmax, dropout, the loss
  and the optimizer.

MFU = model FLOPs / step time / peak FLOP/s. GPU peaks are dense (no sparsity) datasheet figures
picked from torch.cuda.get_device_name(): bf16 runs against the bf16 peak; fp32 runs, whose
matrix multiplications use TF32 (allow_tf32), against the TF32 peak. On CPU the peak is measured:
the best of a few large matrix multiplications in the run's precision. --peak-tflops overrides.

Peak memory (CUDA): the model's parameters and optimizer state, plus the largest rise of
torch.cuda.max_memory_allocated above the allocation at the start of its steps (activations,
gradients, temporaries; no gradients are kept between steps). On CPU: n/a, because the process's
peak RSS cannot be split between systems that alternate in one process.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.util
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

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

# Dense TFLOP/s (no sparsity): name fragment of torch.cuda.get_device_name(), bf16, tf32, fp32.
# The first match wins. fp32 (non-tensor-core) peaks are listed for reference only.
GPU_PEAKS = (
    ("H100 PCIe", 756.0, 378.0, 51.0),
    ("H100", 989.0, 495.0, 67.0),  # SXM
    ("H200", 989.0, 495.0, 67.0),  # the H100 SXM's compute (GH200 too)
    ("A100", 312.0, 156.0, 19.5),
)


@dataclass
class Row:
    name: str
    parameters: int
    tokens_per_s: float  # target (non-pad) tokens/s, median over the timed steps
    tflops: float  # achieved model TFLOP/s, median over the timed steps
    mfu: float | None
    peak_memory_mib: float | None  # None on CPU
    ratio: float | None  # ours / this system, median of per-batch ratios; None for ours


@dataclass
class Result:
    rows: list[Row]
    notes: list[str]  # systems skipped, and why


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


FULL_LOGITS = "ours, full logits"  # a copy of ours trained with the peers' loss
TORCH_TGT_PAD = "torch.nn.Transformer, target padding mask"  # as users usually call it


def build_systems(
    cfg: TransformerConfig,
    notes: list[str],
    full_logits_too: bool = False,
    tgt_pad_mask_too: bool = False,
) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    systems: dict[str, nn.Module] = {"ours": Transformer(cfg)}
    if full_logits_too:
        systems[FULL_LOGITS] = copy.deepcopy(systems["ours"])
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=list(SIZES), default="base")
    p.add_argument("--vocab", type=int, default=None, help="default: tiny 1k, small 8k, else 32k")
    p.add_argument("--tokens", type=int, default=25000, help="batch budget, padding included")
    p.add_argument("--min-len", type=int, default=10, help="shortest sentence, eos included")
    p.add_argument("--max-len", type=int, default=60, help="longest sentence, eos included")
    p.add_argument("--pad-to-multiple", type=int, default=1)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: bf16 on CUDA")
    p.add_argument("--compile", action="store_true", help="torch.compile each model")
    p.add_argument(
        "--full-logits-too", action="store_true",
        help=f"add '{FULL_LOGITS}': a copy of ours trained with the peers' loss",
    )  # fmt: skip
    p.add_argument(
        "--tgt-pad-mask-too", action="store_true",
        help=f"add '{TORCH_TGT_PAD}': torch.nn.Transformer given the target padding mask too",
    )  # fmt: skip
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--steps", type=int, default=10, help="timed steps per system")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (compilation) first")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's peak")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch default)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


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
    systems = build_systems(cfg, notes, args.full_logits_too, args.tgt_pad_mask_too)
    opts, params, losses = {}, {}, {}
    for name, model in systems.items():
        model.to(device).train()
        params[name] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        opts[name] = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        runner = torch.compile(model) if args.compile else model
        if name == "ours":
            losses[name] = own_loss(model, runner, args.label_smoothing)
        else:
            losses[name] = logits_loss(runner, args.label_smoothing)
    autocast = autocast_factory(device, dtype)

    lengths = (args.min_len, args.max_len)
    batches = make_batches(
        args.warmup + args.steps, args.tokens, cfg.tgt_vocab_size, lengths,
        args.pad_to_multiple, args.seed,
    )  # fmt: skip
    batches = [tuple(t.to(device) for t in b) for b in batches]
    timed = batches[args.warmup :]
    counts = [int(b[2].ne(PAD_ID).sum()) for b in batches]  # on the host, as the collator does
    tokens = counts[args.warmup :]
    flops = [batch_flops(cfg, b) for b in timed]

    names = list(systems)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    rise: dict[str, int] = dict.fromkeys(names, 0)
    for i, batch in enumerate(batches):
        k = i % len(names)
        for name in names[k:] + names[:k]:  # alternate on the same batch, rotating the order
            synchronize(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            train_step(losses[name], opts[name], batch, counts[i], autocast)
            synchronize(device)
            elapsed = time.perf_counter() - start
            if device.type == "cuda":
                rise[name] = max(rise[name], torch.cuda.max_memory_allocated(device) - base)
            if i >= args.warmup:
                seconds[name].append(elapsed)

    peak = args.peak_tflops or peak_tflops(device, dtype)
    rows = []
    for name in names:
        rate = statistics.median(n / t for n, t in zip(tokens, seconds[name], strict=True))
        tflops = statistics.median(f / t for f, t in zip(flops, seconds[name], strict=True)) / 1e12
        memory = None
        if device.type == "cuda":
            memory = (state_bytes(systems[name], opts[name]) + rise[name]) / 2**20
        ratio = None
        if name != "ours":
            ratio = statistics.median(
                b / a for a, b in zip(seconds["ours"], seconds[name], strict=True)
            )
        rows.append(
            Row(name, params[name], rate, tflops, tflops / peak if peak else None,
                memory, ratio)
        )  # fmt: skip
    report(args, cfg, device, dtype, peak, batches, timed, flops, rows, notes)
    return Result(rows, notes)


def report(
    args: argparse.Namespace,
    cfg: TransformerConfig,
    device: torch.device,
    dtype: str,
    peak: float | None,
    batches: list[Batch],
    timed: list[Batch],
    flops: list[int],
    rows: list[Row],
    notes: list[str],
) -> None:
    def pad_share(side: int) -> float:
        return 1 - sum(int(b[side].ne(PAD_ID).sum()) for b in batches) / sum(
            b[side].numel() for b in batches
        )

    n = len(timed)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if args.peak_tflops:
        peak_source = "given (--peak-tflops)"
    elif device.type == "cuda":
        peak_source = "datasheet, dense" + (", TF32" if dtype == "fp32" else "")
    else:
        peak_source = f"measured: best of 10 2048x2048 {dtype} matmuls"
    print(
        f"device={name} threads={torch.get_num_threads()} dtype={dtype} compile={args.compile} "
        f"torch={torch.__version__}\nmodel={args.model}: d_model={cfg.d_model} "
        f"heads={cfg.num_heads} layers={cfg.num_encoder_layers}+{cfg.num_decoder_layers} "
        f"d_ff={cfg.d_ff} vocab={cfg.tgt_vocab_size} (shared, tied) dropout={cfg.dropout} "
        f"label_smoothing={args.label_smoothing}\nbatches: budget {args.tokens} tokens, "
        f"lengths {args.min_len}-{args.max_len}; per timed batch on average "
        f"{sum(b[0].size(0) for b in timed) / n:.0f} sentences, "
        f"{sum(int(b[0].ne(PAD_ID).sum()) for b in timed) / n:,.0f} source and "
        f"{sum(int(b[2].ne(PAD_ID).sum()) for b in timed) / n:,.0f} target tokens, "
        f"padding {pad_share(0):.1%} (source) {pad_share(2):.1%} (target); "
        f"{sum(flops) / n / 1e12:.3f} model TFLOP/step\n"
        f"steps: {args.warmup} warm-up + {args.steps} timed per system; peak "
        + (f"{peak:.3g} TFLOP/s ({peak_source})" if peak else "unknown (pass --peak-tflops)")
    )
    print("| system | parameters | target tokens/s | peak memory | TFLOP/s | MFU | ours / system |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        memory = f"{r.peak_memory_mib:,.0f} MiB" if r.peak_memory_mib is not None else "n/a"
        mfu = f"{r.mfu:.1%}" if r.mfu is not None else "n/a"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        print(
            f"| {r.name} | {r.parameters / 1e6:.1f}M | {r.tokens_per_s:,.0f} | {memory} | "
            f"{r.tflops:.3g} | {mfu} | {ratio} |"
        )
    print(
        "medians over the timed steps; ratio: system's step time / ours on the same batch. "
        "MarianMTModel is post-norm "
        "with its own embedding scale; torch.nn.Transformer runs pre-norm like ours. Ours trains "
        "with its own loss (projection fused with the loss, non-pad positions only), the others "
        "with cross entropy on full (B, T, V) logits."
    )
    if device.type == "cpu":
        print("peak memory: n/a on CPU (one process's peak RSS cannot be split between systems)")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
