"""dev/bench_levers.py: every lever is a valid change of its recipe (CPU or GPU) that changes
what its overrides declare and nothing else, the options, the table, a dry run of one lever end to
end (train.py, then evaluate's scoring of its checkpoints), and the GPU mode's runs side by side,
stopped at a deadline and resumed."""

from __future__ import annotations

from typing import Any

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from dev.bench_levers import (
    GPU_COMMON,
    GPU_LEVERS,
    LEVERS,
    SCORED,
    main,
    max_time,
    overrides,
    parse_args,
    table,
)
from tests.tiny import compose_cfg
from transformer.training.config_checks import validate_config

pytestmark = [pytest.mark.bench, pytest.mark.heavy]  # a script of bench/ or dev/


def leaves(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A config's values by dotted key, interpolations unresolved (the vocabulary sizes stay
    ``${data.vocab_size}``: they follow the data's, they are not changed by a lever)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out |= leaves(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def changes_only_what_it_declares(lever: list[str], recipe: DictConfig, cfg: DictConfig) -> None:
    """A lever's overrides declare what it changes: each ``key=value`` a key of the recipe, set to
    that value (which the recipe does not have already), each ``group=option`` a config group it
    changes; no other key of the recipe moves."""
    old = leaves(OmegaConf.to_container(recipe))  # type: ignore[arg-type]
    new = leaves(OmegaConf.to_container(cfg))  # type: ignore[arg-type]
    declared: set[str] = set()
    for override in OverridesParser.create().parse_overrides(lever):
        key = override.key_or_group
        if key in old:
            assert new[key] == override.value() != old[key], override.input_line
            declared.add(key)
        else:  # a config group: the keys under it
            group = {k for k in old.keys() | new.keys() if k.startswith(f"{key}.")}
            assert group, f"{override.input_line}: neither a key nor a group of the recipe"
            assert any(old.get(k) != new.get(k) for k in group), override.input_line
            declared |= group
    moved = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
    assert moved <= declared, sorted(moved - declared)
    assert cfg.model.src_vocab_size == cfg.model.tgt_vocab_size == cfg.data.vocab_size


@pytest.mark.slow
@pytest.mark.parametrize("lever", LEVERS)
def test_each_lever_is_a_valid_change_of_the_cpu_recipe(lever, tmp_path):
    recipe = compose_cfg(["experiment=multi30k_en_de_cpu"], tmp_path)
    cfg = compose_cfg(["experiment=multi30k_en_de_cpu", *LEVERS[lever]], tmp_path)
    validate_config(cfg)
    assert cfg.callbacks == recipe.callbacks and cfg.trainer.max_time == "00:00:54:00"
    changes_only_what_it_declares(LEVERS[lever], recipe, cfg)
    assert (cfg == recipe) == (lever == "recipe")


@pytest.mark.slow
@pytest.mark.parametrize("lever", GPU_LEVERS)
def test_each_gpu_lever_is_a_valid_change_of_the_gpu_recipe(lever, tmp_path):
    budget = ["experiment=multi30k_en_de", "trainer.max_steps=12000", "trainer.max_epochs=-1"]
    recipe = compose_cfg([*budget, *GPU_COMMON], tmp_path)
    cfg = compose_cfg([*budget, *GPU_COMMON, *GPU_LEVERS[lever]], tmp_path)
    validate_config(cfg)  # the budgeted schedules need trainer.max_steps: the budget gives it
    assert "attention_maps" not in cfg.callbacks and cfg.validation.bleu_sentences == 300
    assert cfg.trainer == recipe.trainer  # the budget: the data, the subword levers' own
    changes_only_what_it_declares(GPU_LEVERS[lever], recipe, cfg)
    assert (cfg == recipe) == (lever == "recipe")
    assert cfg.optim.scheduler.warmup_steps == 2000  # the GPU recipe's, under every schedule


def test_options_and_budget():
    assert max_time(54 * 60) == "00:00:54:00" and max_time(0.2) == "00:00:00:01"
    assert parse_args(["--dry-run", "--levers", "ema,linear"]).levers == ["ema", "linear"]
    with pytest.raises(SystemExit):
        parse_args(["--data", "x", "--levers", "ema,adam"])
    with pytest.raises(SystemExit):
        parse_args([])  # --data is needed for a real run
    assert parse_args(["--gpu", "--dry-run"]).levers == list(GPU_LEVERS)
    with pytest.raises(SystemExit):
        parse_args(["--gpu", "--dry-run", "--levers", "fp32"])  # a CPU lever only
    with pytest.raises(SystemExit):
        parse_args(["--dry-run", "--parallel", "2"])  # time budgets must not share the cores
    with pytest.raises(SystemExit):
        parse_args(["--dry-run", "--levers", "ema", "--ensemble"])  # an ensemble of one model


def test_levers_join_into_the_earlier_recipe(tmp_path):
    assert overrides("invsqrt+fp32") == LEVERS["invsqrt"] + LEVERS["fp32"]
    assert parse_args(["--dry-run", "--levers", "recipe,invsqrt+fp32"]).levers[1] == "invsqrt+fp32"
    with pytest.raises(SystemExit):
        parse_args(["--dry-run", "--levers", "fp32+adam"])
    cfg = compose_cfg(["experiment=multi30k_en_de_cpu", *overrides("invsqrt+fp32")], tmp_path)
    assert cfg.trainer.precision == "32-true" and cfg.optim.scheduler.warmup_steps == 1000
    assert cfg.optim.scheduler._target_ == "transformer.training.optim.warmup_inverse_sqrt"


def test_table_has_a_row_per_lever_and_checkpoint():
    scores = {s: [30.0 + i, 31.0 + i, 60.0 + i] for i, s in enumerate(SCORED)}
    results = [
        {"lever": "recipe", "val_bleu": 38.6, "updates": 4379, "train_wall_s": 3258.0,
         "scores": {"avg": scores, "last": scores}},
        {"lever": "ema", "val_bleu": None, "updates": None, "train_wall_s": 60.0, "scores": {}},
    ]  # fmt: skip
    lines = table(results).splitlines()
    assert lines[2] == (
        "| recipe | avg | 38.60 | 30.00 / 31.00 / 60.00 | 31.00 / 32.00 / 61.00 | "
        "32.00 / 33.00 / 62.00 | 33.00 / 34.00 / 63.00 | 4379 | 54.3 |"
    )
    assert lines[4] == "| ema | - | - | - | - | - | - | - | 1.0 |" and len(lines) == 5
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")


@pytest.mark.slow
def test_dry_run_of_one_lever_trains_scores_and_tabulates(tmp_path):
    (result,) = main(["--dry-run", "--levers", "ema", "--out", str(tmp_path)])
    assert result["returncode"] == 0 and result["updates"] >= 1
    assert set(result["scores"]["last"]) == set(SCORED)
    assert (tmp_path / "table.md").read_text().count("| ema |") == len(result["scores"])


@pytest.mark.slow
def test_gpu_mode_trains_side_by_side_stops_at_the_deadline_and_resumes(tmp_path):
    args = ["--gpu", "--dry-run", "--parallel", "2", "--levers", "recipe,invsqrt", "--ensemble"]
    args += ["--out", str(tmp_path)]
    # a deadline long before 10**6 steps: both stop (SIGTERM), keep last.ckpt, and go unscored
    *stopped, ensemble = main([*args, "--steps", str(10**6), "--deadline", "30"])
    assert all(not r["finished"] and r["scores"] == {} and r["calls"] == 1 for r in stopped)
    assert any(r["updates"] for r in stopped)  # (a run still starting up has no last.ckpt)
    assert not ensemble["finished"] and ensemble["scores"] == {}  # not before all have finished
    # the same command with a reachable budget resumes each from its last.ckpt, then scores it
    steps = max(r["updates"] or 0 for r in stopped) + 3
    *resumed, ensemble = main([*args, "--steps", str(steps)])
    for before, after in zip(stopped, resumed, strict=True):
        assert after["finished"] and after["updates"] == steps and after["calls"] == 2
        assert set(after["scores"]["last"]) == set(SCORED)
        if before["updates"]:  # stopped after a step: the second call went on from there
            log = (tmp_path / f"{after['lever']}.log").read_text()
            assert "Restoring states from the checkpoint" in log
    # and the two runs decoded together, as evaluate.py's ensemble of their checkpoints
    assert ensemble["members"] == ["recipe", "invsqrt"] and ensemble["updates"] == [steps] * 2
    assert set(ensemble["scores"]) == set(resumed[0]["scores"]) & set(resumed[1]["scores"])
    assert set(ensemble["scores"]["last"]) == set(SCORED)
    report = (tmp_path / "ensemble_last_val" / "metrics.json").read_text()
    assert '"ensemble": true' in report and str(tmp_path / "invsqrt" / "checkpoints") in report
