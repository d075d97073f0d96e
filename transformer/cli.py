"""The commands: ``transformer-train`` and ``transformer-evaluate`` (``python train.py`` and
``python evaluate.py`` in a clone run the same functions), Hydra apps over the configs installed
with the package (``pkg://transformer.configs``).

Every user error is one ``error: ...`` line and exit status 1: the project's own
(:class:`transformer.errors.UserError`) and Hydra's composition errors (a misspelt option or
group, an override that does not parse), which Hydra would otherwise print in several lines. Any
other exception is a bug and keeps its traceback; ``HYDRA_FULL_ERROR=1`` keeps Hydra's too.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import hydra
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf

from transformer.errors import UserError

CONFIGS = "pkg://transformer.configs"


def run(app: Callable[[], Any], config_name: str) -> None:
    """Run a Hydra ``app`` (its ``@hydra.main`` function) with Hydra's composition errors
    reduced to one ``error:`` line naming the option and the fix."""
    given = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises rather than printing its report
    try:
        app()
    except (ConfigCompositionException, MissingConfigException, OverrideParseException) as err:
        if given == "1":
            raise
        sys.exit(f"error: {composition_error(err, config_name)}")
    finally:
        if given is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = given


def composition_error(err: Exception, config_name: str) -> str:
    """Hydra's composition error in one line: the option, why, and the fix."""
    message = str(err).strip()
    if isinstance(err, OverrideParseException):
        why = f"{err.override}: not an override Hydra can read ({message.splitlines()[0]})"
        key, _, value = err.override.partition("=")
        if value and re.search("LexerNoViableAlt|token recognition error", message):
            # a character the grammar takes only in quotes, such as OPUS-MT's >>fra<<
            quoted = f"'{key}=\"{value}\"'"
            return f"{why}; quote the value for Hydra, inside the shell's quotes: {quoted}"
        return why
    if match := re.match(r"Could not override '([^']+)'", message):
        key = match[1]
        given = next((a for a in sys.argv[1:] if a.split("=", 1)[0] == key), key)
        near = _close_keys(key, config_name)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        return f"{given}: no such option{hint} (to add a new key, write +{given})"
    if match := re.match(r"Could not append to config\. An item is already at '([^']+)'", message):
        key = match[1]
        given = next((a for a in sys.argv[1:] if a.split("=", 1)[0] == f"+{key}"), f"+{key}")
        return f"{given}: {key} is an option already; set it without the +: {given[1:]}"
    if match := re.search(r"Could not find '([^'/]+)/([^']+)'", message):
        group, option = match[1], match[2]
        options = re.findall(r"^\t(\S+)$", message, re.M)
        choose = f"; choose one of {', '.join(options)}" if options else ""
        return f"{group}={option}: no such {group} option{choose}"
    first = message.splitlines()[0] if message else type(err).__name__
    return f"{first} (python {os.path.basename(sys.argv[0])} --help lists the options)"


def _close_keys(key: str, config_name: str) -> list[str]:
    """Options of the composed default config that look like ``key`` (a misspelling)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()  # (the failed app's)
    with contextlib.suppress(Exception):
        with initialize_config_module("transformer.configs", version_base="1.3"):
            cfg = compose(config_name)
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(node, DictConfig):
            near = difflib.get_close_matches(leaf, [str(k) for k in node], n=2, cutoff=0.6)
            return [f"{parent}.{n}" if parent else n for n in near]
    return []


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="train")
def _train(cfg: DictConfig) -> float | None:
    from transformer.training import train

    try:
        with contextlib.redirect_stdout(sys.stderr):  # progress bars and prints, as the log
            metrics = train(cfg)
    except UserError as err:  # the message names the fix; any other exception is a bug
        sys.exit(f"error: {err}")
    return metrics.get("val/bleu")  # for sweepers that optimise a value


def train_main() -> None:
    """``transformer-train [group=option ...] [key=value ...]`` (``python train.py``)."""
    from transformer.training import run_dir  # noqa: F401 (registers ${launch_name:...})

    run(_train, "train")


def _stdout_to_devnull() -> None:
    """Standard output, whose reader has gone, pointed at the null device: what Python still
    has to flush there at exit is dropped rather than reported."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="evaluate")
def _evaluate(cfg: DictConfig) -> None:
    from transformer.evaluation import evaluate
    from transformer.evaluation.report import scores_report

    results = sys.stdout.buffer  # translations and scores of files, written as they come
    try:  # stdout holds the results alone: what else prints while evaluating goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            result = evaluate(cfg, stdout=results)
    except UserError as err:  # bad options, checkpoints or data: the message says what to fix
        sys.exit(f"error: {err}")
    except BrokenPipeError:  # stdout's reader stopped reading (| head): stop quietly, as it asks
        _stdout_to_devnull()
        sys.exit(1)
    if "analysis" in result:
        print(f"analysis={result['analysis']}: written to {result['out_dir']}")
        return
    if "bleu" in result:  # scores: the split's translations, input='s (reference=), hypotheses='s
        print(scores_report(result))
        return
    if "output" in result and cfg.output is not None:  # input=...'s or score=true's: a file
        done = result["resumed_at"]
        before = f" ({done} before this run)" if done else ""
        print(f"{result['lines']} input lines{before}: {result['output']}")


def evaluate_main() -> None:
    """``transformer-evaluate ckpt_path=PATH [key=value ...]`` (``python evaluate.py``)."""
    run(_evaluate, "evaluate")
