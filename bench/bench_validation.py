"""What one validation costs, part by part, for a trained checkpoint on its validation split: the
loss pass, greedy decoding of every sentence for val/bleu (at each --max-tokens budget: the
validation batches' size, validation.max_tokens), BLEU scoring, and one attention-map analysis at
the recipe's settings (transformer/configs/callbacks/default.yaml; --maps changes them, and the
table's first line names the changes): what it costs the training thread (the data: probes
translated, maps captured, head statistics, the explorer's record, samples) and the figures drawn in
the worker process, as the training callback does; and, for comparison, the same figures drawn on
the training thread (as before 2026-11-25).

    python bench/bench_validation.py OUT/checkpoints/last.ckpt --data ../shared/data/multi30k
    python bench/bench_validation.py CKPT --data DIR --device cuda --max-tokens 4096,32768
    python bench/bench_validation.py CKPT --data DIR --maps "types=[cross]" --maps num_probes=1

Each part runs --rounds times, the budgets alternating; the table shows the median seconds (the
worker's first drawing includes starting its process).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch
from lightning.fabric.utilities import move_data_to_device
from omegaconf import OmegaConf

from transformer.analysis.callback import AttentionMapsCallback
from transformer.analysis.figures import Drawing, draw
from transformer.checkpoints import load_checkpoint, tokenizer_models
from transformer.configs import CONFIG_DIR
from transformer.data.datamodule import TranslationDataModule, stored_settings
from transformer.errors import one_line_errors
from transformer.metrics import score_translations
from transformer.training import TranslationModule
from transformer.translate import decode_batch

REPO = Path(__file__).resolve().parents[1]


def timed(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """Seconds of ``fn()`` (the device synchronised on both sides) and its result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def datamodule(ckpt: dict, path: Path, data: Path, budget: int, cache: Path):
    """The checkpoint's data settings and tokenizers, its validation batches at ``budget``."""
    settings = stored_settings(ckpt)
    settings |= dict(root=str(data), download=False, num_workers=0, cache_dir=str(cache),
                     validation_max_tokens=budget)  # fmt: skip
    dm = TranslationDataModule(**settings)
    models = tokenizer_models(ckpt)
    dm.use_tokenizers(models["src"], models["tgt"], checkpoint=path)
    dm.setup("validate")
    return dm


def validation_loss(module: TranslationModule, batches: list) -> float:
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for batch in batches:
            loss_sum, nll_sum, ntok = module._loss(batch)
            sums += torch.stack([loss_sum.double(), nll_sum.double(), ntok.double()]).cpu()
    return float(sums[0] / sums[2])


def decode_all(module: TranslationModule, dm: TranslationDataModule, batches: list) -> list[str]:
    """validation_step's decoding: every sentence of every batch, in corpus order."""
    hyps: dict[int, str] = {}
    with torch.no_grad():
        for batch in batches:
            out = decode_batch(
                module.model, dm.tgt_tokenizer, batch.src, module.decoding, batch.src_pad_mask
            )
            for i, best in zip(batch.ids.tolist(), out, strict=True):
                hyps[i] = best[0].text if best else ""
    return [hyps[i] for i in sorted(hyps)]


class Inline:
    """Stands in for the callback's figure worker: keeps the job, to be drawn right here."""

    job: Drawing | None = None

    def submit(self, job: Drawing) -> None:
        self.job = job


