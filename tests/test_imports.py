"""What the light entry points import: translating, exporting and model surgery need neither
Lightning (training) nor matplotlib (analysis figures). Each import runs in a fresh interpreter,
since this one has loaded everything already."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("lightning", "pytorch_lightning", "matplotlib")
LIGHT = (
    "transformer.translate",
    "transformer.export.ct2",
    "transformer.export.__main__",  # python -m transformer.export
    "transformer.export.hf_import",  # python -m transformer.export.hf_import
    "transformer.checkpoints",
    "transformer.averaging",  # transformer-average
    "transformer.surgery",
    "transformer.evaluation.config_checks",  # evaluate's option checks (and option_types)
    "transformer.evaluation.run",  # evaluate.py; a split's data module and analysis on use
)


@pytest.mark.slow  # a fresh interpreter per module
@pytest.mark.parametrize("module", LIGHT)
def test_imports_without_lightning_or_matplotlib(module: str) -> None:
    code = (
        f"import sys, {module}\nprint(','.join(name for name in {HEAVY!r} if name in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "", f"importing {module} loads {run.stdout.strip()}"
