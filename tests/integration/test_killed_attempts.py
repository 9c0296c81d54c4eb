"""A task killed with SIGKILL (OOM killer, evicted pod, lost worker) must not stall its table.

It may die holding the table's lease (airflow_eo.table.lease): while it plans, while its Spark
job runs, during its commit. The next run takes the lease over within seconds on the same host,
and after the grace period when the holder ran on another host.

The submitting process is ``airflow-eo ingest`` itself, run as a user would (its own
session, real spark-submit or a real Spark Connect server, the session's broker), killed by
a failpoint: before its Spark job starts (``before_submit``), or with its whole process
group once the driver started (``before_read@group``: the CLI, spark-submit's JVM and the
Python driver die together). Then, as Airflow's retry and the table's next run would:
neither waits for the dead attempt, the retry commits its batch once, a new run commits the
next, every record is in the table once, and the killed job's Spark scratch is gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.status import table_status
from airflow_eo.table.lease import Claim, HeldLease, LeaseHolder, LeasePurpose, TableLease
from airflow_eo.table.liveness import Liveness, liveness
from airflow_eo.table.staging import AttemptMarker, StagingArea
from airflow_eo.table.storage import TableLocation
from tests.helpers import broker_records, duplicates, keys_of, new_topic, produce, read_table

CLI = os.path.join(os.path.dirname(sys.executable), "airflow-eo")
INGEST_ID = "killed"


class NeverSubmit:
    def submit(self, attempt, secrets):  # pragma: no cover - the waits below start nothing
        raise AssertionError("no Spark job expected")


def cli_ingest(kafka_config, table, topic, run_key, scratch, remote=None, failpoints="", timeout=300, extra=()):
    """``airflow-eo ingest`` in a session of its own (so a group kill takes exactly its processes)."""
    cmd = [CLI, "ingest", "--table", table, "--ingest-id", INGEST_ID, "--topics", topic,
           "--bootstrap-servers", kafka_config["bootstrap.servers"], "--run-key", run_key, "--json", *extra]
    cmd += ["--remote", remote] if remote else ["--master", "local[1]", "--conf", "spark.ui.enabled=false"]
    env = {**os.environ, "AIRFLOW_EO_SCRATCH_DIR": scratch, "AIRFLOW_EO_FAILPOINTS": failpoints}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True)


def markers(table) -> list[AttemptMarker]:
    return StagingArea(TableLocation.of(table)).markers()


def ingestion(kafka_config, table, topic) -> Ingestion:
    return Ingestion(IngestConfig(table_uri=table, ingest_id=INGEST_ID, topics=[topic], kafka_config=kafka_config),
                     NeverSubmit())


def assert_exactly_once(kafka_config, table, topic):
    rows = read_table(table)
    assert duplicates(rows) == {}
    assert set(keys_of(rows)) == set(broker_records(kafka_config["bootstrap.servers"], topic))


@pytest.fixture
def scratch(tmp_path):
    path = tmp_path / "scratch"
    path.mkdir()
    return str(path)


@pytest.fixture(params=["spark-submit", "connect"])
def remote(request):
    return request.getfixturevalue("connect_server").url if request.param == "connect" else None


# A batch this small is read by the driver itself (driver_read_max_offsets); the last case makes it
# run as Spark tasks, so a driver with a SparkContext (or a Connect job's operations) is killed too.
@pytest.mark.parametrize("killed_at, extra", [
    ("before_submit", ()), ("before_read@group", ()), ("before_read@group", ("--driver-read-max-offsets", "0")),
], ids=["before_submit", "before_read@group", "before_read@group-spark-tasks"])
def test_a_killed_attempt_stalls_neither_its_retry_nor_the_next_run(kafka_config, table_uri, scratch, remote,
                                                                     killed_at, extra):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 40, partitions=2)
    killed = cli_ingest(kafka_config, table_uri, topic, "run-1", scratch, remote, failpoints=killed_at, extra=extra)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
    (dead,) = markers(table_uri)
    assert dead.ended_at is None and dead.host == socket.gethostname() and dead.pid and dead.pid_started
    assert (dead.driver_pid == 0) == (killed_at == "before_submit")
    deadline = time.monotonic() + 10  # SIGKILL is delivered at once, a JVM's teardown takes a moment
    while liveness(dead, grace_seconds=24 * 3600) is not Liveness.DEAD:
        assert time.monotonic() < deadline, f"attempt still running: {dead}"
        time.sleep(0.2)
    if remote is None and killed_at != "before_submit":  # the job had its scratch: left behind by the kill
        assert os.listdir(os.path.join(scratch, dead.attempt_id))

    ing = ingestion(kafka_config, table_uri, topic)
    started = time.monotonic()
    assert ing.wait_for_turn(timeout=120, run_key="run-1") < 5  # the retry: no wait
    assert ing.wait_for_turn(timeout=120, run_key="run-2") < 5  # another run: no wait either
    assert time.monotonic() - started < 10

    retry = cli_ingest(kafka_config, table_uri, topic, "run-1", scratch, remote, extra=extra)
    assert retry.returncode == 0, retry.stderr[-3000:]
    result = json.loads(retry.stdout)
    assert (result["status"], result["batch"], result["rows"]) == ("committed", 1, 40)
    produce(kafka_config, topic, 10, partitions=2, start=40)
    following = cli_ingest(kafka_config, table_uri, topic, "run-2", scratch, remote, extra=extra)
    assert following.returncode == 0, following.stderr[-3000:]
    assert (json.loads(following.stdout)["status"], json.loads(following.stdout)["batch"]) == ("committed", 2)
    assert_exactly_once(kafka_config, table_uri, topic)
    assert os.listdir(scratch) == []  # the killed job's scratch went with the next run; the others' at their end


def one_committed_batch(kafka_config, table_uri, scratch) -> str:
    """A one-partition topic of 5 records, committed by run-1 (the table exists); the topic's name."""
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 5, partitions=1)
    first = cli_ingest(kafka_config, table_uri, topic, "run-1", scratch)
    assert first.returncode == 0, first.stderr[-3000:]
    return topic


