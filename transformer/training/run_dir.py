"""The run directory (``hydra.run.dir``) of ``train.py``: a run never replaces another run's
checkpoints there without ``force=true``.

A new run refuses a directory whose checkpoint folders hold checkpoints (a resumed one, those of
a run other than the one it resumes); ``force=true`` deletes them first. While a run trains, it
holds a lock on its run directory: a second run started there meanwhile refuses too (no
checkpoint is written yet). ``train.py`` takes the lock and checks in a Hydra callback
(:class:`RunDirectoryCheck`, ``transformer/configs/hydra/default.yaml``) before Hydra writes its
record (``.hydra/``) and log there, and holds it to its end; :func:`transformer.training.run.train`
checks again, under the lock, for its callers.

The processes of one multi-process launch share one run directory, which rank 0 owns: it takes the
lock and writes the checkpoints, logs and Hydra's record there; the others write nothing there
(their log lines go to stderr). Lightning's own launcher hands its processes the first one's
directory; those that torchrun or srun start at once agree on its name (:func:`launch_name`).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import logging
import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

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


def _continues(cfg: DictConfig) -> bool:
    """Whether the run resumes from a checkpoint of its own checkpoint folders (it continues the
    run that wrote them)."""
    resumed = cfg.get("ckpt_path")
    return bool(resumed) and _inside(Path(str(resumed)), checkpoint_dirs(cfg))


def earlier_checkpoints(cfg: DictConfig) -> list[Path]:
    """The checkpoints of another run in this run's checkpoint folders: all of them for a new run,
    none for a run resumed from one of them (it continues that run)."""
    if _continues(cfg):
        return []
    return sorted(p for d in checkpoint_dirs(cfg) if d.is_dir() for p in d.glob("*.ckpt"))


VERSIONED_LOGGERS = ("CSVLogger", "TensorBoardLogger")  # a version_N/ in save_dir/name each run


def run_logs(cfg: DictConfig) -> list[Path]:
    """What a run logs in its run directory beside its checkpoints: Hydra's record and log (where
    ``cfg`` holds Hydra's config: train.py's), its CSV and TensorBoard loggers' folders and its
    callbacks' (the attention maps and explorer)."""
    run = Path(cfg.paths.output_dir)
    logs = []
    hydra = cfg.get("hydra")
    if hydra is not None:
        logs.append(run / f"{hydra.job.name}.log")
        if hydra.output_subdir is not None:
            logs.append(run / str(hydra.output_subdir))
    for node in (cfg.get("logger") or {}).values():
        if node and str(node.get("_target_")).rsplit(".", 1)[-1] in VERSIONED_LOGGERS:
            logs.append(Path(node.save_dir) / str(node.name))
    callbacks = (cfg.get("callbacks") or {}).values()
    return logs + [Path(c.out_dir) for c in callbacks if c and c.get("out_dir")]


def set_aside_logs(cfg: DictConfig) -> None:
    """``force=true`` on a run that does not continue the directory's: the earlier run's logs
    there (:func:`run_logs`) move to ``replaced/<n>/`` in the run directory (the first ``n``
    free), so that the new run's start fresh and the old are kept."""
    if not cfg.get("force") or _continues(cfg):
        return
    run = Path(cfg.paths.output_dir).resolve()
    found = [p for p in run_logs(cfg) if p.exists() and run in p.resolve().parents]
    if not found:
        return
    n = 1
    while (run / "replaced" / str(n)).exists():
        n += 1
    for path in found:
        aside = run / "replaced" / str(n) / path.resolve().relative_to(run)
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, aside)
    log.warning("force=true: the earlier run's logs moved to %s", run / "replaced" / str(n))


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
    ``force=true``, the earlier run's logs set aside (:func:`set_aside_logs`; train.py's before
    Hydra wrote there) and its checkpoints deleted."""
    run_dir = Path(cfg.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    held = _HELD.get(run_dir.resolve())  # train.py's: its logs set aside already
    fd = held if held is not None else _lock(run_dir)
    try:
        found = check_training_run(cfg)
        if held is None:
            set_aside_logs(cfg)
        for path in found:
            log.warning("force=true: deleting %s, an earlier run's checkpoint", path)
            path.unlink()
        yield
    finally:
        if held is None:
            os.close(fd)  # releases the lock


# set to a rank other than 0 in the processes that Lightning's DDP, torchrun or SLURM start
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")
LAUNCH_STORE_TIMEOUT = timedelta(seconds=60)  # torchrun's store is up before its processes start


def later_rank() -> bool:
    """Whether this process is one that DDP, torchrun or srun started beside a launch's first
    (rank 0): it shares rank 0's run directory and writes nothing there."""
    return any(os.environ.get(v, "0") != "0" for v in RANK_VARIABLES)


