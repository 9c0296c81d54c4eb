"""Whether an attempt can still commit: the one liveness rule, and the local scratch of an attempt.

An attempt's marker (:class:`airflow_eo.table.staging.AttemptMarker`) names two processes:
the one that **submitted** it (``host``/``pid``: the Airflow task or the CLI) and, once it
has started, the **driver** that commits it (``driver_host``/``driver_pid``; on the Spark
Connect path the same process). Each is recorded with its start time, so a PID the kernel
has handed to another process is not taken for the attempt's (PID reuse).

The rule (:func:`liveness`), used by everything that asks "is this attempt still running":
waiting for a table's turn, orphan collection, ``status`` and the scratch clean-up:

* the marker says it ended → :attr:`Liveness.ENDED`;
* its driver ran on this host and is gone → :attr:`Liveness.DEAD` (nobody else commits it);
* its submitter ran on this host and is gone, and its driver never started or is gone
  too → :attr:`Liveness.DEAD` (a killed task, an OOM-killed or evicted worker);
* otherwise a process of it lives here, or its processes are on another host (cluster
  mode, another worker), where only time can tell: :attr:`Liveness.RUNNING` until
  ``grace_seconds`` after it started or, when a process of it renews its heartbeat
  (:class:`airflow_eo.table.staging.Heartbeat`, every quarter of the grace at most), after
  its last renewal: a batch that runs longer than the grace is not taken for dead while it
  runs.

Example::

    >>> marker = AttemptMarker("a" * 16, 4, "dag/run/task/-1", time.time(), host="elsewhere", pid=1)
    >>> liveness(marker, grace_seconds=60).name                                   # doctest: +SKIP
    'RUNNING'
"""

from __future__ import annotations

import enum
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Protocol

import psutil

from airflow_eo.attempt import Env

log = logging.getLogger(__name__)

# Start times are compared with this tolerance: psutil derives them from the boot time and
# clock ticks, exact for one process; a reused PID starts seconds or days later.
_START_TOLERANCE = 0.5


class Liveness(enum.Enum):
    ENDED = "ended"  # its marker says so (committed or not)
    RUNNING = "running"  # may still commit
    DEAD = "dead"  # can no longer commit: its processes are gone, or it outlived the grace period


class ProcessState(enum.Enum):
    ALIVE = "alive"
    GONE = "gone"
    ELSEWHERE = "elsewhere"  # on another host, or not recorded: this host cannot tell
    NOT_STARTED = "not_started"  # a driver that has not started yet


@dataclass(frozen=True)
class ProcessId:
    """A process as an attempt's marker records it: host, PID and the PID's start time."""

    host: str
    pid: int
    started: float = 0.0  # epoch seconds; 0 in markers written before start times were recorded

    @classmethod
    def current(cls) -> "ProcessId":
        return cls(socket.gethostname(), os.getpid(), process_start_time(os.getpid()))

    def state(self) -> ProcessState:
        if not self.pid:
            return ProcessState.NOT_STARTED
        if self.host != socket.gethostname():
            return ProcessState.ELSEWHERE
        return ProcessState.ALIVE if _alive(self.pid, self.started) else ProcessState.GONE


class Marker(Protocol):
    """What the rule reads of an attempt marker (:class:`airflow_eo.table.staging.AttemptMarker`):
    when it started and ended, and its two processes."""

    @property
    def started_at(self) -> float: ...
    @property
    def ended_at(self) -> float | None: ...
    @property
    def submitter(self) -> ProcessId: ...
    @property
    def driver(self) -> ProcessId: ...


def process_start_time(pid: int) -> float:
    """When ``pid`` started (epoch seconds), or 0.0 when it does not exist."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def _alive(pid: int, started: float) -> bool:
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return False
        return not started or abs(process.create_time() - started) < _START_TOLERANCE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # alive, another user's
        return True


def liveness(marker: Marker, grace_seconds: float, now: float | None = None,
             renewed_at: float | None = None) -> Liveness:
    """The one rule (see the module docstring; ``renewed_at``: the attempt's last heartbeat)."""
    if marker.ended_at is not None:
        return Liveness.ENDED
    driver = marker.driver.state()
    if driver is ProcessState.GONE:
        return Liveness.DEAD
    submitter = marker.submitter.state()
    if submitter is ProcessState.GONE and driver is ProcessState.NOT_STARTED:
        return Liveness.DEAD
    now = time.time() if now is None else now
    return Liveness.RUNNING if now - max(marker.started_at, renewed_at or 0.0) < grace_seconds else Liveness.DEAD


def renew_every(grace_seconds: float) -> float:
    """How often a live attempt (or a lease's holder) renews: often enough that another host never sees
    it stale by the rule's ``grace_seconds``."""
    return max(0.5, min(60.0, grace_seconds / 4))


# -- an attempt's local scratch ---------------------------------------------------------------
# A spark-submit job's JVM and Python driver put their scratch (spark-*, blockmgr-*) under
# java.io.tmpdir and spark.local.dir; a SIGKILLed JVM runs no shutdown hook and leaves them
# in /tmp for ever. Each attempt started from this host gets its own directory instead,
# removed when the attempt ends, or by a later run once the attempt is known dead.


def scratch_root() -> str:
    """Where attempts started on this host keep their scratch (``$AIRFLOW_EO_SCRATCH_DIR``)."""
    return os.environ.get(Env.SCRATCH_DIR) or os.path.join(tempfile.gettempdir(), "airflow-eo-scratch")


def scratch_dir(attempt_id: str) -> str:
    return os.path.join(scratch_root(), attempt_id)


def scratch_attempt_ids() -> list[str]:
    """The attempts that have a scratch directory on this host."""
    root = scratch_root()
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def remove_scratch(attempt_id: str) -> bool:
    """Remove an attempt's scratch directory on this host; True when there was one."""
    path = scratch_dir(attempt_id)
    if not os.path.isdir(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    log.info("removed the Spark scratch of attempt %s", attempt_id)
    return True
