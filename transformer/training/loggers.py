"""Experiment loggers: what a training step logs without a device sync (:func:`host_scalar`,
:func:`logs_after`); what describes a run rather than a step, in wandb's run summary
(:func:`log_summary`); wandb that falls back to offline mode instead of failing or hanging.

wandb needs an API key to log online. Without one (no ``WANDB_API_KEY``, no entry for the wandb
host in ``~/.netrc``), or when starting the online run fails (no network), the run is logged
offline into ``<save_dir>/wandb/offline-run-*`` and a warning says where it is and the
``wandb sync`` command that uploads it later.
"""

from __future__ import annotations

import logging
import netrc
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from torch import Tensor

log = logging.getLogger(__name__)

WANDB_HOST = "api.wandb.ai"
OFFLINE_MODES = ("offline", "dryrun", "disabled")


def host_scalar(x: float) -> Tensor:
    """A host number to ``self.log``: Lightning would copy a float to the GPU (a sync); a CPU
    tensor stays where it is."""
    return torch.tensor(float(x))


def logs_after(step: int, log_every_n_steps: int) -> bool:
    """Whether Lightning's loggers read the values logged by optimizer step ``step`` (0-based):
    those of every ``log_every_n_steps``-th step. A device value read then costs no extra sync."""
    return log_every_n_steps > 0 and (step + 1) % log_every_n_steps == 0


def log_summary(loggers: Iterable[Logger], values: dict[str, str]) -> None:
    """``values`` (sacreBLEU's signatures) into the run summary of each wandb logger, online or
    offline (the other loggers have no summary). Rank zero only: the others hold no run."""
    if not values:
        return
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.experiment.summary.update(values)


def wandb_api_key_available() -> bool:
    """True when wandb could authenticate: an API key in the environment or in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", f"https://{WANDB_HOST}").split("://")[-1].rstrip("/")
    path = os.environ.get("NETRC", os.path.expanduser("~/.netrc"))
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_should_run_offline(offline: bool = False) -> tuple[bool, str]:
    """(offline?, why) for a run about to start."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if offline:
        return True, "logger.wandb.offline=true"
    if mode in OFFLINE_MODES:
        return True, f"WANDB_MODE={mode}"
    if not wandb_api_key_available():
        return True, "no wandb API key (WANDB_API_KEY or ~/.netrc)"
    return False, ""


class OfflineFallbackWandbLogger(WandbLogger):
    """A ``WandbLogger`` that runs offline when it cannot run online.

    The run's online start is bounded by ``init_timeout`` seconds (wandb's own ``init_timeout``
    setting; wandb's check of the API key comes before it, with retries of its own); if it fails,
    the run starts again offline. Either way, an offline run is announced once, with
    its directory and the ``wandb sync`` command.
    """

    def __init__(self, *args: Any, offline: bool = False, init_timeout: float = 30.0, **kwargs):
        go_offline, self._offline_reason = wandb_should_run_offline(offline)
        self._init_timeout = init_timeout
        if go_offline:
            os.environ.setdefault("WANDB_MODE", "offline")
        save_dir = kwargs.get("save_dir") or "."
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        super().__init__(*args, offline=go_offline, **kwargs)
        self._announced = False

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is not None:
            return self._experiment
        if not self._offline:
            import wandb

            self._wandb_init.setdefault("settings", wandb.Settings(init_timeout=self._init_timeout))
            try:
                run = super().experiment
            except Exception as err:  # no network, bad key, server down: log offline instead
                log.warning("wandb could not start online (%s); logging offline instead", err)
                self._experiment = None
                self._offline, self._offline_reason = True, f"online start failed: {err}"
                os.environ["WANDB_MODE"] = "offline"
                self._wandb_init["mode"] = "offline"
                self._wandb_init.pop("settings", None)
                run = super().experiment
        else:
            run = super().experiment
        self._announce(run)
        return run

    def _announce(self, run) -> None:
        if self._announced or not self._offline or run is None:
            return
        self._announced = True
        run_dir = Path(getattr(run, "dir", "") or ".").parent  # .../wandb/offline-run-*/files
        log.warning(
            "wandb is logging OFFLINE (%s). The run is in %s; upload it later with: wandb sync %s",
            self._offline_reason,
            run_dir,
            run_dir,
        )