def launch_name(default: str) -> str:
    """The run directory's last part (``${launch_name:...}`` in configs/hydra/default.yaml): one
    name for all the processes of a launch, which torchrun and srun start at slightly different
    times (a time stamp each would name a directory each).

    torchrun: ``default`` (a time stamp) of the first process to ask torchrun's store, which all
    processes of the launch reach at MASTER_ADDR:MASTER_PORT, on every node (``torchrun-<run id>``
    where torchrun shares no store); an srun step of several tasks: ``slurm-<job id>.<step id>``.
    Elsewhere ``default``: Lightning's own launcher passes its first process's directory
    (``hydra.run.dir``) to the others itself."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return f"torchrun-{env['TORCHELASTIC_RUN_ID']}"
        from torch.distributed import TCPStore  # (torch: only here, where torchrun started us)

        store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), timeout=LAUNCH_STORE_TIMEOUT)
        return store.compare_set("transformer/run_dir", "", default).decode()  # the first's
    if "SLURM_STEP_ID" in env and int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        return f"slurm-{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    return default


if not OmegaConf.has_resolver("launch_name"):
    OmegaConf.register_new_resolver("launch_name", launch_name, use_cache=True)


def leave_to_rank_zero(config: DictConfig) -> None:
    """Hydra's config of a process beside rank 0: Hydra writes no record (``.hydra/``) and no
    log file in the run directory, which rank 0's are; the log lines go to stderr alone (which
    torchrun, srun and Lightning's launcher pass on)."""
    logging_cfg = config.hydra.job_logging
    handlers = OmegaConf.to_container(logging_cfg.handlers, resolve=False)
    files = [name for name, h in handlers.items() if h and "filename" in h]
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.output_subdir = None
        for name in files:
            del logging_cfg.handlers[name]
        logging_cfg.root.handlers = [h for h in logging_cfg.root.handlers if h not in files]


class RunDirectoryCheck(Callback):
    """Hydra callback, before Hydra writes to the run directory: takes its lock, held until the
    process ends (two runs started at once: the second is refused here, not after Hydra wrote
    its record and log lines), then the checks above, and with ``force=true`` sets the earlier
    run's logs aside; a refusal is one ``error:`` line and exit status 1. A process beside rank
    0 (:func:`later_rank`) shares its directory: it takes no lock, and Hydra writes nothing there
    for it (:func:`leave_to_rank_zero`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if later_rank():
            leave_to_rank_zero(config)
            return
        probe = copy.deepcopy(config)  # paths.output_dir names Hydra's, not set until the job
        out_dir = Path(str(config.hydra.run.dir)).absolute()
        with read_write(probe), open_dict(probe):
            probe.paths.output_dir = str(out_dir)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            if out_dir.resolve() not in _HELD:  # (a second Hydra run in this process holds it)
                _HELD[out_dir.resolve()] = _lock(out_dir)
            check_training_run(probe)
            set_aside_logs(probe)
        except ConfigError as err:
            sys.exit(f"error: {err}")
        except OSError as err:
            sys.exit(
                f"error: hydra.run.dir={config.hydra.run.dir} cannot be made or opened "
                f"({err.strerror or err}); choose another directory"
            )
