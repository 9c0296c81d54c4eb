"""IntervalClosedTrigger's decision against Kafka held in memory (tests/unit/fakes.py) and real Delta
ledgers: it fires when every partition has a record past the interval's end, when close_after
passes, or when the interval is already committed, exactly when the plan would stop refusing;
errors become events the operator raises as their own type.

The connection is a real Airflow connection (an environment variable); the Kafka client class is
replaced by the fake at the trigger module's boundary.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from airflow_eo.core.errors import IntervalNotClosedError, KafkaUnavailableError, TableError
from airflow_eo.loop.planner import IntervalPlanner
from airflow_eo.core.offsets import Interval, RunIdentity, TopicPartition
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.app_ids import batch_app_id, interval_app_id, interval_at_app_id, span_app_id
from airflow_eo.triggers import interval_closed
from airflow_eo.triggers.interval_closed import IntervalClosedTrigger
from airflow_eo.triggers.polling import error_of_event
from tests.conftest import build_config
from tests.unit.fakes import FakeKafka, Txn, ledger_table

T0, T1 = TopicPartition("orders", 0), TopicPartition("orders", 1)
HOUR = 3_600_000
BASE = 1_767_225_600_000  # 2026-01-01T00:00Z
INTERVAL = Interval(BASE, BASE + HOUR)
CENTURY = 100 * 365 * 24 * 3600.0  # a close_after that never passes in a test


def in_the_interval() -> FakeKafka:
    """Two partitions, three records each inside the interval, none after its end yet."""
    kafka = FakeKafka(orders=2)
    for tp in (T0, T1):
        kafka.produce(tp, BASE + 1, BASE + 600_000, BASE + HOUR - 1)
    return kafka


def planner(close_after: float) -> IntervalPlanner:
    config = build_config("/nonexistent", ["orders"], {"bootstrap.servers": "fake:9092"}, ingest_id="hourly",
                          mode="interval", close_after=close_after)
    return IntervalPlanner(config, INTERVAL)


def test_closed_exactly_when_the_plan_stops_refusing(tmp_path):
    kafka, ledger, p = in_the_interval(), Ledger.open(str(tmp_path / "t")), planner(close_after=900)
    within_grace = INTERVAL.end_ms + 899_000
    found = p.closing(ledger, kafka, now_ms=within_grace)
    assert found.open == (T0, T1) and not found.closed and found.closes_by_ms == INTERVAL.end_ms + 900_000
    kafka.produce(T0, BASE + HOUR)  # p0 has a record at the end: closed there, p1 still open
    assert p.closing(ledger, kafka, now_ms=within_grace).open == (T1,)
    assert p.closing(ledger, kafka, now_ms=INTERVAL.end_ms + 900_000).closed  # close_after passed: p1 idle
    kafka.produce(T1, BASE + 2 * HOUR)
    assert p.closing(ledger, kafka, now_ms=within_grace).closed
    # the plan agrees: with both partitions past the end it plans, with one open it refuses
    assert planner(CENTURY).plan(RunIdentity("r"), ledger, kafka).ranges[0].end == 3
    open_one = in_the_interval()
    open_one.produce(T0, BASE + HOUR)
    assert planner(CENTURY).closing(ledger, open_one).open == (T1,)
    with pytest.raises(IntervalNotClosedError, match=r"orders\[1\]"):
        planner(CENTURY).plan(RunIdentity("r"), ledger, open_one)


def test_a_committed_interval_is_closed_without_asking_kafka(tmp_path):
    uri = str(tmp_path / "t")
    ledger_table(uri, Txn(batch_app_id("hourly"), 1), Txn(interval_app_id("hourly", 1, "start"), INTERVAL.start_ms),
                 Txn(interval_app_id("hourly", 1, "end"), INTERVAL.end_ms),
                 Txn(interval_at_app_id("hourly", INTERVAL.start_ms), 1),
                 Txn(span_app_id("hourly", "min-start"), INTERVAL.start_ms),
                 Txn(span_app_id("hourly", "max-end"), INTERVAL.end_ms))
    kafka = in_the_interval()
    found = planner(CENTURY).closing(Ledger.open(uri), kafka)
    assert found.closed and found.committed_batch == 1 and kafka.asked == []


@pytest.fixture
def conn(monkeypatch) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_FAKE", json.dumps({"conn_type": "kafka",
                                                              "extra": {"bootstrap.servers": "fake:9092"}}))
    return "kafka_fake"


class Clients:
    """The trigger's Kafka clients, one per check (as the real one makes them): each is the same
    cluster in memory; ``then`` runs before the check numbered by its key."""

    def __init__(self, kafka: FakeKafka, then: dict | None = None):
        self.kafka, self.then, self.made = kafka, then or {}, 0

    def __call__(self, config, timeout: float = 30.0) -> FakeKafka:
        assert config["bootstrap.servers"] == "fake:9092"  # from the connection, read in the triggerer
        self.made += 1
        if self.made in self.then:
            self.then[self.made](self.kafka)
        return self.kafka


def trigger(table_uri: str, conn: str, **kwargs) -> IntervalClosedTrigger:
    return IntervalClosedTrigger(**{"table_uri": table_uri, "ingest_id": "hourly", "topics": ["orders"],
                                    "interval_start_ms": INTERVAL.start_ms, "interval_end_ms": INTERVAL.end_ms,
                                    "close_after": CENTURY, "kafka_conn_id": conn, "poll_interval": 0.01, **kwargs})


def first_event(t: IntervalClosedTrigger, within: float = 30.0) -> dict:
    async def go():
        async for event in t.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(go(), within))


def test_the_trigger_waits_until_every_partition_has_a_record_past_the_end(tmp_path, conn, monkeypatch):
    clients = Clients(in_the_interval(), then={3: lambda k: k.produce(T0, BASE + HOUR + 5),
                                               5: lambda k: k.produce(T1, BASE + HOUR + 7)})
    monkeypatch.setattr(interval_closed, "KafkaOffsets", clients)
    event = first_event(trigger(str(tmp_path / "t"), conn))
    assert event["status"] == "closed" and event["committed_batch"] is None
    assert event["interval"] == {"start_ms": INTERVAL.start_ms, "end_ms": INTERVAL.end_ms}
    assert clients.made == 5  # open, open, p1 open, p1 open, closed


def test_the_trigger_wakes_when_close_after_passes_not_at_its_next_poll(tmp_path, conn, monkeypatch):
    clients = Clients(in_the_interval())
    monkeypatch.setattr(interval_closed, "KafkaOffsets", clients)
    close_after = (time.time() * 1000 - INTERVAL.end_ms) / 1000 + 1.0  # passes a second from now
    event = first_event(trigger(str(tmp_path / "t"), conn, close_after=close_after, poll_interval=3600), within=30)
    assert event["status"] == "closed" and clients.made == 2  # asked once before, once at close_after


def test_errors_become_events_the_operator_raises_as_their_own_type(tmp_path, conn, monkeypatch):
    import pyarrow as pa
    from deltalake import write_deltalake

    foreign = str(tmp_path / "foreign")
    write_deltalake(foreign, pa.table({"id": [1]}))  # a table another tool wrote
    monkeypatch.setattr(interval_closed, "KafkaOffsets", Clients(in_the_interval()))
    event = first_event(trigger(foreign, conn))
    assert event["status"] == "error" and not event["retryable"] and event["error"].startswith("TableError:")
    assert isinstance(error_of_event(event), TableError) and not error_of_event(event).retryable
    adopted = trigger(foreign, conn, adopt_table=True)  # the operator's adopt_table: no intervals of its own yet
    monkeypatch.setattr(interval_closed, "KafkaOffsets", Clients(in_the_interval(), then={
        2: lambda k: [k.produce(tp, BASE + HOUR + 1) for tp in (T0, T1)]}))
    assert first_event(adopted)["status"] == "closed" and adopted.serialize()[1]["adopt_table"] is True

    def away(config, timeout=30.0):
        raise KafkaUnavailableError("cannot reach Kafka at fake:9092")

    monkeypatch.setattr(interval_closed, "KafkaOffsets", away)
    event = first_event(trigger(str(tmp_path / "t"), conn, max_failures=2))
    assert event["status"] == "error" and event["retryable"]
    assert isinstance(error_of_event(event), KafkaUnavailableError)
    assert error_of_event({"status": "closed"}) is None


def test_the_trigger_row_holds_connection_ids_not_credentials(tmp_path, conn):
    t = trigger(str(tmp_path / "t"), conn, storage_conn_id="aws_lake")
    path, kwargs = t.serialize()
    assert path == "airflow_eo.triggers.interval_closed.IntervalClosedTrigger"
    assert "fake:9092" not in json.dumps(kwargs) and kwargs["kafka_conn_id"] == conn
    assert IntervalClosedTrigger(**kwargs).serialize() == (path, kwargs)
