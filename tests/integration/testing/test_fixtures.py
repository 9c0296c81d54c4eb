"""The plugin's fixtures and helpers themselves, without Spark: what the producers put on the broker
(keys, partitions, timestamps, headers, transactions, Avro through the registry stand-in), the
connections the fixtures set, the tables (local and s3://) and what an assertion says of a table
that was never written."""

from __future__ import annotations

import json
import os
import time

import pytest

from airflow_eo.testing import assert_exactly_once, read_table
from tests.helpers import ORDER_SCHEMA, order


def test_the_producers_put_what_they_say(kafka_broker, kafka_topic):
    now = int(time.time() * 1000)
    assert kafka_broker.produce(kafka_topic, [b"raw", "text", {"n": 1}], partition=2, timestamps=[now] * 3,
                                headers=[{"h": "1"}] * 3) == 3
    kafka_broker.produce_keyed(kafka_topic, {"a": 1, "b": None})
    kafka_broker.produce_transaction(kafka_topic, ["kept"], partition=0)
    kafka_broker.produce_transaction(kafka_topic, ["dropped"] * 2, partition=0, abort=True)
    records = kafka_broker.records(kafka_topic)
    plain = [r for r in records if r.partition == 2 and r.key is None]
    assert [r.value for r in plain] == [b"raw", b"text", b'{"n": 1}'] and {r.timestamp for r in plain} == {now}
    assert plain[0].headers == (("h", b"1"),) and plain[2].json() == {"n": 1}
    assert {r.key: r.value for r in records if r.key} == {b"a": b"1", b"b": None}  # None: a tombstone
    assert [r.value for r in records if r.partition == 0 and r.key is None] == [b"kept"]
    uncommitted = kafka_broker.records(kafka_topic, read_committed=False)
    assert [r.value for r in uncommitted if r.value == b"dropped"] == [b"dropped"] * 2  # on the broker, hidden
    ends = kafka_broker.end_offsets(kafka_topic)
    assert ends[2] == len([r for r in records if r.partition == 2])  # no transaction there: one offset a record
    assert ends[0] > max(r.offset for r in uncommitted if r.partition == 0)  # transaction markers take offsets


def test_the_broker_is_kafka_default_and_the_registry_schema_registry_default(kafka_broker, schema_registry,
                                                                             kafka_topic):
    from airflow_eo.hooks.kafka import kafka_config_of
    from airflow_eo.hooks.schema_registry import schema_registry_config_of

    assert kafka_config_of("kafka_default")["bootstrap.servers"] == kafka_broker.bootstrap_servers
    assert schema_registry_config_of("schema_registry_default")["url"] == schema_registry.url
    assert kafka_broker.produce_avro(kafka_topic, [order(i) for i in range(3)], ORDER_SCHEMA,
                                     schema_registry.config) == 3
    # one version of the topic's subject (its id is the session registry's next: other tests register too)
    assert len(schema_registry.subjects[f"{kafka_topic}-value"]) == 1
    assert all(r.value[0] == 0 for r in kafka_broker.records(kafka_topic))  # Confluent's wire format


@pytest.mark.parametrize("delta_table", ["local", "s3"], indirect=True)
def test_a_fresh_table_location_and_a_table_never_written(delta_table, kafka_broker, kafka_topic):
    assert not delta_table.exists and read_table(delta_table, ["offset"]).num_rows == 0
    if delta_table.storage_conn_id:  # s3://: the aws connection a DAG names is set
        conn = json.loads(os.environ[f"AIRFLOW_CONN_{delta_table.storage_conn_id.upper()}"])
        assert delta_table.uri.startswith("s3://") and conn["extra"]["conditional_put"] == "etag"
    else:
        assert os.fspath(delta_table).endswith("table") and not os.path.exists(delta_table)
    kafka_broker.produce(kafka_topic, ["x"])
    with pytest.raises(AssertionError, match="there is no Delta table at .*: the ingest never committed to it"):
        assert_exactly_once(delta_table, kafka_broker, [kafka_topic], ingest_id="orders")


def test_one_task_of_a_dag_runs_alone(airflow_dag_runner, kafka_topic, delta_table):
    """``run(dag, task_id=...)``: the ingest without the task before it (which would fail the run)."""
    from datetime import datetime

    from airflow.sdk import DAG, task

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    with DAG("one_task", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        @task
        def upstream():
            raise RuntimeError("not to be run")

        upstream() >> KafkaToDeltaOperator(task_id="ingest", topics=[kafka_topic], table_uri=delta_table.uri,
                                           ingest_id="orders")
    outcome = airflow_dag_runner.run(dag, task_id="ingest")
    assert outcome.states.keys() == {"ingest"} and outcome.state("ingest") == "success"
    summary = outcome.xcom("ingest")
    assert summary["status"] == "committed" and summary["rows"] == 0  # an empty topic: its starts committed
