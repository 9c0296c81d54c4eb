"""Failpoints: named places where a test can make the process die like ``kill -9``.

Set ``AIRFLOW_EO_FAILPOINTS=after_stage,after_commit`` in the job's environment and the
process SIGKILLs itself on reaching those points. Used by the crash tests and the
fault-injection suite; unset in production, where each call is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

from airflow_eo.attempt import Env

ENV = Env.FAILPOINTS
# while_planning: in the submitting process (task, CLI) holding the table's lease, its plan made and
# not logged yet; before_submit: there too, once the attempt's marker is written and before Spark
# starts; the others in the attempt's driver
POINTS = ("while_planning", "before_submit", "before_read", "after_stage", "before_commit", "during_commit",
          "after_commit")


def failpoint(name: str) -> None:
    """SIGKILL this process at ``name`` when armed; ``name@group`` kills its whole process group
    (a task killed with its children: an OOM kill, an evicted pod, a lost worker)."""
    armed = os.environ.get(ENV)
    if not armed:
        return
    points = armed.split(",")
    if f"{name}@group" in points:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    if name in points:
        os.kill(os.getpid(), signal.SIGKILL)
