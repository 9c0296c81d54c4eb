"""A fan-out killed at each step and retried: every table equals its model, its offsets the batch end.

One topic of mixed events (tests/fanout.py) into four tables in one ingest: a raw append table, a
merge table (current row per id), and a table per event type by the sink's ``filter``. One run key
is killed with ``kill -9`` while its Spark tasks read, between two sinks' commits, and after the last
commit, then retried unharmed; a second batch (on the Connect path) keeps no record for one filter's
table, which still advances. On both Spark paths: spark-submit (the harness's :class:`KillingSubmit`)
and a warm Spark Connect server (``airflow-eo ingest --spec FILE --remote``, killed as the soak's
:class:`ConnectClients` kills a single table's client).

After every run each table is either untouched or holds the whole batch (never part of it, never
twice, never an aborted record), read with DuckDB's delta extension; a table's offsets are the
batch's end exactly when it holds the batch.

Budget: 3 spark-submits and 5 warm Connect clients (~1.5-2 min on 2 cores; ~4 min while the machine is loaded).
"""

from __future__ import annotations

import random

import pytest

from airflow_eo.attempt import Secrets
from airflow_eo.core.errors import AirflowEoError
from airflow_eo.loop.ingest import FanOut
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.spec.fanout import FanOutSpec
from airflow_eo.testing.kafka import TestBroker
from tests.fanout import MixedEvents, assert_table, assert_tables, sinks, spec_file, tables
from tests.helpers import new_topic
from tests.system.faults.harness import Outcome, run_once
from tests.system.faults.paths import AIRFLOW_EO, ConnectClients

pytestmark = pytest.mark.faults

INGEST_ID = "fan"
WINDOWS = ("reading", "between_sink_commits", "after_commit")


class SpecClients(ConnectClients):
    """``airflow-eo ingest --spec FILE --remote URL``: the fan-out as a user's command line runs it, on
    the session's warm server; killed as the soak kills its Connect clients."""

    def __init__(self, spec_path: str, first_table: str, topic: str, kafka_config: dict, server, log_dir: str):
        super().__init__(first_table, INGEST_ID, topic, kafka_config, log_dir)
        self.spec_path, self.server = spec_path, server

    def _command(self, run_key: str) -> list[str]:
        return [AIRFLOW_EO, "ingest", "--spec", self.spec_path, "--remote", self.server.url, "--run-key", run_key,
                "--json"]


@pytest.fixture(params=["spark-submit", "connect"])
def path(request):
    return request.param


def runner(path: str, options: dict, kafka_config: dict, first_table: str, topic: str, tmp_path, request):
    """``run(run_key, window) -> Outcome`` on ``path``."""
    rng = random.Random(39)
    if path == "connect":
        clients = SpecClients(spec_file(str(tmp_path / "spec.json"), options), first_table, topic, kafka_config,
                              request.getfixturevalue("connect_server"), str(tmp_path))
        return lambda key, window: clients(key, window, rng)
    spec, secrets = FanOutSpec.of(**options), Secrets(kafka_config)
    return lambda key, window: run_once(None, key, window, rng, loop=lambda submit: FanOut(spec, secrets, submit))


def holds(ts, broker: TestBroker, topic: str, ends: dict) -> list[str]:
    """The tables holding the batch that ends at ``ends`` (each equal to its model up to there); the
    others committed nothing at all."""
    done = []
    for t in ts:
        try:
            assert_table(t, broker, topic, ingest_id=INGEST_ID, ends=ends)
            done.append(t.name)
        except AssertionError as held:  # then it must be untouched
            try:
                assert_table(t, broker, topic, ingest_id=INGEST_ID, ends=None)
            except AssertionError as untouched:
                raise AssertionError(f"{t.name} neither holds the batch ({held}) nor is untouched ({untouched})") from None
    return done


def status_of(outcome: Outcome) -> str:
    assert outcome.error is None, outcome.error
    return str(outcome.result.status)  # a RunStatus, or the CLI summary's string


def test_a_fan_out_killed_at_each_step_and_retried_keeps_every_tables_model(path, kafka_config, tmp_path, request):
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    topic = new_topic(kafka_config, 3)
    ts = tables(str(tmp_path / "tables"))
    options = {"topics": [topic], "ingest_id": INGEST_ID, "driver_read_max_offsets": 0, "sinks": sinks(ts)}
    run = runner(path, options, kafka_config, min(t.uri for t in ts), topic, tmp_path, request)
    events = MixedEvents(broker, topic)
    events.send(range(30), types="abc")
    events.send(range(0, 30, 3), types="ab", abort=True)  # never in any table, not even as a key's last change
    events.send(range(0, 30, 2), types="cab")
    ends = broker.end_offsets(topic)

    for window in WINDOWS:  # one run key: the retries of one task
        outcome = run("first", window)
        assert outcome.killed, f"{path}: the run was not killed in {window}"
        if outcome.error is not None:  # died before its batch was in every table: one of ours, retryable
            assert isinstance(outcome.error, (AirflowEoError, RuntimeError)), outcome.error
        done = holds(ts, broker, topic, ends)
        if window == "between_sink_commits":  # a sink committed, then the process died before the next
            assert 0 < len(done) < len(ts), f"killed between two sinks' commits, yet these hold the batch: {done}"
        if window == "after_commit":  # the retry committed the rest, then died
            assert len(done) == len(ts), done
    rerun = run("first", None)
    assert status_of(rerun) == RunStatus.ALREADY_COMMITTED.value
    if path == "spark-submit":  # every table holds the batch: no Spark job starts
        assert not any(t.spark_started for t in rerun.result.tables), rerun.result.to_dict()
    counts = assert_tables(ts, broker, topic, ingest_id=INGEST_ID, ends=ends)
    assert counts["type_a"] and counts["type_b"] and counts["raw"] > counts["current"], counts

    if path == "spark-submit":  # the next batch is the loop's, not the path's: on the cheaper path only
        return
    # a batch in which type_b's filter keeps nothing: its table advances all the same
    events.send(range(10), types="ac")
    events.send(range(5), types="b", abort=True)
    ends = broker.end_offsets(topic)
    second = run("second", None)
    assert status_of(second) == RunStatus.COMMITTED.value
    after = assert_tables(ts, broker, topic, ingest_id=INGEST_ID, ends=ends)
    assert after["type_b"] == counts["type_b"] and after["raw"] == counts["raw"] + 10, (counts, after)