def map_options(changes: list[str], p: argparse.ArgumentParser) -> dict:
    """The attention-map callback's options: the recipe's, with ``--maps KEY=VALUE`` changes."""
    recipe = OmegaConf.load(CONFIG_DIR / "callbacks" / "default.yaml").attention_maps
    del recipe["_target_"], recipe["out_dir"]  # the callback's class, the bench's own folder
    for change in changes:
        if "=" not in change or change.split("=", 1)[0] not in recipe:
            p.error(f"--maps {change}: KEY=VALUE of an attention-map option, one of "
                    f"{', '.join(recipe)}")  # fmt: skip
    return OmegaConf.to_container(OmegaConf.merge(recipe, OmegaConf.from_dotlist(changes)))


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("ckpt", type=Path, help="a checkpoint written by train.py")
    p.add_argument("--data", type=Path, required=True, help="the corpus folder (data.root)")
    p.add_argument("--cache-dir", type=Path, default=Path("data/cache"))
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--max-tokens", default="4096,32768", help="validation batch budgets")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--maps", action="append", default=[], metavar="KEY=VALUE",
        help="an attention-map option other than the recipe's (callbacks.attention_maps.KEY of "
        "train.py), e.g. num_probes=1; repeatable",
    )  # fmt: skip
    args = p.parse_args(argv)
    options = map_options(args.maps, p)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ckpt = load_checkpoint(args.ckpt)
    module = TranslationModule(**ckpt["hyper_parameters"])
    module.load_state_dict(ckpt["state_dict"])
    module.to(device).eval()
    budgets = [int(b) for b in args.max_tokens.split(",")]
    dms = {b: datamodule(ckpt, args.ckpt, args.data, b, args.cache_dir) for b in budgets}
    loaders = {
        b: [move_data_to_device(x, device) for x in dm.val_dataloader()] for b, dm in dms.items()
    }
    dm = dms[budgets[0]]
    references = dm.references("val")
    trainer = SimpleNamespace(datamodule=dm, global_step=0, loggers=[])
    seconds: dict[str, list[float]] = {}

    def record(name: str, s: float) -> None:
        seconds.setdefault(name, []).append(s)

    with tempfile.TemporaryDirectory() as tmp:
        callback = AttentionMapsCallback(out_dir=tmp, **options)
        worker, inline = callback._worker, Inline()
        for r in range(args.rounds):
            for b in budgets if r % 2 == 0 else budgets[::-1]:
                n = len(loaders[b])
                s, _ = timed(lambda b=b: validation_loss(module, loaders[b]), device)
                record(f"validation loss, {b}-token batches ({n})", s)
                s, hyps = timed(lambda b=b: decode_all(module, dms[b], loaders[b]), device)
                record(f"greedy decoding of {len(hyps)} sentences, {b}-token batches ({n})", s)
            s, scores = timed(lambda h=hyps: score_translations(h, references), device)
            record("BLEU, BLEU -lc and chrF (sacreBLEU)", s)
            trainer.global_step = 2 * r + 1  # a map validation, as the callback does it
            callback._worker = worker
            s, _ = timed(lambda: callback._analyse(trainer, module), device)
            record("attention maps: the training thread", s)
            start = time.perf_counter()
            while not (done := worker.finished()):
                time.sleep(0.02)
            record(
                "attention maps: the worker process (figures, page)", time.perf_counter() - start
            )
            if isinstance(done[0][1], BaseException):
                raise done[0][1]
            trainer.global_step = 2 * r + 2  # as before: data and figures on the training thread
            callback._worker = inline
            s, _ = timed(lambda: callback._analyse(trainer, module), device)
            d, _ = timed(lambda: draw(inline.job), device)
            record("attention maps, all on the training thread (before)", s + d)
        worker.close()
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    cpu = f"{torch.get_num_threads()} threads" if device.type == "cpu" else ""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {cpu}"
    print(f"{args.ckpt}: val BLEU {scores.bleu:.2f}, {len(references)} sentences; {name}; "
          f"torch {torch.__version__}; median of {args.rounds} rounds"
          + "".join(f"; maps {m}" for m in args.maps))  # fmt: skip
    print("| part of a validation | seconds |\n|---|---:|")
    for part, value in medians.items():
        print(f"| {part} | {value:.2f} |")
    return medians


if __name__ == "__main__":
    with one_line_errors():  # a bad checkpoint or file: one line, as train.py's
        main()
