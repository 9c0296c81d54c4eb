"""Failpoints: named places where a test can make the process die like ``kill -9``.

Set ``AIRFLOW_EO_FAILPOINTS=after_stage,after_commit`` in the job's environment and the
process SIGKILLs itself on reaching those points. Used by the crash tests, the fault-injection
suite and the pytest plugin (``airflow_eo.testing``); unset in production, where each call is one
dictionary lookup. With ``AIRFLOW_EO_FAILPOINTS_ONCE=<path>`` a point fires only for the process
that creates that file first: a retry of the killed attempt passes the point (the file exists).
"""

from __future__ import annotations

import os
import signal

from airflow_eo.attempt import Env

ENV = Env.FAILPOINTS
ONCE = Env.FAILPOINTS_ONCE
# while_planning: in the submitting process (task, CLI) holding the table's lease, its plan made and
# not logged yet; before_submit: there too, once the attempt's marker is written and before Spark
# starts; the others in the attempt's driver (before_dead_letters: its main commit landed, the
# batch's dead letters are not committed yet; reached only by a batch that has dead letters)
POINTS = ("while_planning", "before_submit", "before_read", "after_stage", "before_commit", "during_commit",
          "before_dead_letters", "after_commit")
SUBMITTER_POINTS = ("while_planning", "before_submit")  # the points outside the Spark driver


def failpoint(name: str) -> None:
    """SIGKILL this process at ``name`` when armed; ``name@group`` kills its whole process group
    (a task killed with its children: an OOM kill, an evicted pod, a lost worker)."""
    armed = os.environ.get(ENV)
    if not armed:
        return
    points = armed.split(",")
    group = f"{name}@group" in points
    if not (group or name in points) or not _first(os.environ.get(ONCE)):
        return
    if group:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _first(once: str | None) -> bool:
    """True unless the point may fire once (``once`` names a file) and has fired already."""
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # atomic: one process wins
    except FileExistsError:
        return False
    return True
