"""``evaluate(cfg)``: score a checkpoint on a corpus split, or translate lines of text.

Scores are sacreBLEU's (BLEU, lowercased BLEU, chrF, with signatures) from
:func:`transformer.metrics.score_translations`, the function training's ``val/bleu`` uses.
"""

from __future__ import annotations

import glob
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from transformer.analysis.run import check_analysis, run_analysis
from transformer.atomic import atomic_write_text
from transformer.checkpoints import (
    load_or_average,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.data.datamodule import TranslationDataModule
from transformer.data.text_files import read_lines, split_lines
from transformer.decoding import DecodeOptions
from transformer.errors import CheckpointError, ConfigError
from transformer.export.ct2_translate import CT2Translator
from transformer.metrics import score_translations
from transformer.translate import Translator

log = logging.getLogger(__name__)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda, but no GPU is available; use device=cpu or device=auto")
    return torch.device(name)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str, device: torch.device) -> torch.dtype:
    """The weights' type while decoding (``dtype=``); log-probabilities and beam scores are
    float32 whatever it is (:class:`transformer.decoding.step.Stepper`)."""
    if name not in DTYPES:
        raise ConfigError(f"dtype={name} is not one of {' | '.join(DTYPES)}")
    if name == "float16" and device.type == "cpu":
        raise ConfigError("dtype=float16 is for GPUs (CPU float16 matmuls are slow); on CPU use "
                          "dtype=bfloat16")  # fmt: skip
    if name == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("dtype=bfloat16: this GPU does not support it; use dtype=float16")
    return DTYPES[name]


def checkpoint_paths(ckpt_path: Any) -> list[str]:
    """The checkpoints ``ckpt_path`` names: one path, a list, or glob patterns (sorted matches)."""
    given = list(ckpt_path) if isinstance(ckpt_path, (list, ListConfig)) else [ckpt_path]
    paths = []
    for entry in map(str, given):
        if glob.has_magic(entry):
            matches = sorted(glob.glob(entry))
            if not matches:
                raise CheckpointError(f"ckpt_path={entry} matches no file{_no_match_hint(entry)}")
            paths += matches
        else:
            paths.append(entry)
    return paths


def _no_match_hint(pattern: str) -> str:
    """Where the pattern's folder (or the one above) holds a ``last.ckpt``, as a training run's
    ``checkpoints/epochs/`` does: a run shorter than one epoch keeps no epoch checkpoints."""
    folder = Path(pattern).parent
    for last in (folder / "last.ckpt", folder.parent / "last.ckpt"):
        if not glob.has_magic(str(last)) and last.is_file():
            return (
                f"; {last} exists (epoch checkpoints are kept for complete epochs only, so a run "
                f"shorter than one epoch has none): evaluate it with ckpt_path={last}"
            )
    return ""


def _checkpoint(ckpt_path: Any) -> tuple[dict[str, Any], list[str]]:
    paths = checkpoint_paths(ckpt_path)
    return load_or_average(paths), paths


def _datamodule(ckpt: dict[str, Any], overrides: DictConfig, path: str) -> TranslationDataModule:
    settings = dict(ckpt.get("datamodule_hyper_parameters") or {})
    given = {k: v for k, v in OmegaConf.to_container(overrides).items() if v is not None}
    if not settings and "source" not in given:
        raise ConfigError(
            f"{path} records no data settings; name the corpus, e.g. data.source=multi30k "
            "data.root=DIR data.src_lang=en data.tgt_lang=de"
        )
    try:
        return TranslationDataModule(**{**settings, **given})
    except ValueError as err:  # as training.build_datamodule reports the module's own check
        raise ConfigError(f"invalid data option (data.*): {err}") from err


