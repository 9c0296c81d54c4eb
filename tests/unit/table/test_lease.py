"""The table's lease (airflow_eo.table.lease) on temporary tables: taken atomically, waited for,
taken over from a dead holder by the liveness rule, renewed and released."""

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from airflow_eo.table.lease import Claim, HeldLease, LeaseHolder, LeasePurpose, TableLease
from airflow_eo.table.liveness import ProcessId, process_start_time
from airflow_eo.table.staging import AttemptMarker, StagingArea
from airflow_eo.table.storage import TableLocation


def claim(run_key: str, purpose: LeasePurpose = LeasePurpose.INGEST) -> Claim:
    return Claim(purpose, run_key, "orders")


@pytest.fixture
def lease(tmp_path) -> TableLease:
    return TableLease(TableLocation.of(str(tmp_path / "t")), grace_seconds=3600)


def dead_process() -> ProcessId:
    """A process of this host that has exited (its PID and start time, as a marker recorded them)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    started = process_start_time(child.pid)
    child.wait()
    return ProcessId(socket.gethostname(), child.pid, started)


def record(lease: TableLease, holder: LeaseHolder) -> None:
    """Write ``holder`` as the lease's newest commit, as another process would have."""
    version, _ = lease.newest()
    assert lease._commit(version, holder)


def test_a_free_lease_is_taken_held_and_released(lease):
    assert lease.holder() is None and lease.newest() == (None, None)
    held = lease.try_take(claim("dag/r1/ingest/-1"))
    assert isinstance(held, HeldLease)
    try:
        now = lease.holder()
        assert (now.run_key, now.purpose, now.host, now.pid) == ("dag/r1/ingest/-1", LeasePurpose.INGEST,
                                                                  socket.gethostname(), os.getpid())
        other = lease.try_take(claim("dag/r2/ingest/-1"))
        assert isinstance(other, LeaseHolder) and other.token == held.holder.token  # held: the other run is told by whom
        held.attempt("0123456789abcdef")
        assert lease.holder().attempt_id == "0123456789abcdef" and lease.holder().renewed_at >= now.renewed_at
    finally:
        held.release()
    assert lease.holder() is None and lease.newest()[1].released_at is not None
    second = lease.try_take(claim("dag/r2/ingest/-1"))
    assert isinstance(second, HeldLease)
    second.release()


def test_of_many_runs_taking_a_free_lease_at_once_exactly_one_holds_it(lease):
    barrier, got = threading.Barrier(6), []

    def take(i):
        barrier.wait()
        got.append(lease.try_take(claim(f"dag/r{i}/ingest/-1")))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    holders = [g for g in got if isinstance(g, HeldLease)]
    assert len(got) == 6 and len(holders) == 1
    assert {g.token for g in got if isinstance(g, LeaseHolder)} == {holders[0].holder.token}
    holders[0].release()


def test_a_waiting_run_logs_the_holder_and_stops_waiting_at_the_timeout(lease, caplog):
    held = lease.try_take(claim("dag/first/ingest/-1"))
    caplog.set_level(logging.INFO, logger="airflow_eo")
    started = time.monotonic()
    assert lease.wait(claim("dag/second/ingest/-1"), timeout=0.6, poll=0.1) is None
    assert 0.6 <= time.monotonic() - started < 5
    waiting = [r.getMessage() for r in caplog.records if "waiting for the lease" in r.getMessage()]
    assert waiting and "dag/first/ingest/-1" in waiting[0] and socket.gethostname() in waiting[0]
    assert any("planning from the table as it is" in r.getMessage() for r in caplog.records)
    # once the holder releases it, a waiting run takes it at once
    threading.Timer(0.3, held.release).start()
    started = time.monotonic()
    second = lease.wait(claim("dag/second/ingest/-1"), timeout=30, poll=0.1)
    assert isinstance(second, HeldLease) and time.monotonic() - started < 5
    second.release()


