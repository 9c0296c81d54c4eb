"""The one liveness rule of attempts, on real processes of this host (no broker, Spark or table)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from airflow_eo.table import liveness as live
from airflow_eo.table.liveness import Liveness, ProcessId, ProcessState, liveness
from airflow_eo.table.files import FEED_SUFFIX
from airflow_eo.table.staging import AttemptMarker, StagingArea
from airflow_eo.table.storage import TableLocation

HERE = socket.gethostname()
DAY = 24 * 3600


def finished_pid() -> tuple[int, float]:
    """The PID and start time of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = live.process_start_time(child.pid)
    child.wait()
    return child.pid, started


def marker(**fields) -> AttemptMarker:
    base = dict(attempt_id="a" * 16, batch=3, run_key="dag/run/ingest/-1", started_at=time.time(), host=HERE,
                pid=os.getpid(), pid_started=live.process_start_time(os.getpid()), ingest_id="orders", kind="ingest")
    return AttemptMarker(**{**base, **fields})


def test_this_process_is_alive_and_a_finished_one_is_gone():
    assert ProcessId.current().state() is ProcessState.ALIVE
    pid, started = finished_pid()
    assert ProcessId(HERE, pid, started).state() is ProcessState.GONE
    assert ProcessId("another-host", os.getpid()).state() is ProcessState.ELSEWHERE
    assert ProcessId(HERE, 0).state() is ProcessState.NOT_STARTED


def test_a_reused_pid_is_not_taken_for_the_attempts_process():
    me = ProcessId.current()
    assert ProcessId(HERE, me.pid, me.started - 3600).state() is ProcessState.GONE  # same PID, other process
    assert ProcessId(HERE, me.pid, 0.0).state() is ProcessState.ALIVE  # older markers: no start time recorded


def test_a_zombie_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = live.process_start_time(child.pid)
    deadline = time.monotonic() + 10
    while live.psutil.Process(child.pid).status() != live.psutil.STATUS_ZOMBIE:  # exited, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        assert ProcessId(HERE, child.pid, started).state() is ProcessState.GONE
    finally:
        child.wait()


def test_killed_before_its_driver_started_is_dead_at_once():
    pid, started = finished_pid()
    assert liveness(marker(pid=pid, pid_started=started), DAY) is Liveness.DEAD


def test_a_dead_driver_on_this_host_is_dead_whoever_submitted():
    pid, started = finished_pid()
    assert liveness(marker(driver_host=HERE, driver_pid=pid, driver_pid_started=started), DAY) is Liveness.DEAD


def test_a_live_driver_keeps_an_attempt_running_after_its_submitter_died():
    pid, started = finished_pid()
    me = ProcessId.current()
    alive = marker(pid=pid, pid_started=started, driver_host=HERE, driver_pid=me.pid, driver_pid_started=me.started)
    assert liveness(alive, DAY) is Liveness.RUNNING


def test_a_submitter_that_lives_keeps_its_attempt_running_until_the_grace_period():
    assert liveness(marker(), DAY) is Liveness.RUNNING
    assert liveness(marker(started_at=time.time() - 100), 60) is Liveness.DEAD


def test_another_hosts_attempt_keeps_the_grace_rule():
    elsewhere = marker(host="worker-2", pid=123, driver_host="worker-3", driver_pid=456)
    assert liveness(elsewhere, 3600) is Liveness.RUNNING
    assert liveness(elsewhere, 3600, now=elsewhere.started_at + 3601) is Liveness.DEAD
    # a driver on another host (cluster mode) whose submitter here died: only age can tell
    pid, started = finished_pid()
    assert liveness(marker(pid=pid, pid_started=started, driver_host="worker-3", driver_pid=9), 3600) is \
        Liveness.RUNNING


def test_an_ended_marker_is_ended():
    assert liveness(marker(ended_at=time.time()), DAY) is Liveness.ENDED


@pytest.fixture
def staging(tmp_path) -> StagingArea:
    return StagingArea(TableLocation.of(str(tmp_path / "table")))


def write(staging, m: AttemptMarker) -> None:
    staging._write_marker(m)