def test_an_attempt_of_another_host_still_makes_a_run_wait_and_status_shows_it(kafka_config, table_uri, scratch):
    topic = one_committed_batch(kafka_config, table_uri, scratch)
    staging = StagingArea(TableLocation.of(table_uri))
    foreign = AttemptMarker("f" * 16, 2, "other/run/ingest/-1", time.time() - 60, host="worker-elsewhere",
                            pid=4242, pid_started=1.0, ingest_id=INGEST_ID, kind="ingest")
    staging._write_marker(foreign)  # as a worker on another host writes it
    assert liveness(foreign, grace_seconds=3600) is Liveness.RUNNING

    waited = ingestion(kafka_config, table_uri, topic).wait_for_turn(timeout=3, run_key="run-2", poll=0.5)
    assert waited >= 3  # the grace rule: another host's attempt is waited for up to the timeout

    (shown,) = table_status(table_uri, INGEST_ID, kafka_config).attempts
    assert (shown.attempt_id, shown.host, shown.batch, shown.run_key) == \
        ("f" * 16, "worker-elsewhere", 2, "other/run/ingest/-1")
    assert 59 <= shown.age_seconds < 600 and "another host" in shown.why
    printed = subprocess.run([CLI, "status", table_uri, "--ingest-id", INGEST_ID], capture_output=True, text=True,
                             timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert "waiting for: attempt ffffffffffffffff" in printed.stdout and "worker-elsewhere" in printed.stdout

    # once its grace period has passed it no longer blocks anything
    assert liveness(foreign, grace_seconds=30) is Liveness.DEAD


@pytest.mark.parametrize("killed_at", ["while_planning", "before_read@group", "during_commit@group"],
                         ids=["planning", "spark-running", "committing"])
def test_a_lease_holder_killed_is_taken_over_within_seconds(kafka_config, table_uri, scratch, remote, killed_at):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 40, partitions=2)
    killed = cli_ingest(kafka_config, table_uri, topic, "run-1", scratch, remote, failpoints=killed_at)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
    lease = ingestion(kafka_config, table_uri, topic).lease()
    _, holder = lease.newest()
    assert (holder.run_key, holder.host, holder.released_at) == ("run-1", socket.gethostname(), None)  # died holding it
    assert bool(holder.attempt_id) == (killed_at != "while_planning")  # an attempt started, or not yet

    started = time.monotonic()  # the next run, as a waiting run of the table would
    held = lease.wait(Claim(LeasePurpose.INGEST, "run-2", INGEST_ID), timeout=120, poll=0.2)
    assert isinstance(held, HeldLease) and time.monotonic() - started < 10  # the JVM's teardown takes a moment
    held.release()
    following = cli_ingest(kafka_config, table_uri, topic, "run-2", scratch, remote)
    assert following.returncode == 0, following.stderr[-3000:]
    assert (json.loads(following.stdout)["status"], json.loads(following.stdout)["rows"]) == ("committed", 40)
    retry = cli_ingest(kafka_config, table_uri, topic, "run-1", scratch, remote)  # its plan never committed
    assert retry.returncode == 0 and json.loads(retry.stdout)["status"] == "nothing_new", retry.stderr[-3000:]
    assert_exactly_once(kafka_config, table_uri, topic)
    assert lease.holder() is None


def test_a_lease_holder_on_another_host_is_waited_for_until_the_grace_period(kafka_config, table_uri, scratch):
    topic = one_committed_batch(kafka_config, table_uri, scratch)
    lease = TableLease(TableLocation.of(table_uri))
    version, _ = lease.newest()
    now = time.time()  # a worker elsewhere took the lease, then stopped renewing it (its host was lost)
    assert lease._commit(version, LeaseHolder("f" * 16, LeasePurpose.INGEST, "other/run/ingest/-1", INGEST_ID,
                                              "worker-elsewhere", 4242, 1.0, now - 60, now, attempt_id="f" * 16))
    shown = table_status(table_uri, INGEST_ID, kafka_config).lease
    assert (shown.host, shown.run_key, shown.attempt_id) == ("worker-elsewhere", "other/run/ingest/-1", "f" * 16)
    printed = subprocess.run([CLI, "status", table_uri, "--ingest-id", INGEST_ID], capture_output=True, text=True,
                             timeout=120)
    assert "lease: held by ingest run other/run/ingest/-1, attempt ffffffffffffffff on worker-elsewhere" in printed.stdout

    produce(kafka_config, topic, 5, partitions=1, start=5)
    run = cli_ingest(kafka_config, table_uri, topic, "run-2", scratch, extra=("--staging-grace-seconds", "6"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert (json.loads(run.stdout)["status"], json.loads(run.stdout)["rows"]) == ("committed", 5)
    assert "waiting for the lease of" in run.stderr and "worker-elsewhere" in run.stderr
    assert "taking it over" in run.stderr
    _, taker = lease.newest()
    assert taker.run_key == "run-2" and 6 - 0.5 <= taker.since - now < 6 + 30  # after the grace, then within seconds
    assert_exactly_once(kafka_config, table_uri, topic)