def test_a_dead_holder_on_this_host_is_taken_over_at_once(lease):
    gone = dead_process()
    dead = LeaseHolder("d" * 16, LeasePurpose.INGEST, "dag/killed/ingest/-1", "orders", gone.host, gone.pid,
                       gone.started, time.time(), time.time())
    record(lease, dead)
    assert lease.holder() is None
    started = time.monotonic()
    held = lease.wait(claim("dag/next/ingest/-1"), timeout=60)
    assert isinstance(held, HeldLease) and time.monotonic() - started < 2
    held.release()


def test_a_dead_holder_whose_attempt_still_runs_holds_the_lease(lease):
    """A spark-submit job may outlive the task that started it: its driver may still commit."""
    gone, me = dead_process(), ProcessId.current()
    StagingArea(lease.location)._write_marker(AttemptMarker(
        "e" * 16, 3, "dag/killed/ingest/-1", time.time(), host=gone.host, pid=gone.pid, pid_started=gone.started,
        driver_host=me.host, driver_pid=me.pid, driver_pid_started=me.started, ingest_id="orders", kind="ingest"))
    record(lease, LeaseHolder("d" * 16, LeasePurpose.INGEST, "dag/killed/ingest/-1", "orders", gone.host, gone.pid,
                              gone.started, time.time(), time.time(), attempt_id="e" * 16))
    assert lease.holder().attempt_id == "e" * 16
    assert isinstance(lease.try_take(claim("dag/next/ingest/-1")), LeaseHolder)
    StagingArea(lease.location).end_attempt("e" * 16)  # the job ended
    assert lease.holder() is None


def test_another_hosts_holder_holds_it_until_the_grace_period_after_its_last_renewal(tmp_path):
    location = TableLocation.of(str(tmp_path / "t"))
    renewed = time.time() - 10
    record(TableLease(location), LeaseHolder("f" * 16, LeasePurpose.INGEST, "dag/elsewhere/ingest/-1", "orders",
                                             "worker-elsewhere", 4242, 1.0, renewed - 100, renewed))
    assert TableLease(location, grace_seconds=60).holder().host == "worker-elsewhere"
    assert TableLease(location, grace_seconds=5).holder() is None
    taken = TableLease(location, grace_seconds=5).try_take(claim("dag/next/ingest/-1"))
    assert isinstance(taken, HeldLease)
    taken.release()


def test_an_earlier_try_of_the_same_run_does_not_make_its_retry_wait(lease):
    first = lease.try_take(claim("dag/r1/ingest/-1"))
    retry = lease.try_take(claim("dag/r1/ingest/-1"))
    assert isinstance(retry, HeldLease) and retry.holder.token != first.holder.token
    first.renew()  # the earlier try learns it lost the lease, and stops renewing it
    assert first.lost and lease.holder().token == retry.holder.token
    first.release()  # releases nothing of the retry's
    assert lease.holder().token == retry.holder.token
    retry.release()


def test_renewals_run_in_the_background_until_release(tmp_path):
    lease = TableLease(TableLocation.of(str(tmp_path / "t")), grace_seconds=2)  # renewed every 0.5 s
    held = lease.try_take(claim("dag/r1/maintain/-1", LeasePurpose.MAINTAIN))
    first = lease.holder().renewed_at
    time.sleep(1.6)
    assert lease.holder().renewed_at > first and lease.holder().purpose is LeasePurpose.MAINTAIN
    held.release()
    released = lease.newest()
    time.sleep(1.1)
    assert lease.newest() == released  # no renewal after the release


def test_a_lease_that_cannot_be_read_lets_the_run_go_on_without_it(lease, caplog):
    log_dir = os.path.join(lease.uri, "_delta_log")
    os.makedirs(log_dir)
    with open(os.path.join(log_dir, "00000000000000000000.json"), "w") as f:
        f.write("not a delta log\n")
    caplog.set_level(logging.WARNING, logger="airflow_eo")
    assert lease.wait(claim("dag/r1/ingest/-1"), timeout=5) is None
    assert any("going on without it" in r.getMessage() for r in caplog.records)
