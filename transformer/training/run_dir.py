"""The run directory (``hydra.run.dir``) of ``train.py``: a run never replaces another run's
checkpoints there without ``force=true``.

A new run refuses a directory whose checkpoint folders hold checkpoints (a resumed one, those of
a run other than the one it resumes); ``force=true`` deletes them first. While a run trains, it
holds a lock on its run directory: a second run started there meanwhile refuses too (no
checkpoint is written yet). ``train.py`` takes the lock and checks in a Hydra callback
(:class:`RunDirectoryCheck`, ``configs/hydra/default.yaml``) before Hydra writes its record
(``.hydra/``) and log there, and holds it to its end; :func:`transformer.training.run.train`
checks again, under the lock, for its callers.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write

from transformer.errors import ConfigError

log = logging.getLogger(__name__)


def checkpoint_dirs(cfg: DictConfig) -> list[Path]:
    """The folders this run's checkpoint callbacks write to (``callbacks.*.dirpath``)."""
    dirs = [
        Path(c.dirpath) for c in (cfg.get("callbacks") or {}).values() if c and c.get("dirpath")
    ]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def _inside(path: Path, dirs: list[Path]) -> bool:
    path = path.resolve()
    return any(d in path.parents for d in dirs)


def earlier_checkpoints(cfg: DictConfig) -> list[Path]:
    """The checkpoints of another run in this run's checkpoint folders: all of them for a new run,
    none for a run resumed from one of them (it continues that run)."""
    dirs = checkpoint_dirs(cfg)
    resumed = cfg.get("ckpt_path")
    if resumed and _inside(Path(str(resumed)), dirs):
        return []
    return sorted(p for d in dirs if d.is_dir() for p in d.glob("*.ckpt"))


def check_training_run(cfg: DictConfig) -> list[Path]:
    """A :class:`ConfigError` if the run would replace another run's checkpoints, unless
    ``force=true``; returns those it would replace."""
    force = cfg.get("force", False)
    if not isinstance(force, bool):
        raise ConfigError(f"force must be true or false, got {force!r}")
    found = earlier_checkpoints(cfg)
    if not found or force:
        return found
    found.sort(key=lambda p: (p.name != "last.ckpt", p))  # last.ckpt first: the one to resume
    folder = found[0].parent
    names = [os.path.relpath(p, folder) for p in found]
    held = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    resumed = cfg.get("ckpt_path")
    if resumed:
        raise ConfigError(
            f"{folder} holds another run's checkpoints ({held}), not ckpt_path={resumed} that this "
            "run resumes; give this run another directory (hydra.run.dir=DIR), or force=true to "
            "delete them first"
        )
    raise ConfigError(
        f"{folder} holds the checkpoints of an earlier run ({held}), which a new run would "
        f"replace; resume that run with ckpt_path={found[0]}, give "
        "this one another directory (hydra.run.dir=DIR, or none for a new one), or force=true to "
        "delete them first"
    )


_HELD: dict[Path, int] = {}  # run directory -> its locked descriptor, held until the process ends


def _lock(run_dir: Path) -> int:
    """Take the run directory's lock: its open descriptor, which holds it until closed (or the
    process ends); another run holding it is a :class:`ConfigError`. A file system without
    locks gives an unlocked one (the checkpoint checks still hold)."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"another run is training in {run_dir} now (it holds the directory's lock); "
            "wait for it to end, or give this run another directory (hydra.run.dir=DIR)"
        ) from None
    except OSError as err:
        log.debug("no lock on %s: %s", run_dir, err)
    return fd


@contextlib.contextmanager
def claim_training_run(cfg: DictConfig) -> Iterator[None]:
    """Hold the run directory's lock while training (rank 0 only): a second run there refuses.
    ``train.py`` took it already, before Hydra wrote there (:class:`RunDirectoryCheck`), and
    keeps it; others take it here. Under the lock the checkpoints are checked again and, with
    ``force=true``, deleted."""
    run_dir = Path(cfg.paths.output_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = _HELD[run_dir] if run_dir in _HELD else _lock(run_dir)
    try:
        for path in check_training_run(cfg):
            log.warning("force=true: deleting %s, an earlier run's checkpoint", path)
            path.unlink()
        yield
    finally:
        if run_dir not in _HELD:
            os.close(fd)  # releases the lock


# set to a rank other than 0 in the processes that Lightning's DDP, torchrun or SLURM start
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")


class RunDirectoryCheck(Callback):
    """Hydra callback, before Hydra writes to the run directory: takes its lock, held until the
    process ends (two runs started at once: the second is refused here, not after Hydra wrote
    its record and log lines), then the checks above; a refusal is one ``error:`` line and exit
    status 1."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if any(os.environ.get(v, "0") != "0" for v in RANK_VARIABLES):
            return  # a process that DDP started after the first, in its run directory
        probe = copy.deepcopy(config)  # paths.output_dir names Hydra's, not set until the job
        out_dir = Path(str(config.hydra.run.dir)).resolve()
        with read_write(probe), open_dict(probe):
            probe.paths.output_dir = str(out_dir)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            if out_dir not in _HELD:
                _HELD[out_dir] = _lock(out_dir)
            check_training_run(probe)
        except ConfigError as err:
            sys.exit(f"error: {err}")
        except OSError as err:
            sys.exit(
                f"error: hydra.run.dir={config.hydra.run.dir} cannot be made or opened "
                f"({err.strerror or err}); choose another directory"
            )
