"""Failpoints armed once (``AIRFLOW_EO_FAILPOINTS_ONCE``): the first process to reach the point dies
like ``kill -9``, every later one passes it; unarmed, a point does nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from airflow_eo.attempt import Env

REACH = "from airflow_eo.faults import failpoint; failpoint('before_commit'); print('passed')"


def reach(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", REACH], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)


def test_a_point_armed_once_kills_the_first_process_only(tmp_path):
    once = str(tmp_path / "fired")
    armed = {Env.FAILPOINTS: "after_stage,before_commit", Env.FAILPOINTS_ONCE: once}
    first = reach(armed)
    assert first.returncode == -signal.SIGKILL and os.path.exists(once)
    second = reach(armed)
    assert second.returncode == 0 and second.stdout.strip() == "passed"


def test_a_point_armed_without_once_kills_every_time_and_other_points_pass():
    assert reach({Env.FAILPOINTS: "before_commit"}).returncode == -signal.SIGKILL
    assert reach({Env.FAILPOINTS: "before_commit"}).returncode == -signal.SIGKILL
    assert reach({Env.FAILPOINTS: "after_commit"}).returncode == 0
