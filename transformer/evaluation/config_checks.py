"""evaluate's composed Hydra config checked before any work, as training's is
(:mod:`transformer.training.config_checks`): a bad option fails at once, before a model is
loaded or a file written, with one :class:`ConfigError` line naming it (as typed on the command
line) and the fix.

:func:`validate_evaluate_config` first checks each option's value against the type its owner
annotates (:func:`check_types`), then one check per option: the decoding's
(:class:`transformer.decoding.DecodeOptions`), the analysis's
(:mod:`transformer.analysis.options`), the modes' (:func:`check_modes`: what evaluate does, and
the guides' and references' checks, :func:`transformer.evaluation.guides.check_guides` and
:func:`transformer.evaluation.references.check_references`), and a model's
(:func:`check_model_options`: device, weights' type, engine). What needs the checkpoint (its
files, its corpus, its model) or the state of ``output=`` is checked where it is read.
Light: no Lightning (the ``data.*`` types load the data module, which imports it, only when a
``data.*`` option is given).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer.analysis.options import check_analysis, check_analysis_options
from transformer.data.corpora import CorpusTexts
from transformer.decoding import DecodeOptions
from transformer.decoding.runtime import use_graphs
from transformer.device import decoding_device, decoding_dtype
from transformer.errors import ConfigError
from transformer.evaluation.guides import check_guides
from transformer.evaluation.references import check_references
from transformer.export.ct2_translate import CT2Translator, check_options
from transformer.metrics import check_tokenize
from transformer.option_types import check_type, option_types

FILE = str | None  # a file's path (input=-: standard input); null: none
# Each option's type: the parameter of the object that takes it, or its type where evaluate()
# takes it itself. The options whose own check refuses any value it cannot take, by name, are
# left to it (ensemble, score, force, input_chunk, scoring.*, decode.*, dtype, engine, analysis,
# analysis_options.*, metrics.tokenize: :func:`check_modes` and the checks it runs).
OWNED_OPTIONS: dict[str, tuple[Any, str] | Any] = {
    "ckpt_path": str | list[str],  # checkpoints (or a glob), or engine=ctranslate2's directory
    "split": (CorpusTexts.pairs, "split"),
    "direction": (CorpusTexts.pairs, "direction"),
    "input": FILE,
    "output": FILE,
    "reference": FILE,
    "hypotheses": FILE,
    "constraints": FILE,
    "prefixes": FILE,
    "device": (decoding_device, "name"),
    "ctranslate2.compute_type": (CT2Translator, "compute_type"),
    "ctranslate2.threads": (CT2Translator, "threads"),
    "ctranslate2.exact_limits": (CT2Translator, "exact_limits"),
    "paths.output_dir": str,
}
GROUPS = ("metrics", "scoring", "ctranslate2", "decode", "analysis_options", "data", "paths")
# data.*'s owner: the data module, built from the checkpoint's settings with those given
# (transformer.data.datamodule.checkpoint_texts); named, so that it is imported when checked
DATA_MODULE = "transformer.data.datamodule.TranslationDataModule"
ENGINES = ("torch", "ctranslate2")
_ABSENT = object()


def validate_evaluate_config(cfg: DictConfig) -> tuple[DecodeOptions, int]:
    """Check every option that can be checked without a model; return the decoding options and
    ``decode.max_tokens``."""
    check_types(cfg)
    options, max_tokens = decode_options(OmegaConf.to_container(cfg.decode))  # type: ignore[arg-type]
    analysis = cfg.get("analysis")
    check_analysis(analysis)
    check_modes(cfg, options, analysis)
    if cfg.hypotheses is None:  # (hypotheses=FILE: translations made elsewhere, no model)
        check_model_options(cfg, options, analysis)
    check_analysis_options(analysis, cfg.analysis_options)
    return options, max_tokens


def check_types(cfg: DictConfig) -> None:
    """Each group a mapping, each option of :data:`OWNED_OPTIONS` and each ``data.*`` option
    given against the type its owner annotates, so that ``input=[a,b]`` or ``device=1`` fails
    naming the option, its value and the type expected."""
    for group in GROUPS:
        node = cfg.get(group)
        if not isinstance(node, DictConfig):
            check_type(group, _plain(node), dict[str, Any])
    for option, owner in OWNED_OPTIONS.items():
        value = OmegaConf.select(cfg, option, default=_ABSENT)  # ckpt_path=??? (hypotheses=)
        hint = option_types(owner[0]).get(owner[1]) if isinstance(owner, tuple) else (owner, None)
        if value is not _ABSENT and hint is not None:
            check_type(option, _plain(value), *hint)
    check_data_types(cfg.data)


def _plain(value: Any) -> Any:
    """A config value as its owner gets it: lists and mappings as Python's."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def check_data_types(data: DictConfig) -> None:
    """The ``data.*`` options given (not null) against the data module's annotations
    (:data:`DATA_MODULE`; its own checks of their values run once the checkpoint's settings are
    read)."""
    given = {k: v for k, v in _plain(data).items() if v is not None}
    hints = option_types(DATA_MODULE) if given else {}
    for key, value in given.items():
        if key in hints:
            check_type(f"data.{key}", value, *hints[key])


