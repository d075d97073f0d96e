"""The file system a run needs, checked before any data work: the directories it writes to and
the corpus directory it reads."""

from __future__ import annotations

import tempfile
from pathlib import Path

from omegaconf import DictConfig

from transformer.errors import ConfigError


def output_dirs(cfg: DictConfig) -> dict[str, Path]:
    """The directories training writes to, by the option that names them."""
    dirs = {"paths.output_dir": Path(cfg.paths.output_dir)}
    for name, c in (cfg.get("callbacks") or {}).items():
        if c is not None and c.get("dirpath"):
            dirs[f"callbacks.{name}.dirpath"] = Path(c.dirpath)
    return dirs


def check_writable(dirs: dict[str, Path]) -> None:
    """Write a probe file in each directory: an unwritable output directory fails now, not at the
    first checkpoint an hour into training. The directories created for the probe are removed
    again: Lightning warns of a checkpoint directory that "exists and is not empty" (an earlier
    run's), and an empty ``checkpoints/epochs`` of this run would set it off."""
    for option, path in dirs.items():
        created = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
        try:
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as err:
            raise ConfigError(
                f"{option}={path} is not a writable directory ({err.strerror}); choose another, "
                "e.g. hydra.run.dir=DIR"
            ) from err
        for p in created:
            p.rmdir()


def check_data_root(data: DictConfig) -> None:
    """A ``data.root`` that does not exist is a typo, unless Multi30k is to be downloaded there."""
    root = data.get("root")
    downloads = data.get("source") == "multi30k" and data.get("download", True)
    if root is not None and not downloads and not Path(root).is_dir():
        raise ConfigError(
            f"data.root={root} does not exist; set data.root to the directory of the corpus files"
        )
