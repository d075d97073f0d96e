"""bench/bench_validation.py's options: the attention maps it times are the recipe's unless
``--maps`` changes them (the GPU check's dry run times one type and one probe)."""

from __future__ import annotations

import argparse

import pytest
from omegaconf import OmegaConf

from bench.bench_validation import map_options
from tests.tiny import compose_cfg


def recipe() -> dict:
    """The attention-map callback's options as ``python train.py`` composes them, less its class
    and folder."""
    options = OmegaConf.to_container(compose_cfg([]).callbacks.attention_maps)
    return {k: v for k, v in options.items() if k not in ("_target_", "out_dir")}


def test_maps_are_the_recipes_with_each_change_applied() -> None:
    parser = argparse.ArgumentParser()
    assert map_options([], parser) == recipe()
    changed = map_options(["types=[cross]", "num_probes=1"], parser)
    assert changed == recipe() | {"types": ["cross"], "num_probes": 1}


@pytest.mark.parametrize("change", ["num_probe=1", "num_probes", "out_dir=/tmp/x"])
def test_a_change_that_is_not_an_option_names_it_and_the_options(change, capsys) -> None:
    with pytest.raises(SystemExit):
        map_options([change], argparse.ArgumentParser(prog="bench_validation.py"))
    err = capsys.readouterr().err
    assert f"--maps {change}: KEY=VALUE" in err and "num_probes, sentences" in err
