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
POINTS = ("before_read", "after_stage", "before_commit", "during_commit", "after_commit")


def failpoint(name: str) -> None:
    armed = os.environ.get(ENV)
    if armed and name in armed.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
