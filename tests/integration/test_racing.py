"""Runs of one table started together, as a backfill or a catch-up starts them, each given no retry:
all succeed, every record is in the table once, and no run starts a Spark job it then loses
(airflow_eo.table.lease: runs take turns before they plan; interval batches are rebased at commit).

On the real broker and both Spark paths (``spark_path``: the local session, the Connect server);
the runs are threads of this process, each with its own ingestion. ``test_killed_attempts.py`` has
the lease across processes (killed holders), ``test_racing_processes`` below a backfill of
separate ``airflow-eo ingest`` processes on spark-submit.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from airflow_eo.core.offsets import Interval, RunIdentity
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.lease import TableLease
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation
from tests.helpers import assert_exactly_once, new_topic, produce
from tests.integration.test_interval_mode import PARTITIONS, expected_owner, hour_base, hours, produce_at, timeline

CLI = os.path.join(os.path.dirname(sys.executable), "airflow-eo")


def at_once(jobs) -> list:
    """Start every job together (threads), wait for all; each job's result, or the error it raised."""
    results: list = [None] * len(jobs)
    gate = threading.Barrier(len(jobs))

    def run(i):
        gate.wait()
        try:
            results[i] = jobs[i]()
        except Exception as exc:  # the outcome under test: no run may fail
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), name=f"run-{i}") for i in range(len(jobs))]
    [t.start() for t in threads]
    [t.join(900) for t in threads]
    assert not any(t.is_alive() for t in threads), "a run did not finish"
    return results


def assert_no_attempt_lost(table_uri: str, committed_by_spark: int) -> None:
    """Every attempt a run started committed: no Spark job was started by a run that then lost."""
    markers = StagingArea(TableLocation.of(table_uri)).markers()
    assert [m for m in markers if not m.committed] == []
    assert len(markers) == committed_by_spark


@pytest.fixture
def ingestion(ingestion):
    return functools.partial(ingestion, ingest_id="racing")


def test_six_intervals_of_one_table_at_once_all_commit_on_their_first_try(broker, kafka_config, spark_path, tmp_path,
                                                                           ingestion):
    topic, base = new_topic(kafka_config, PARTITIONS), hour_base()
    produce_at(kafka_config, topic, timeline(base))
    intervals = hours(base)
    owner, _ = expected_owner(broker.bootstrap_servers, topic, intervals)
    uri = str(tmp_path / "intervals")

    def run(i: int):
        ing = ingestion(uri, topic, kafka_config, spark_path.submitter(), mode="interval")
        return ing.run(RunIdentity(f"backfill/{i}/ingest/-1"), intervals[i])

    results = at_once([functools.partial(run, i) for i in range(6)])
    assert [getattr(r, "status", r) for r in results] == ["committed"] * 6, results
    assert sorted(r.batch for r in results) == list(range(1, 7))
    committed = IntervalLedger(Ledger.open(uri), "racing").committed()
    assert sorted(c.interval for c in committed) == intervals
    for result in results:  # each run's own batch holds its own interval
        assert Interval(**result.interval) in {c.interval for c in committed if c.batch == result.batch}
    assert assert_exactly_once(uri, broker.bootstrap_servers, [topic], "racing") == len(owner)
    assert_no_attempt_lost(uri, 6)
    assert TableLease(TableLocation.of(uri)).holder() is None  # every run gave the lease back


