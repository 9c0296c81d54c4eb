"""Progress of a running batch, in our log rather than Spark's: tasks done and an offset rate.

Spark's own output is at WARN (its progress bar and INFO lines are off), so a long batch
would be silent between its plan and its commit. While a batch reads and stages, a daemon
thread logs one line every ``interval`` seconds from Spark's status tracker: Spark tasks
done of those started, and the offsets that share of the plan stands for. The rate is an
estimate (slices are about equal in size; the exact count is logged when staging ends).
Short batches log nothing. Spark Connect sessions have no status tracker in the client:
there the plan and commit lines remain.

Example::

    >>> with Progress(spark, batch=3, planned_offsets=1_000_000):   # doctest: +SKIP
    ...     stage(...)
    # batch 3: 12 of 16 Spark tasks done, ~750000 of 1000000 offsets, ~41000 offsets/s
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_SECONDS = 10.0


def _status_tracker(spark):
    try:  # a classic session; a Connect session raises (no SparkContext in the client)
        return spark.sparkContext.statusTracker()
    except Exception:
        return None


class Progress:
    """Context manager that logs a batch's progress until the block ends."""

    def __init__(self, spark, batch: int, planned_offsets: int, interval: float = PROGRESS_INTERVAL_SECONDS):
        self.batch, self.planned, self.interval = batch, planned_offsets, interval
        self.tracker = _status_tracker(spark)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()

    def __enter__(self) -> "Progress":
        if self.tracker is not None and self.interval > 0:
            self._thread = threading.Thread(target=self._report, name=f"airflow-eo-progress-{self.batch}",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def tasks(self) -> tuple[int, int]:
        """(done, total) tasks of the stages running now."""
        done = total = 0
        for stage_id in self.tracker.getActiveStageIds():
            info = self.tracker.getStageInfo(stage_id)
            if info is not None:
                done, total = done + info.numCompletedTasks, total + info.numTasks
        return done, total

    def line(self) -> str | None:
        done, total = self.tasks()
        if total == 0:
            return None
        elapsed = max(time.monotonic() - self._started, 1e-6)
        offsets = self.planned * done // total
        return (f"batch {self.batch}: {done} of {total} Spark tasks done, ~{offsets} of {self.planned} offsets, "
                f"~{offsets / elapsed:.0f} offsets/s after {elapsed:.0f}s")

    def _report(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                message = self.line()
            except Exception:  # a tracker call that failed (the session busy or stopping): best effort
                continue
            if message:
                log.info("%s", message)
