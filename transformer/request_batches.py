"""Requests decoded together: the translation server's jobs (:class:`Job`, a request's lines,
options and guides) and the one thread that decodes them (:class:`Batcher`), joining those that
wait into one :meth:`Translator.translate` call where each gets the answer it would alone."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from transformer.decoding import DecodeOptions
from transformer.line_batches import check_guides
from transformer.translate import Translation, Translator


@dataclass(eq=False)
class Job:
    """One request's lines, options and guides, and the future of its translations."""

    lines: list[str]
    options: DecodeOptions
    prefixes: list[str] | None = None
    constraints: list[list[str]] | None = None
    answer: Future[list[list[Translation]]] = field(default_factory=Future)

    def __post_init__(self) -> None:
        # checked here: joined to other jobs' lines, a count that is off would shift theirs
        check_guides(len(self.lines), self.prefixes, self.constraints)

    def joins(self, other: Job) -> bool:
        """Whether ``other`` can be decoded in one call with this job: the same options, both
        with constraints or both without (constrained beam search is another search), and no
        sampling (a line's draws depend on its index). Prefixes mix: a line without one is
        decoded as in a call without prefixes."""
        return (
            self.options.strategy != "sample"
            and other.options == self.options
            and (other.constraints is None) == (self.constraints is None)
        )


class Batcher:
    """Decodes jobs in a thread of its own, first come first served: the jobs that wait when it
    is free go with the first into one :meth:`Translator.translate` call where they join it
    (:meth:`Job.joins`), while their lines add up to at most ``batch_lines`` (the first goes
    whatever its size). Should that call fail, each of its jobs is decoded alone, so a bad
    request's error (its own line numbers) reaches it alone."""

    def __init__(
        self, translator: Translator, max_tokens: int = 4096, batch_lines: int = 64
    ) -> None:
        self.translator, self.max_tokens, self.batch_lines = translator, max_tokens, batch_lines
        self.waiting: deque[Job] = deque()
        self.changed = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="translate", daemon=True)
        self.thread.start()

    def translate(self, job: Job) -> list[list[Translation]]:
        """The job's translations, once decoded; its error, raised, if it has one. A job is
        sent once (its future holds one answer)."""
        with self.changed:
            if self.closed:
                raise RuntimeError("the Batcher is closed: it decodes no more jobs")
            if job.answer.running() or job.answer.done():
                raise ValueError("this Job was sent before: make a new Job for each request")
            job.answer.set_running_or_notify_cancel()
            self.waiting.append(job)
            self.changed.notify()
        return job.answer.result()

    def close(self) -> None:
        """Stops the thread after the jobs it holds; jobs sent later are refused."""
        with self.changed:
            self.closed = True
            self.changed.notify()
        self.thread.join()

    def _take(self) -> list[Job]:
        """The next call's jobs: the first waiting and those that join it ([] once closed)."""
        with self.changed:
            self.changed.wait_for(lambda: self.waiting or self.closed)
            if not self.waiting:
                return []
            group = [self.waiting.popleft()]
            size = len(group[0].lines)
            for job in list(self.waiting):
                if group[0].joins(job) and size + len(job.lines) <= self.batch_lines:
                    self.waiting.remove(job)
                    group.append(job)
                    size += len(job.lines)
            return group

    def _run(self) -> None:
        while group := self._take():
            try:
                found = self._decode(group)
            except Exception as err:
                if len(group) == 1:
                    group[0].answer.set_exception(err)
                else:  # whose error? each job decoded alone gets its own
                    for job in group:
                        self._alone(job)
                continue
            for job in group:
                job.answer.set_result(found[: len(job.lines)])
                del found[: len(job.lines)]

    def _alone(self, job: Job) -> None:
        """Decodes ``job`` by itself into its future (its error, should it fail)."""
        try:
            job.answer.set_result(self._decode([job]))
        except Exception as err:
            job.answer.set_exception(err)

    def _decode(self, group: list[Job]) -> list[list[Translation]]:
        """One call for the jobs of ``group`` (:meth:`Job.joins` the first): their lines,
        prefixes and constraints one after another."""
        first = group[0]
        lines = [line for job in group for line in job.lines]
        prefixes = constraints = None
        if any(job.prefixes is not None for job in group):  # "": none
            prefixes = [p for job in group for p in job.prefixes or [""] * len(job.lines)]
        if first.constraints is not None:
            constraints = [c for job in group for c in job.constraints]
        return self.translator.translate(
            lines, first.options, self.max_tokens, constraints=constraints, prefixes=prefixes
        )