def test_a_run_waits_for_none_of_its_own_dead_or_committed_attempts(staging):
    pid, started = finished_pid()
    write(staging, marker(attempt_id="1" * 16, pid=pid, pid_started=started, run_key="other/1"))  # dead
    write(staging, marker(attempt_id="2" * 16, run_key="mine"))  # running, but the run's own key
    write(staging, marker(attempt_id="3" * 16, run_key="other/3", batch=3))  # batch 3 is committed
    write(staging, marker(attempt_id="4" * 16, run_key="other/4", batch=3, kind="reprocess"))  # may still commit
    write(staging, marker(attempt_id="5" * 16, run_key="other/5", batch=4))  # the next batch: running
    blocking = staging.blocking_attempts("mine", lambda ingest_id: {"orders": 3}.get(ingest_id), DAY)
    assert sorted(m.attempt_id for m in blocking) == ["4" * 16, "5" * 16]
    # another ingest id's batches say nothing about this one's
    blocking = staging.blocking_attempts("mine", lambda ingest_id: None, DAY)
    assert sorted(m.attempt_id for m in blocking) == ["3" * 16, "4" * 16, "5" * 16]
    assert len(staging.running_attempts(DAY)) == 4


def test_scratch_of_ended_and_dead_attempts_goes_and_of_running_ones_stays(staging, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_EO_SCRATCH_DIR", str(tmp_path / "scratch"))
    pid, started = finished_pid()
    attempts = {"d" * 16: marker(attempt_id="d" * 16, pid=pid, pid_started=started),
                "e" * 16: marker(attempt_id="e" * 16, ended_at=time.time()),
                "r" * 16: marker(attempt_id="r" * 16)}
    for attempt_id, m in attempts.items():
        write(staging, m)
        os.makedirs(os.path.join(live.scratch_dir(attempt_id), "blockmgr-x"))
    assert sorted(staging.collect_scratch(DAY)) == ["d" * 16, "e" * 16]
    assert os.listdir(live.scratch_root()) == ["r" * 16]


def test_another_hosts_attempt_that_renews_its_heartbeat_runs_past_the_grace_period(staging):
    long_ago = time.time() - 3600
    slow = marker(attempt_id="s" * 16, host="worker-2", pid=123, driver_host="worker-3", driver_pid=456,
                  started_at=long_ago)
    write(staging, slow)
    assert staging.liveness(slow, 600) is Liveness.DEAD  # no heartbeat: only its start can tell
    staging.renew(slow.attempt_id)  # a process of it says it is alive
    assert staging.liveness(slow, 600) is Liveness.RUNNING
    assert staging.liveness(slow, 600, now=time.time() + 601) is Liveness.DEAD  # it stopped renewing
    # its staged files are kept while it renews, and go once it stopped
    os.makedirs(os.path.join(staging.loc.root, f"b00000003-{slow.attempt_id}"))
    assert staging.collect_orphans(set(), 600) == []
    assert staging.collect_orphans(set(), 600, now=time.time() + 601) == [f"b00000003-{slow.attempt_id}"]


def test_the_heartbeat_renews_in_the_background_while_the_block_runs(staging):
    from airflow_eo.table.staging import Heartbeat

    with Heartbeat([(staging, "h" * 16)], grace_seconds=2):  # renews every 0.5 s
        first = staging.renewed_at("h" * 16)
        time.sleep(1.2)
        assert first is not None and staging.renewed_at("h" * 16) > first
    last = staging.renewed_at("h" * 16)
    time.sleep(0.7)
    assert staging.renewed_at("h" * 16) == last  # stopped with the block


def test_a_feed_goes_once_its_attempt_ended_even_a_committed_one_and_its_marker_stays(staging):
    """The read's staged copy for the tables through Spark (``…-feed``) is never in the table: unlike the
    attempt's own files it goes after a commit too, and never while the attempt runs."""
    committed = marker(attempt_id="c" * 16, ended_at=time.time(), committed=True)
    running = marker(attempt_id="r" * 16)
    for m in (committed, running):
        write(staging, m)
        os.makedirs(os.path.join(staging.loc.root, f"b00000003-{m.attempt_id}"))
        os.makedirs(os.path.join(staging.loc.root, f"b00000003-{m.attempt_id}{FEED_SUFFIX}"))
    assert staging.collect_orphans(set(), DAY) == [f"b00000003-{committed.attempt_id}{FEED_SUFFIX}"]
    assert sorted(os.listdir(staging.loc.root)) == sorted(
        ["_airflow_eo", f"b00000003-{committed.attempt_id}", f"b00000003-{running.attempt_id}",
         f"b00000003-{running.attempt_id}{FEED_SUFFIX}"])
    assert staging.read_marker(committed.attempt_id) == committed
