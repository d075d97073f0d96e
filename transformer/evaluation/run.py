"""``evaluate(cfg)``: score a checkpoint (or an ensemble) on a corpus split, translate a text file
of any size (and score it against ``reference=FILE``), score given translations (forced decoding),
or score a file of translations made elsewhere (``hypotheses=FILE reference=FILE``, no model).

Scores are sacreBLEU's (BLEU, lowercased BLEU, chrF, chrF++, TER, with signatures; BLEU's
tokenizer ``metrics.tokenize``) from :func:`transformer.metrics.score_translations`, the function
training's ``val/bleu`` uses. Files (``input=``, and forced scores) are processed a chunk of lines
at a time and resumable (:mod:`transformer.evaluation.streaming`). Every option is checked
first, before any work (:func:`transformer.evaluation.config_checks.validate_evaluate_config`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import IO, Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer.allocator import bound_kernel_caches
from transformer.atomic import atomic_write_text
from transformer.checkpoints import checkpoint_paths
from transformer.data.corpora import CorpusTexts
from transformer.data.source_tokens import uses_target_tokens
from transformer.decoding import DecodeOptions
from transformer.decoding.runtime import backend, use_graphs, use_static_search
from transformer.device import decoding_device, decoding_dtype, dtype_name
from transformer.errors import ConfigError
from transformer.evaluation.config_checks import validate_evaluate_config
from transformer.evaluation.files import (
    RESULTS,
    check_outputs,
    files_read,
    score_pairs,
    translate_file,
)
from transformer.evaluation.guides import ConstraintsMet, named_guides, split_guides
from transformer.evaluation.references import score_hypotheses, score_translated
from transformer.export.ct2_translate import CT2Translator
from transformer.metrics import score_translations
from transformer.translate import Translator, load_translator

log = logging.getLogger(__name__)


def decoding_backend(options: DecodeOptions, device: torch.device, dtype: torch.dtype) -> str:
    """How our decoder runs on ``device`` (attention kernel, static shapes, CUDA graphs, the
    whole search step)."""
    whole_step = use_static_search(options, device, use_cache=True)
    return backend(torch.empty(0, device=device), dtype, use_graphs(options, device), whole_step)


def _torch_translator(
    cfg: DictConfig, device: torch.device, dtype: torch.dtype
) -> tuple[Translator, dict[str, Any], list[str]]:
    """engine=torch: the translator of the checkpoints ``ckpt_path`` (their average, or with
    ``ensemble=true`` each its own model), the first checkpoint, and the paths."""
    paths = checkpoint_paths(cfg.ckpt_path)
    translator, ckpt = load_translator(paths, cfg.ensemble, device, dtype)
    return translator, ckpt, paths


def _ct2_translator(
    cfg: DictConfig, device: torch.device
) -> tuple[CT2Translator, dict[str, Any], list[str]]:
    """engine=ctranslate2: the translator of the model directory ``ckpt_path``, a stand-in
    checkpoint holding its data settings, and the directory as the one path."""
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


def evaluate(cfg: DictConfig, stdout: IO[bytes] | None = None) -> dict[str, Any]:
    """Translate and score as configured; write hypotheses.txt (and metrics.json) to
    ``cfg.paths.output_dir``; return the metrics. With ``input``, translate its lines into
    ``output`` (default: the run directory's hypotheses.txt); with ``score=true``, score given
    translations into ``output`` (default: scores.txt); either returns where they went
    (:mod:`transformer.evaluation.files`), and with ``reference``, input's translations are
    scored against it. With ``hypotheses`` and ``reference``, score those translations, without
    a model (:mod:`transformer.evaluation.references`). With ``analysis=heads|maps``, run that
    analysis on the split instead (see :mod:`transformer.analysis.run`).

    ``stdout`` (evaluate.py's standard output): without ``output`` (and ``reference``), input's
    translations and score=true's scores go there as well as to the run directory's file, each
    chunk once it is written, flushed; ``input=-``'s as its lines arrive."""
    options, max_tokens = validate_evaluate_config(cfg)  # every option, before any work
    decode_settings = OmegaConf.to_container(cfg.decode)
    analysis = cfg.get("analysis")
    out_dir = Path(cfg.paths.output_dir)
    if cfg.hypotheses is not None:  # translations made elsewhere: no model
        check_outputs(cfg, out_dir, [str(cfg.hypotheses), str(cfg.reference)])
        _clear_results(out_dir)
        return score_hypotheses(cfg, out_dir)
    device = decoding_device(cfg.device)
    dtype = decoding_dtype(cfg.dtype, device)
    bound_kernel_caches()  # shapes change at almost every step: a peak RSS flat in the input
    engine = cfg.get("engine", "torch")
    checkpoints = [cfg.ckpt_path] if engine == "ctranslate2" else checkpoint_paths(cfg.ckpt_path)
    check_outputs(cfg, out_dir, files_read(cfg, checkpoints))
    _clear_results(out_dir)
    if engine == "ctranslate2":
        translator, ckpt, paths = _ct2_translator(cfg, device)
    else:  # torch (validate_evaluate_config refuses any other)
        translator, ckpt, paths = _torch_translator(cfg, device, dtype)

    texts = cache(partial(_texts, ckpt, cfg.data, paths[0]))  # the corpus, built when needed
    prefix = _source_prefix(cfg, ckpt.get("datamodule_hyper_parameters") or {}, texts)
    if prefix:  # a multilingual model: its target token before each source line without one
        translator.src_tokenizer = translator.src_tokenizer.with_prefix(prefix, unless_written=True)
    echo = stdout if cfg.output is None and cfg.reference is None else None
    if cfg.score:
        result = score_pairs(cfg, translator, max_tokens, out_dir, texts, echo)
        return {**result, "scoring": OmegaConf.to_container(cfg.scoring), "checkpoints": paths}
    if cfg.input is not None:
        result = translate_file(cfg, translator, options, max_tokens, out_dir, echo)
        result = {**result, "decode": decode_settings, "checkpoints": paths}
        return result if cfg.reference is None else score_translated(cfg, result, out_dir)
    corpus = texts()
    if analysis is not None:
        from transformer.analysis.run import run_analysis  # (matplotlib: only for the figures)

        split = corpus.pairs(cfg.split, cfg.direction)
        return run_analysis(
            analysis, translator, split.src, split.tgt, cfg.analysis_options, out_dir
        )
    run = {  # how the translations were made, for metrics.json
        "decode": decode_settings,
        "engine": engine,
        "device": str(device),
        "dtype": translator.compute_type if engine == "ctranslate2" else dtype_name(dtype),
        "backend": "ctranslate2"
        if engine == "ctranslate2"
        else decoding_backend(options, device, dtype),
        "checkpoints": paths,
        "ensemble": cfg.ensemble,
        "prefixes": cfg.prefixes,
    }
    return _score_split(cfg, translator, corpus, options, max_tokens, out_dir, run)


def _clear_results(out_dir: Path) -> None:
    """The run directory, without an earlier run's results (:data:`RESULTS`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in RESULTS:
        (out_dir / name).unlink(missing_ok=True)


def _score_split(
    cfg: DictConfig,
    translator: Translator | CT2Translator,
    corpus: CorpusTexts,
    options: DecodeOptions,
    max_tokens: int,
    out_dir: Path,
    run: dict[str, Any],
) -> dict[str, Any]:
    """The split's translations (hypotheses.txt) and their scores, with ``run`` (metrics.json)."""
    pairs = corpus.pairs(cfg.split, cfg.direction)
    guides = split_guides(cfg, len(pairs.src))  # prefixes=, constraints= (our engine's alone)
    start = time.perf_counter()
    with named_guides(cfg):
        translated = translator.translate(pairs.src, options, max_tokens, **guides)
    hypotheses = [t[0].text for t in translated]  # on the host: done
    seconds = time.perf_counter() - start
    if "constraints" in guides:
        met = ConstraintsMet(cfg)
        met.count(hypotheses, guides["constraints"], translator.tgt_tokenizer)
        run = {**run, "constraints": met.record()}
    metrics = {
        **score_translations(hypotheses, pairs.tgt, cfg.metrics.tokenize).to_dict(),
        "split": corpus.split_name(cfg.split, cfg.direction),  # the name
        "direction": cfg.direction or corpus.directions[0],
        "translate_seconds": round(seconds, 3),  # tokenize, decode, detokenize; not loading
        **run,
    }
    atomic_write_text(out_dir / "hypotheses.txt", "".join(h + "\n" for h in hypotheses))
    atomic_write_text(out_dir / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    return metrics


def _source_prefix(
    cfg: DictConfig, settings: dict[str, Any], texts: Callable[[], CorpusTexts]
) -> tuple[str, ...]:
    """The tokens before each source line: the target token of ``direction``'s corpus, where the
    checkpoint's data ``settings`` or ``data.target_token`` put one. A token given for a model
    that records no corpus (an imported one), with none named, goes there as it is."""
    given = cfg.data.target_token
    if isinstance(given, str) and "source" not in settings and cfg.data.source is None:
        return (given,)
    merged = {**settings, **({} if given is None else {"target_token": given})}
    if cfg.direction is None and not uses_target_tokens(merged):
        return ()
    return texts().source_prefix(cfg.direction)


def _texts(ckpt: dict[str, Any], overrides: DictConfig, path: str) -> CorpusTexts:
    """The texts of the checkpoint's corpus, with the ``data.*`` options given in its place."""
    given = {k: v for k, v in OmegaConf.to_container(overrides).items() if v is not None}
    missing = ConfigError(
        f"{path} records no data settings; name the corpus, e.g. data.source=multi30k "
        "data.root=DIR data.src_lang=en data.tgt_lang=de"
    )  # (an invalid option: as training.build_datamodule reports the module's own check)
    from transformer.data.datamodule import checkpoint_texts  # (lightning: only to score a split)

    return checkpoint_texts(ckpt, given, missing, "invalid data option (data.*)")