def test_four_offset_runs_at_once_with_a_live_producer_all_succeed(broker, kafka_config, spark_path, tmp_path,
                                                                    ingestion):
    topic = new_topic(kafka_config, 2)
    uri = str(tmp_path / "offsets")
    produced, stop = [60], threading.Event()
    produce(kafka_config, topic, 60, partitions=2)

    def producer():  # records keep arriving while the runs race
        while not stop.wait(0.3):
            produce(kafka_config, topic, 5, partitions=2, start=produced[0])
            produced[0] += 5

    feeding = threading.Thread(target=producer)
    feeding.start()
    statuses: list = []
    try:
        for wave in range(2):
            results = at_once([functools.partial(
                lambda k: ingestion(uri, topic, kafka_config, spark_path.submitter()).run(RunIdentity(k)),
                f"wave{wave}/run{i}/ingest/-1") for i in range(4)])
            statuses += [getattr(r, "status", r) for r in results]
            # a run whose records another run committed while it waited plans the next ones, or nothing
            assert all(s in ("committed", "nothing_new") for s in statuses), statuses
    finally:
        stop.set()
        feeding.join()
    assert statuses.count("committed") >= 2
    assert ingestion(uri, topic, kafka_config, spark_path.submitter()).run(RunIdentity("catch-up")).status == "committed"
    assert assert_exactly_once(uri, broker.bootstrap_servers, [topic], "racing") == produced[0]  # 0 lost, 0 doubled
    batches = Ledger.open(uri).batches("racing", limit=None)
    assert sorted(b.meta.batch for b in batches) == list(range(1, len(batches) + 1))  # in commit order, no gap
    assert_no_attempt_lost(uri, len(batches))


