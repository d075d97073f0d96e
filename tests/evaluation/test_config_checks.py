"""evaluate's options checked before any work (:mod:`transformer.evaluation.config_checks`), as
training's are: each top-level option of evaluate.yaml given a value of the wrong type is refused
in one line naming it, before a checkpoint is read or the run directory made."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.tiny import compose_eval_cfg
from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError
from transformer.evaluation import evaluate
from transformer.evaluation.config_checks import validate_evaluate_config

# Each top-level option of evaluate.yaml, a value of the wrong type for it, and the start of its
# message: a group given a scalar, or (decode, data, paths: names of config groups, whose options
# Hydra would compose) one of its options.
WRONG_TYPES = {
    "ckpt_path": ("ckpt_path={a: 1}", "ckpt_path={'a': 1}: expected a string or a list"),
    "ensemble": ("ensemble=maybe", "ensemble must be true or false, got 'maybe'"),
    "split": (
        "split=2017",
        """split=2017: expected a string; the command line read it as a """
        """number: quote it, 'split="2017"'""",
    ),
    "direction": ("direction=[en,de]", "direction=[en,de]: expected a string or null"),
    "input": ("input=[a.txt,b.txt]", "input=[a.txt,b.txt]: expected a string or null"),
    "output": ("output=[a.txt]", "output=[a.txt]: expected a string or null"),
    "reference": ("reference=[a.txt]", "reference=[a.txt]: expected a string or null"),
    "hypotheses": ("hypotheses=[a.txt]", "hypotheses=[a.txt]: expected a string or null"),
    "metrics": ("metrics=13a", "metrics=13a: expected a mapping"),
    "constraints": ("constraints=[a.jsonl]", "constraints=[a.jsonl]: expected a string or null"),
    "input_chunk": ("input_chunk=many", "input_chunk must be an integer >= 1 (lines), got 'many'"),
    "prefixes": ("prefixes=[a.txt]", "prefixes=[a.txt]: expected a string or null"),
    "score": ("score=maybe", "score must be true or false, got 'maybe'"),
    "scoring": ("scoring=1", "scoring=1: expected a mapping"),
    "device": ("device=1", "device=1: expected a string"),
    "dtype": ("dtype=16", "dtype=16 is not one of auto | float32 | bfloat16 | float16"),
    "engine": ("engine=1", "engine=1: choose torch or ctranslate2"),
    "ctranslate2": ("ctranslate2=int8", "ctranslate2=int8: expected a mapping"),
    "decode": ("decode.max_tokens=many", "decode.max_tokens must be an integer >= 1, got 'many'"),
    "analysis": ("analysis=1", "analysis=1: choose one of heads, maps, or null"),
    "analysis_options": ("analysis_options=200", "analysis_options=200: expected a mapping"),
    "data": ("data.root=[a,b]", "data.root=[a,b]: expected a string or null, e.g. data.root="),
    "paths": ("paths.output_dir=[a]", "paths.output_dir=[a]: expected a string"),
    "force": ("force=maybe", "force must be true or false, got 'maybe'"),
}
# Options inside the groups, each checked by its owner's type or its own check.
WRONG_GROUP_OPTIONS = [
    (["metrics.tokenize=[13a]"], "metrics.tokenize=['13a'] is not one of sacreBLEU's"),
    (["scoring.len_penalty=x"], "scoring.len_penalty must be a number, got 'x'"),
    (["scoring.per_token=maybe"], "scoring.per_token must be true or false, got 'maybe'"),
    (["ctranslate2.compute_type=[int8]"], "ctranslate2.compute_type=[int8]: expected a string"),
    (["ctranslate2.threads=x"], "ctranslate2.threads=x: expected an integer, e.g. ctranslate2."),
    (["ctranslate2.exact_limits=maybe"], "ctranslate2.exact_limits=maybe: expected true or false"),
    (["decode.beam_size=x"], "decode.beam_size must be an integer, got 'x'"),
    (["device=gpu"], "device=gpu is not a device; use auto, cpu or cuda"),
    (["+data.max_len=abc"], "data.max_len=abc: expected an integer, e.g. data.max_len=128"),
    (["data.download=maybe"], "data.download=maybe: expected true or false"),
    (["analysis=maps", "analysis_options.probes=two"], "analysis_options.probes='two' is not a "),
    (["analysis=heads", "analysis_options.prune_step=[1]"], "analysis_options.prune_step=[1] is"),
    (["analysis=heads", "analysis_options.normalize_by_layer=2"], "normalize_by_layer=2: true"),
    (["engine=ctranslate2", "analysis=heads"], "analysis=heads reads our model's attention"),
    (["engine=ctranslate2", "dtype=bfloat16", "device=cpu"], "dtype=bfloat16 is for engine=torch"),
]


def refused_before_any_work(overrides: list[str], tmp_path: Path) -> str:
    """evaluate's one-line ConfigError for ``overrides``, with a checkpoint that does not exist:
    the option is refused before it would be read (CheckpointError), or the run directory made."""
    run_dir = tmp_path / "run"
    cfg = compose_eval_cfg([f"ckpt_path={tmp_path / 'none.ckpt'}", *overrides], run_dir)
    with pytest.raises(ConfigError) as err:
        evaluate(cfg)
    assert not run_dir.exists()
    message = str(err.value)
    assert "\n" not in message
    return message


def test_every_top_level_option_has_a_wrong_type_case(tmp_path) -> None:
    assert set(compose_eval_cfg([], tmp_path)) == set(WRONG_TYPES)


@pytest.mark.parametrize("option", WRONG_TYPES)
def test_a_top_level_option_of_the_wrong_type_is_refused_by_name(option, tmp_path) -> None:
    override, message = WRONG_TYPES[option]
    refused = refused_before_any_work([override], tmp_path)
    assert refused.startswith(message), refused
    assert refused.startswith(option)


@pytest.mark.parametrize("overrides, message", WRONG_GROUP_OPTIONS, ids=lambda o: str(o))
def test_a_group_option_of_the_wrong_type_is_refused_by_name(overrides, message, tmp_path):
    refused = refused_before_any_work(overrides, tmp_path)
    assert re.search(re.escape(message), refused), refused


def test_validate_evaluate_config_returns_the_decoding_and_its_batches(tmp_path) -> None:
    given = ["ckpt_path=none.ckpt", "decode=greedy", "decode.max_tokens=64"]
    options, max_tokens = validate_evaluate_config(compose_eval_cfg(given, tmp_path))
    assert isinstance(options, DecodeOptions)
    assert (options.strategy, max_tokens) == ("greedy", 64)
    with pytest.raises(ConfigError, match=r"^split=2017: expected a string; .* 'split=\"2017\"'$"):
        validate_evaluate_config(compose_eval_cfg(["ckpt_path=none.ckpt", "split=2017"], tmp_path))


def test_scoring_translations_made_elsewhere_needs_no_checkpoint_options(tmp_path) -> None:
    """hypotheses=FILE reference=FILE (no ckpt_path, no model): the model's options are not
    checked, as before (device=cuda on a machine without a GPU is no error there)."""
    for name in ("h.txt", "r.txt"):
        (tmp_path / name).write_text("a dog\n")
    given = [f"hypotheses={tmp_path / 'h.txt'}", f"reference={tmp_path / 'r.txt'}", "device=cuda"]
    options, _ = validate_evaluate_config(compose_eval_cfg(given, tmp_path / "run"))
    assert options.strategy == "beam"
