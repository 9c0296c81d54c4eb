"""KafkaBacklogSensor and KafkaBacklogTrigger without a metadata DB, against the real broker.

The backlog is measured by the real planning inputs (Kafka LSO, the Delta ledger); the
connection comes from an AIRFLOW_CONN_* variable as in a deployment.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from types import SimpleNamespace

import pytest

from airflow_eo.sensors.kafka_backlog import KafkaBacklogSensor
from airflow_eo.triggers.kafka_backlog import KafkaBacklogTrigger, measure_backlog
from tests.helpers import new_topic, produce


@pytest.fixture
def conn(broker, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_BACKLOG", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers}}))
    return "kafka_backlog"


def first_event(trigger):
    async def go():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(go(), 30))


def test_backlog_counts_offsets_the_table_has_not_committed(kafka_config, table_uri):
    topic = new_topic(kafka_config, partitions=2)
    produce(kafka_config, topic, 9, partitions=2)
    assert measure_backlog(kafka_config, [topic], table_uri, "orders") == {f"{topic}[0]": 5, f"{topic}[1]": 4}


def test_backlog_of_never_read_partitions_follows_starting_offsets(kafka_config, table_uri):
    topic = new_topic(kafka_config, partitions=2)
    produce(kafka_config, topic, 10, partitions=2)
    assert measure_backlog(kafka_config, [topic], table_uri, "orders", starting_offsets="latest") == {
        f"{topic}[0]": 0, f"{topic}[1]": 0}
    explicit = {topic: {"0": 3, "1": 5}}  # 5 records each: offsets 0-4
    assert measure_backlog(kafka_config, [topic], table_uri, "orders", starting_offsets=explicit) == {
        f"{topic}[0]": 2, f"{topic}[1]": 0}


def test_trigger_fires_when_backlog_reached_and_times_out_otherwise(conn, kafka_config, table_uri):
    topic = new_topic(kafka_config, partitions=1)
    produce(kafka_config, topic, 4, partitions=1)
    ready = KafkaBacklogTrigger(topics=[topic], table_uri=table_uri, ingest_id="orders", kafka_conn_id=conn,
                                min_records=4, poll_interval=0.1)
    event = first_event(ready)
    assert event["status"] == "ready" and event["backlog"] == 4

    waiting = KafkaBacklogTrigger(topics=[topic], table_uri=table_uri, ingest_id="orders", kafka_conn_id=conn,
                                  min_records=1000, poll_interval=0.1, timeout=0.5)
    event = first_event(waiting)
    assert event["status"] == "timeout" and event["backlog"] == 4

    latest = KafkaBacklogTrigger(topics=[topic], table_uri=table_uri, ingest_id="orders", kafka_conn_id=conn,
                                 min_records=1, poll_interval=0.1, timeout=0.5, starting_offsets="latest")
    assert first_event(latest)["status"] == "timeout"  # nothing produced since "latest"

    path, kwargs = waiting.serialize()
    assert path == "airflow_eo.triggers.kafka_backlog.KafkaBacklogTrigger"
    assert "bootstrap" not in json.dumps(kwargs)  # only the connection id is stored
    assert KafkaBacklogTrigger(**kwargs).serialize() == (path, kwargs)


def sensor(topic, table_uri, conn, **kwargs):
    from airflow.sdk import DAG

    with DAG("sensor_dag", schedule=None, start_date=datetime(2026, 1, 1)):
        return KafkaBacklogSensor(task_id="wait", topics=topic, table_uri=table_uri, kafka_conn_id=conn, **kwargs)


def test_sensor_defers_only_when_it_must(conn, kafka_config, table_uri):
    from airflow.providers.common.compat.sdk import AirflowSensorTimeout, TaskDeferred

    topic = new_topic(kafka_config, partitions=1)
    produce(kafka_config, topic, 3, partitions=1)
    enough = sensor(topic, table_uri, conn, min_records=3)
    assert enough.deferrable and enough.execute({}) == {f"{topic}[0]": 3}

    waiting = sensor(topic, table_uri, conn, min_records=10, timeout=60, poke_interval=5)
    with pytest.raises(TaskDeferred) as deferred:
        waiting.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, KafkaBacklogTrigger) and trigger.min_records == 10 and trigger.ingest_id == "sensor_dag.ingest"
    assert deferred.value.method_name == "execute_complete"

    assert waiting.execute_complete({}, {"status": "ready", "backlog": 12, "per_partition": {"x": 12}}) == {"x": 12}
    with pytest.raises(AirflowSensorTimeout):
        waiting.execute_complete({}, {"status": "timeout", "backlog": 3})
    poking = sensor(topic, table_uri, conn, min_records=3, deferrable=False)
    assert poking.poke(SimpleNamespace()) is True
    from_latest = sensor(topic, table_uri, conn, min_records=1, deferrable=False, starting_offsets="latest")
    assert from_latest.poke(SimpleNamespace()) is False


def test_sensor_refuses_a_table_another_ingest_owns(conn, kafka_config, table_uri):
    """The operator's ownership check: no "no backlog" answer about somebody else's table."""
    import pyarrow as pa
    from airflow.providers.common.compat.sdk import AirflowFailException
    from deltalake import write_deltalake

    write_deltalake(table_uri, pa.table({"id": [1, 2]}))  # a table created elsewhere
    topic = new_topic(kafka_config, partitions=1)
    produce(kafka_config, topic, 3, partitions=1)
    with pytest.raises(AirflowFailException, match="was not written by ingest_id 'sensor_dag.ingest'"):
        sensor(topic, table_uri, conn, min_records=1, deferrable=False).poke(SimpleNamespace())
    event = first_event(KafkaBacklogTrigger(topics=[topic], table_uri=table_uri, ingest_id="sensor_dag.ingest",
                                            kafka_conn_id=conn, poll_interval=0.01))
    assert event["status"] == "error" and event["error"].startswith("TableError:") and not event["retryable"]
    with pytest.raises(AirflowFailException):
        sensor(topic, table_uri, conn).execute_complete({}, event)


def test_an_adopted_table_before_its_first_batch_has_no_offsets_yet(conn, kafka_config, table_uri, capsys):
    """With the operator's adopt_table, the sensor, its trigger and ``airflow-eo status`` treat a table created
    elsewhere as one without this ingest's offsets: the backlog counts from starting_offsets."""
    import pyarrow as pa
    from airflow.providers.common.compat.sdk import TaskDeferred
    from deltalake import write_deltalake

    from airflow_eo.cli import main
    from tests.delta_tables import log_digest

    write_deltalake(table_uri, pa.table({"id": [1, 2]}))  # a table created elsewhere
    before = log_digest(table_uri)
    topic = new_topic(kafka_config, partitions=2)
    produce(kafka_config, topic, 5, partitions=2)
    assert sensor(topic, table_uri, conn, min_records=5, deferrable=False, adopt_table=True).poke(SimpleNamespace())
    latest = sensor(topic, table_uri, conn, min_records=1, deferrable=False, adopt_table=True, starting_offsets="latest")
    assert latest.poke(SimpleNamespace()) is False
    trigger = KafkaBacklogTrigger(topics=[topic], table_uri=table_uri, ingest_id="sensor_dag.ingest",
                                  kafka_conn_id=conn, min_records=5, poll_interval=0.01, adopt_table=True)
    assert first_event(trigger) == {"status": "ready", "backlog": 5, "per_partition": {f"{topic}[0]": 3,
                                    f"{topic}[1]": 2}, "min_records": 5}
    path, kwargs = trigger.serialize()
    assert kwargs["adopt_table"] is True and KafkaBacklogTrigger(**kwargs).serialize() == (path, kwargs)
    with pytest.raises(TaskDeferred) as deferred:  # the deferring sensor hands the option on
        sensor(topic, table_uri, conn, min_records=99, adopt_table=True).execute({})
    assert deferred.value.trigger.adopt_table is True
    common = ["--ingest-id", "sensor_dag.ingest", "--bootstrap-servers", kafka_config["bootstrap.servers"], "--json"]
    assert main(["status", table_uri, *common]) == 2  # without the option: another's table, as before
    assert "not written by ingest_id" in capsys.readouterr().err
    assert main(["status", table_uri, *common, "--adopt-table", "--topics", topic]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["last_batch"] == 0 and status["partitions"] == [
        {"topic": topic, "partition": 0, "committed": None, "end": 3, "lag": 3},
        {"topic": topic, "partition": 1, "committed": None, "end": 2, "lag": 2}]
    assert main(["status", table_uri, *common, "--adopt-table", "--topics", topic, "--starting-offsets", "latest"]) == 0
    assert [p["lag"] for p in json.loads(capsys.readouterr().out)["partitions"]] == [0, 0]
    assert log_digest(table_uri) == before


def test_trigger_retries_transient_failures_with_backoff(conn, kafka_config, table_uri, monkeypatch):
    from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException

    from airflow_eo.core.errors import KafkaUnavailableError

    topic = new_topic(kafka_config, partitions=1)
    produce(kafka_config, topic, 4, partitions=1)
    real, failures = measure_backlog, []

    def flaky(*args):  # the broker away twice, then back
        if len(failures) < 2:
            failures.append(1)
            raise KafkaUnavailableError("broker 127.0.0.1:1 did not answer")
        return real(*args)

    monkeypatch.setattr("airflow_eo.triggers.kafka_backlog.measure_backlog", flaky)
    event = first_event(KafkaBacklogTrigger(topics=[topic], table_uri=table_uri, ingest_id="t", kafka_conn_id=conn,
                                            min_records=4, poll_interval=0.05))
    assert event["status"] == "ready" and event["backlog"] == 4 and len(failures) == 2

    def away(*args):  # the broker stays away
        failures.append(1)
        raise KafkaUnavailableError("still away")

    failures.clear()
    monkeypatch.setattr("airflow_eo.triggers.kafka_backlog.measure_backlog", away)
    event = first_event(KafkaBacklogTrigger(topics=[topic], table_uri=table_uri, ingest_id="t", kafka_conn_id=conn,
                                            poll_interval=0.01, max_failures=3))
    assert event["status"] == "error" and event["retryable"] and len(failures) == 4  # 1 + 3 retries
    with pytest.raises(AirflowException) as raised:
        sensor(topic, table_uri, conn).execute_complete({}, event)
    assert not isinstance(raised.value, AirflowFailException)  # Airflow retries the task