def test_a_backfill_of_separate_processes_takes_turns_before_it_plans(broker, kafka_config, tmp_path):
    """Six ``airflow-eo ingest`` processes of six intervals started at once (spark-submit, no retry),
    as the issue's backfill did: every one commits once; the waiting ones log who holds the lease."""
    topic, base = new_topic(kafka_config, PARTITIONS), hour_base()
    produce_at(kafka_config, topic, timeline(base, seed=5))
    intervals = hours(base)
    owner, _ = expected_owner(broker.bootstrap_servers, topic, intervals)
    uri = str(tmp_path / "backfill")
    env = {**os.environ, "AIRFLOW_EO_SCRATCH_DIR": str(tmp_path / "scratch")}
    started = time.monotonic()
    processes = [subprocess.Popen(
        [CLI, "ingest", "--table", uri, "--ingest-id", "racing", "--topics", topic, "--bootstrap-servers",
         kafka_config["bootstrap.servers"], "--run-key", f"backfill/{uuid.uuid4().hex[:6]}/{i}",
         "--interval-start", str(iv.start_ms), "--interval-end", str(iv.end_ms), "--json",
         "--master", "local[1]", "--conf", "spark.ui.enabled=false"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i, iv in enumerate(intervals)]
    outputs = [p.communicate(timeout=900) for p in processes]
    assert [p.returncode for p in processes] == [0] * 6, [err[-2000:] for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    assert sorted((r["status"], r["batch"]) for r in results) == [("committed", b) for b in range(1, 7)]
    assert any("waiting for the lease of" in err for _, err in outputs)  # who holds it, and since when
    assert assert_exactly_once(uri, broker.bootstrap_servers, [topic], "racing") == len(owner)
    assert_no_attempt_lost(uri, 6)
    print(f"six racing interval processes: {time.monotonic() - started:.1f} s")


def test_interval_runs_that_do_not_wait_are_rebased_and_stay_replayable(broker, kafka_config, spark, tmp_path,
                                                                         ingestion):
    """Runs that stop waiting for the lease at once (``table_wait_timeout=0``) plan from the same table
    state: every interval still commits, later ones under the next batch numbers (rebased, no Spark
    again); a retry of a rebased run finds its batch, and its reprocess replaces exactly its rows."""
    from airflow_eo.driver.main import InProcessSubmitter
    from airflow_eo.loop.reprocess import Reprocessor

    topic, base = new_topic(kafka_config, PARTITIONS), hour_base()
    produce_at(kafka_config, topic, timeline(base, seed=9))
    intervals = hours(base)[:3]
    owner, _ = expected_owner(broker.bootstrap_servers, topic, hours(base))
    uri = str(tmp_path / "rebased")

    def build():
        return ingestion(uri, topic, kafka_config, InProcessSubmitter(spark), mode="interval", table_wait_timeout=0)

    results = at_once([functools.partial(lambda i: build().run(RunIdentity(f"nowait/{i}"), intervals[i]), i)
                       for i in range(3)])
    assert [getattr(r, "status", r) for r in results] == ["committed"] * 3, results
    assert sorted(r.batch for r in results) == [1, 2, 3]
    records = {b.meta.batch: b.meta for b in Ledger.open(uri).batches("racing", limit=None)}
    rebased = [m for m in records.values() if m.planned_batch is not None]
    assert rebased and all(m.planned_batch < m.batch for m in rebased), records  # all planned from the empty table
    assert_no_attempt_lost(uri, 3)
    mine = {c.interval: c.batch for c in IntervalLedger(Ledger.open(uri), "racing").committed()}
    assert {Interval(**r.interval): r.batch for r in results} == mine  # each summary names its own batch
    # a rebased run: its retry (replaying its logged plan of the number it planned) and its reprocess
    target = next(r for r in results if records[r.batch].planned_batch is not None)
    retry = build().run(RunIdentity(target.run_key), Interval(**target.interval))
    assert (retry.status, retry.batch, retry.spark_started) == ("already_committed", target.batch, False)
    redone = Reprocessor(build()).run(RunIdentity("fix/1"), target.run_key)
    assert (redone.status, redone.batch, redone.rows) == ("reprocessed", target.batch, target.rows)
    in_batch = {(r["topic"], r["partition"], o) for r in target.ranges for o in range(r["start"], r["end"])}
    assert in_batch == {k for k, iv in owner.items() if iv == Interval(**target.interval)}
    assert assert_exactly_once(uri, broker.bootstrap_servers, [topic], "racing") == \
        sum(1 for iv in owner.values() if iv in intervals)


def test_two_fan_outs_sharing_two_tables_started_together_under_live_produce_lose_and_double_nothing(
        kafka_config, tmp_path):
    """Ingests {a, b, c} and {b, a, d} of one ingest id (so a and b are written by both), each an
    ``airflow-eo ingest --spec`` process, started together five times while a producer writes: they take
    the shared tables' leases in one order (table_uri), so neither deadlocks nor waits past its
    ``table_wait_timeout``; every table holds each record below its offsets once."""
    from tests.system.faults.harness import FlowingProducer

    topic = new_topic(kafka_config, 2)
    root = tmp_path / "tables"
    timeout = 120

    def spec(path, names):
        path.write_text(json.dumps({"ingest_id": "shared", "topics": [topic], "table_wait_timeout": timeout,
                                    "sinks": [{"table_uri": str(root / n)} for n in names]}))
        return str(path)

    specs = [spec(tmp_path / "one.json", "abc"), spec(tmp_path / "two.json", "bad")]
    from airflow_eo.attempt import Env

    env = {**os.environ, Env.KAFKA_CONFIG: json.dumps(kafka_config)}

    def ingest(path: str, key: str):
        started = time.monotonic()
        done = subprocess.run([CLI, "ingest", "--spec", path, "--master", "local[1]", "--run-key", key, "--json"],
                              env=env, capture_output=True, text=True, timeout=600)
        # the error lines first (a long log's tail alone cut the error's own line short), then the tail
        errors = [line for line in done.stderr.splitlines() if " ERROR " in line or "Error" in line]
        assert done.returncode == 0, "\n".join([*errors[-5:], "...", done.stderr[-1500:]])
        return json.loads(done.stdout), time.monotonic() - started

    with FlowingProducer(kafka_config, topic, 2, rate=100):
        for round_ in range(5):
            results = at_once([functools.partial(ingest, path, f"{i}-{round_}") for i, path in enumerate(specs)])
            for result in results:
                assert not isinstance(result, BaseException), str(result)
                summary, seconds = result
                assert seconds < timeout, f"a run waited past its table_wait_timeout: {seconds:.0f} s"
                assert {t["status"] for t in summary["tables"]} <= {"committed", "nothing_new"}, summary
    for name in "abcd":
        assert assert_exactly_once(str(root / name), kafka_config["bootstrap.servers"], [topic], ingest_id="shared")