def decode_options(settings: dict[str, Any]) -> tuple[DecodeOptions, int]:
    """The ``decode`` options: the search, and ``max_tokens``, source tokens per batch (how
    sentences are batched, not how each is decoded)."""
    settings = dict(settings)
    max_tokens = settings.pop("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"decode.max_tokens must be an integer >= 1, got {max_tokens!r}")
    return DecodeOptions.from_dict(settings, prefix="decode"), max_tokens


def check_modes(cfg: DictConfig, options: DecodeOptions, analysis: str | None) -> None:
    """The options that choose what evaluate does, checked together; the guides'
    (:func:`check_guides`) and the references' (:func:`check_references`)."""
    engine = cfg.get("engine", "torch")
    for name in ("ensemble", "score", "force"):
        if not isinstance(cfg[name], bool):
            raise ConfigError(f"{name} must be true or false, got {cfg[name]!r}")
    chunk = cfg.input_chunk
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f"input_chunk must be an integer >= 1 (lines), got {chunk!r}")
    len_penalty, per_token = cfg.scoring.len_penalty, cfg.scoring.per_token
    if isinstance(len_penalty, bool) or not isinstance(len_penalty, (int, float)):
        raise ConfigError(f"scoring.len_penalty must be a number, got {len_penalty!r}")
    if not isinstance(per_token, bool):
        raise ConfigError(f"scoring.per_token must be true or false, got {per_token!r}")
    if engine == "ctranslate2":
        for wrong, name in ((cfg.ensemble, "ensemble=true"), (cfg.score, "score=true")):
            if wrong:
                raise ConfigError(f"{name} runs our decoder; use engine=torch")
        check_options(options)
    if analysis is not None and (cfg.ensemble or cfg.score):
        raise ConfigError(
            f"analysis={analysis} reads one model's attention on the split; leave out "
            "ensemble=true and score=true"
        )
    check_output(cfg)
    if cfg.input not in (None, "-") and not Path(str(cfg.input)).is_file():
        raise ConfigError(f"input={cfg.input}: no such file")
    check_tokenize(cfg.metrics.tokenize)
    check_guides(cfg, options, analysis)
    check_references(cfg, options, analysis)


def check_output(cfg: DictConfig) -> None:
    """``output=FILE``: where input=FILE's translations or score=true's scores go, plain text."""
    if cfg.output is not None and cfg.input is None and not cfg.score:
        raise ConfigError(
            f"output={cfg.output} is where input=FILE's translations or score=true's scores go; "
            "a split's translations go to hypotheses.txt in the run directory (hydra.run.dir)"
        )
    if cfg.output is not None and str(cfg.output).endswith(".gz"):
        raise ConfigError(
            f"output={cfg.output}: results are written as plain text, a chunk at a time (so that "
            "a killed run resumes); give a name without .gz, and gzip the file once it is done"
        )


def check_model_options(cfg: DictConfig, options: DecodeOptions, analysis: str | None) -> None:
    """A run with a model: its device, the weights' type and CUDA graphs (each checked by the
    function that picks it), and the engine (:func:`check_ct2`)."""
    device = decoding_device(cfg.device)
    decoding_dtype(cfg.dtype, device)
    use_graphs(options, device)  # decode.graphs=true needs a GPU
    engine = cfg.get("engine", "torch")
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine}: choose torch or ctranslate2")
    if engine == "ctranslate2":
        check_ct2(cfg, analysis)


def check_ct2(cfg: DictConfig, analysis: str | None) -> None:
    """engine=ctranslate2: no analysis (our model's attention), and the weights' type the
    export's (``ctranslate2.compute_type``), not ``dtype``'s."""
    if analysis is not None:
        raise ConfigError(f"analysis={analysis} reads our model's attention; use engine=torch")
    if cfg.dtype not in ("auto", "float32"):
        raise ConfigError(
            f"dtype={cfg.dtype} is for engine=torch; with engine=ctranslate2 set "
            "ctranslate2.compute_type (int8, bfloat16, ...) or export with --quantization"
        )