def _decode_options(settings: dict[str, Any]) -> tuple[DecodeOptions, int]:
    """The ``decode`` options: the search, and ``max_tokens``, source tokens per batch (how
    sentences are batched, not how each is decoded)."""
    settings = dict(settings)
    max_tokens = settings.pop("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"decode.max_tokens must be an integer >= 1, got {max_tokens!r}")
    return DecodeOptions.from_dict(settings, prefix="decode"), max_tokens


def _read_input(input_path: str) -> list[str]:
    """The lines to translate, as the corpus files are read: UTF-8 (a byte-order mark dropped),
    ``\\n`` or ``\\r\\n`` line ends only (a U+2028 inside a sentence stays in it), ``.gz``."""
    if input_path == "-":
        return split_lines(sys.stdin.buffer.read(), "input=-")
    if not Path(input_path).is_file():
        raise ConfigError(f"input={input_path}: no such file")
    return read_lines(input_path)


def _ct2_translator(
    cfg: DictConfig, device: torch.device, analysis: str | None
) -> tuple[CT2Translator, dict[str, Any], list[str]]:
    """engine=ctranslate2: the translator of the model directory ``ckpt_path``, a stand-in
    checkpoint holding its data settings, and the directory as the one path."""
    if analysis is not None:
        raise ConfigError(f"analysis={analysis} reads our model's attention; use engine=torch")
    if cfg.dtype != "float32":
        raise ConfigError(
            f"dtype={cfg.dtype} is for engine=torch; with engine=ctranslate2 set "
            "ctranslate2.compute_type (int8, bfloat16, ...) or export with --quantization"
        )
    model_dir = str(cfg.ckpt_path)
    if not Path(model_dir).is_dir():
        raise ConfigError(
            f"engine=ctranslate2 needs ckpt_path=DIR, a directory written by `python -m "
            f"transformer.export ct2`; {model_dir} is not a directory"
        )
    ct2 = cfg.ctranslate2
    translator = CT2Translator(
        model_dir, device.type, ct2.compute_type, ct2.threads, ct2.exact_limits
    )
    return translator, {"datamodule_hyper_parameters": translator.info["data"]}, [model_dir]


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Translate and score as configured; write hypotheses.txt (and metrics.json) to
    ``cfg.paths.output_dir``; return the metrics (or, with ``input``, the translations).
    With ``analysis=heads|maps``, run that analysis on the split instead (see
    :mod:`transformer.analysis.run`)."""
    decode_settings = OmegaConf.to_container(cfg.decode)
    options, max_tokens = _decode_options(decode_settings)  # checked before any work
    analysis = cfg.get("analysis")
    check_analysis(analysis)
    device = _device(cfg.device)
    dtype = _dtype(cfg.dtype, device)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("hypotheses.txt", "metrics.json"):  # a failed run leaves no earlier results
        (out_dir / name).unlink(missing_ok=True)
    engine = cfg.get("engine", "torch")
    if engine == "ctranslate2":
        translator, ckpt, paths = _ct2_translator(cfg, device, analysis)
    elif engine == "torch":
        ckpt, paths = _checkpoint(cfg.ckpt_path)
        src_tok, tgt_tok = tokenizers_from_checkpoint(ckpt, paths[0])
        model = model_from_checkpoint(ckpt, paths[0]).to(device, dtype)
        translator = Translator(model, src_tok, tgt_tok)
    else:
        raise ConfigError(f"engine={engine}: choose torch or ctranslate2")

    if cfg.input is not None:
        lines = _read_input(str(cfg.input))
        translations = translator.translate(lines, options, max_tokens)
        texts = [t.text for sentence in translations for t in sentence]
        atomic_write_text(out_dir / "hypotheses.txt", "".join(t + "\n" for t in texts))
        return {"translations": translations, "decode": decode_settings}

    datamodule = _datamodule(ckpt, cfg.data, paths[0])
    split = datamodule.split_names.get(cfg.split, cfg.split)
    sources, references = datamodule.sources(split), datamodule.references(split)
    if analysis is not None:
        return run_analysis(
            analysis, translator, sources, references, cfg.analysis_options, out_dir
        )
    start = time.perf_counter()
    translated = translator.translate(sources, options, max_tokens)
    hypotheses = [t[0].text for t in translated]  # on the host: done
    seconds = time.perf_counter() - start
    scores = score_translations(hypotheses, references)
    metrics = {
        "bleu": scores.bleu,
        "bleu_lc": scores.bleu_lc,
        "chrf": scores.chrf,
        "signature": {
            "bleu": scores.bleu_signature,
            "bleu_lc": scores.bleu_lc_signature,
            "chrf": scores.chrf_signature,
        },
        "split": split,
        "direction": f"{datamodule.src_lang}-{datamodule.tgt_lang}",
        "num_sentences": scores.num_sentences,
        "decode": decode_settings,
        "translate_seconds": round(seconds, 3),  # tokenize, decode, detokenize; not loading
        "engine": engine,
        "device": str(device),
        "dtype": translator.compute_type if engine == "ctranslate2" else cfg.dtype,
        "checkpoints": paths,
    }
    atomic_write_text(out_dir / "hypotheses.txt", "".join(h + "\n" for h in hypotheses))
    atomic_write_text(out_dir / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    return metrics