class Reprocessing:
    """A reprocess as ``run_once`` runs a loop: ``run(requester)`` replaces the batch of ``target`` in every table."""

    def __init__(self, ingest: FanOut, target: str):
        self.ingest, self.target = ingest, target

    def run(self, requester):
        from airflow_eo.loop.reprocess import reprocess

        return reprocess(self.ingest, requester, self.target)


class ReprocessClients(SpecClients):
    """``airflow-eo reprocess --spec FILE --run-key TARGET --request-key KEY --remote URL``: the request's retries
    are the same command with the same request key."""

    target = "first"

    def _command(self, run_key: str) -> list[str]:
        return [AIRFLOW_EO, "reprocess", "--spec", self.spec_path, "--remote", self.server.url, "--run-key",
                self.target, "--request-key", run_key, "--json"]


REPROCESS_WINDOWS = ("reading", "between_sink_commits", "before_dead_letters", "after_commit")


def test_a_fan_out_reprocess_killed_at_each_step_replaces_each_tables_batch_once(path, kafka_config, tmp_path, request):
    """One run's batch in a raw and a merge table, each with its dead-letter table, reprocessed for both
    sinks and killed at each step (while it reads, between the two tables' commits, between a table's
    commit and its dead letters', after the last): after every attempt each table equals its model, its
    offsets unmoved, and each dead-letter table holds each undecodable record of the batch once."""
    from airflow_eo.table.ledger import Ledger
    from tests.delta_tables import duckdb_rows
    from tests.fanout import decodable

    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    topic = new_topic(kafka_config, 2)
    ts = tables(str(tmp_path / "tables"), ("raw", "current"))
    options = {"topics": [topic], "ingest_id": INGEST_ID, "driver_read_max_offsets": 0, "value_format": "json",
               "value_schema": "type STRING, id BIGINT, n BIGINT",
               "sinks": [{**t.sink, "dead_letter_table_uri": f"{t.uri}_dead"} for t in ts]}
    events = MixedEvents(broker, topic)
    events.send(range(20), types="abc")
    broken = broker.produce(topic, [b"{not json %d" % i for i in range(5)])
    events.send(range(0, 20, 2), types="ba")
    ends = broker.end_offsets(topic)
    first = (runner(path, options, kafka_config, min(t.uri for t in ts), topic, tmp_path, request))("first", None)
    assert status_of(first) == RunStatus.COMMITTED.value
    assert_tables(ts, broker, topic, ingest_id=INGEST_ID, ends=ends, keep=decodable)

    if path == "connect":
        clients = ReprocessClients(spec_file(str(tmp_path / "spec.json"), options), min(t.uri for t in ts), topic,
                                   kafka_config, request.getfixturevalue("connect_server"), str(tmp_path))
        rng = random.Random(7)
        run = lambda key, window: clients(key, window, rng)  # noqa: E731
    else:
        spec, secrets, rng = FanOutSpec.of(**options), Secrets(kafka_config), random.Random(7)
        run = lambda key, window: run_once(  # noqa: E731
            None, key, window, rng, loop=lambda submit: Reprocessing(FanOut(spec, secrets, submit), "first"))

    def dead_letters_once() -> None:
        for t in ts:
            offsets = sorted(duckdb_rows(f"{t.uri}_dead", 'SELECT "partition", "offset" FROM t'))
            assert len(offsets) == broken and len(set(offsets)) == broken, f"{t.name}'s dead letters: {offsets}"

    for window in REPROCESS_WINDOWS:  # a request per window, killed there, then retried until it is done
        key = f"request-{window}"
        outcome = run(key, window)
        assert outcome.killed, f"{path}: the reprocess was not killed in {window}"
        assert_tables(ts, broker, topic, ingest_id=INGEST_ID, ends=ends, keep=decodable)
        dead_letters_once()
        if outcome.error is not None:  # a table stayed behind: the retry replays the same request
            retry = run(key, None)
            assert status_of(retry) in (RunStatus.REPROCESSED.value, RunStatus.ALREADY_REPROCESSED.value)
            if path == "spark-submit":  # a table the killed attempt reprocessed reports its commit
                assert {str(t.status) for t in retry.result.tables} <= {"reprocessed", "already_reprocessed"}
            assert_tables(ts, broker, topic, ingest_id=INGEST_ID, ends=ends, keep=decodable)
            dead_letters_once()
    for t in ts:  # each request replaced each table's batch once, and its dead letters once
        assert Ledger.open(t.uri).reprocess_count(INGEST_ID, 1) == len(REPROCESS_WINDOWS)
        assert Ledger.open(f"{t.uri}_dead").reprocess_count(INGEST_ID, 1) == len(REPROCESS_WINDOWS)
