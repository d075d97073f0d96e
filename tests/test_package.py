"""The project as a package: its wheel, installed into a fresh virtual environment (its
dependencies taken from this environment: nothing is downloaded), trains and evaluates from an
empty directory through its commands; the configs travel inside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.tiny import REPO, tiny_overrides

pytestmark = pytest.mark.heavy

COMMANDS = [
    "transformer-train",
    "transformer-evaluate",
    "transformer-export",
    "transformer-average",
    "transformer-prune",
    "transformer-import",
    "transformer-serve",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtual environment holding the wheel of this checkout alone; this environment's
    packages (torch, lightning, ...) reach it through a .pth file. Returns its bin folder."""
    tmp = tmp_path_factory.mktemp("package")
    source, wheels = tmp / "source", tmp / "wheels"  # a copy: the build writes beside its source
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        copy = source / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, copy)
    shutil.copytree(REPO / "transformer", source / "transformer",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True, timeout=300)
    (wheel,) = wheels.glob("transformer_nmt-*.whl")
    env = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    install = [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)]
    subprocess.run(install, check=True, timeout=300)
    return env / "bin"


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "WANDB_MODE": "offline",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_installed_wheel_trains_and_evaluates_from_an_empty_directory(
    installed, corpus, tmp_path
):
    """transformer-train and transformer-evaluate of the wheel, from a directory holding nothing
    of the project: the package imported is the wheel's (not this checkout), its configs found
    inside it; a run trains and writes its checkpoint, evaluate scores it."""
    imported = "import transformer; print(transformer.__file__)"
    where = run([str(installed / "python"), "-c", imported], tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(installed.parent), where.stdout
    assert not Path(where.stdout.strip()).is_relative_to(REPO)
    for command in COMMANDS:
        assert (installed / command).is_file(), command
    steps = ["trainer.max_steps=4", "trainer.limit_val_batches=2", "hydra.run.dir=run"]
    trained = run([str(installed / "transformer-train"), *tiny_overrides(corpus), *steps], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    scored = run(
        [str(installed / "transformer-evaluate"), f"ckpt_path={ckpt}", "split=val",
         "decode=greedy", "device=cpu", "hydra.run.dir=eval"],
        tmp_path,
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert scored.stdout.startswith("val (en-de, ") and "BLEU = " in scored.stdout


@pytest.mark.slow
def test_every_command_of_the_wheel_starts(installed, tmp_path):
    for command in COMMANDS:
        done = run([str(installed / command), "--help"], tmp_path)
        assert done.returncode == 0, (command, done.stderr[-2000:])
