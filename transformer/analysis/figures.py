"""The figures of a map validation, drawn in a worker process: the training thread captures the
data (the maps, the head statistics, the explorer's record) and goes on training, while one
process spawned for the run draws the PNGs with matplotlib and rebuilds the explorer page.

At most one drawing waits behind the one being drawn: a newer one replaces it (its figures are
not drawn; its maps stay in ``step<N>/explorer.json``, the page shows them). A drawing that fails
comes back as its exception, to be reported.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from transformer.analysis import explorer
from transformer.analysis.report import Images, MapFigure, draw_maps, draw_stats
from transformer.analysis.trends import trend_rows


@dataclass
class Drawing:
    """One map validation's figures: the head grids, the statistics' heatmaps (``stats`` of
    ``stats_sentences`` sentences, into ``step_dir``) and, with ``page``, the explorer page of
    every record under ``out_dir`` and the head-statistics trends."""

    step: int
    step_dir: Path
    out_dir: Path
    maps: list[MapFigure] = field(default_factory=list)
    stats: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    stats_sentences: int = 0
    page: bool = False


@dataclass
class Drawn:
    images: Images
    page: Path | None
    trends: list[list[Any]]  # rows of trends.TREND_COLUMNS, every record so far


def draw(job: Drawing) -> Drawn:
    """Draw ``job``'s figures (in the worker process)."""
    images = draw_maps(job.maps)
    if job.stats:
        images |= draw_stats(job.stats, job.stats_sentences, job.step_dir)
    page, trends = None, []
    if job.page:
        records = explorer.load_records(job.out_dir)
        page = explorer.write_page(records, job.out_dir / "explorer.html")
        trends = trend_rows(records) if job.stats else []
    return Drawn(images, page, trends)


def _start_worker(idle: bool) -> None:
    """The worker's start: one thread and, if ``idle``, only the CPU time that training leaves
    idle (Linux's SCHED_IDLE; elsewhere the lowest priority)."""
    import torch

    torch.set_num_threads(1)  # the figures need no parallel tensor work; training needs cores
    if not idle:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux
        if hasattr(os, "nice"):
            os.nice(19)


class FigureWorker:
    """Draws :class:`Drawing` jobs in a spawned process (started with the first job), in order;
    :meth:`finished` hands back what is done, :meth:`close` waits for the rest (or stops).
    With ``idle`` the process draws in the CPU time training leaves idle: where training keeps
    every core busy (a CPU run), it draws little until training ends, and jobs are replaced."""

    def __init__(self, idle: bool = True) -> None:
        self.idle = idle
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Condition()
        self._waiting: Drawing | None = None
        self._done: list[tuple[Drawing, Drawn | BaseException]] = []
        self._feeder: threading.Thread | None = None
        self._closing = False

    def submit(self, job: Drawing) -> Drawing | None:
        """Queue ``job``; returns the waiting job it replaces, whose figures will not be drawn."""
        with self._lock:
            replaced, self._waiting = self._waiting, job
            self._closing = False
            if self._feeder is None:
                self._feeder = threading.Thread(target=self._feed, name="figures", daemon=True)
                self._feeder.start()
            self._lock.notify()
        return replaced

    def finished(self) -> list[tuple[Drawing, Drawn | BaseException]]:
        """The jobs drawn (or failed) since the last call; never waits."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self, wait: bool = True) -> list[tuple[Drawing, Drawn | BaseException]]:
        """Draw what is queued and stop the process; without ``wait``, stop it at once (a job
        cut short comes back as its error). Returns what finished since :meth:`finished`."""
        with self._lock:
            self._closing = True
            if not wait:
                self._waiting = None
                if self._executor is not None:  # (Python 3.14: executor.terminate_workers())
                    for process in list(getattr(self._executor, "_processes", {}).values()):
                        process.terminate()
            self._lock.notify()
        if self._feeder is not None:
            self._feeder.join()
            self._feeder = None
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=not wait)
            self._executor = None
        return self.finished()

    def _feed(self) -> None:
        """Hand the waiting job to the process, one at a time (off the training thread)."""
        while True:
            with self._lock:
                while self._waiting is None and not self._closing:
                    self._lock.wait()
                job, self._waiting = self._waiting, None
                if job is None:
                    return
                if self._executor is None:
                    spawn = multiprocessing.get_context("spawn")  # no fork of a CUDA process
                    self._executor = ProcessPoolExecutor(
                        1, spawn, initializer=_start_worker, initargs=(self.idle,)
                    )
                future = self._executor.submit(draw, job)
            try:
                result: Drawn | BaseException = future.result()
            except BrokenProcessPool as err:  # the process died: a new one for the next job
                result = err
                with self._lock:
                    self._executor = None
            except Exception as err:  # reported by the caller, with its step
                result = err
            with self._lock:
                self._done.append((job, result))
