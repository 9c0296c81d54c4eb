"""Fan-out through the whole loop, both Spark paths: one read into several tables, each committing its
rows and the planned range's offsets in its own commit; a sink added later catches up from its own start."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from airflow_eo.attempt import Secrets
from airflow_eo.loop.ingest import FanOut
from airflow_eo.core.offsets import RunIdentity, TopicPartition
from airflow_eo.spec.fanout import FanOutSpec
from airflow_eo.table.ledger import Ledger
from tests.helpers import new_topic, read_table


def produce_events(kafka_config: dict, topic: str, count: int, start: int = 0) -> None:
    producer = Producer(kafka_config)
    for i in range(start, start + count):
        producer.produce(topic, key=str(i % 7).encode(), value=json.dumps({"id": i % 7, "type": "ab"[i % 2], "n": i}))
    producer.flush()


def fan_out(kafka_config: dict, topic: str, submitter, sinks: list[dict]) -> FanOut:
    spec = FanOutSpec.of(ingest_id="fan", topics=topic, driver_read_max_offsets=0, sinks=sinks)
    return FanOut(spec, Secrets(kafka_config), submitter)


def committed_end(uri: str, topic: str) -> int:
    """The table's next offsets, summed over the topic's two partitions."""
    offsets = Ledger.open(uri).committed_offsets("fan", [TopicPartition(topic, p) for p in range(2)])
    return sum(o or 0 for o in offsets.values())


def test_one_read_feeds_an_append_a_filtered_append_and_a_merge(broker, kafka_config, spark_path, tmp_path):
    topic = new_topic(kafka_config, 2)
    produce_events(kafka_config, topic, 40)
    raw, only_a, latest = (str(tmp_path / n) for n in ("raw", "only_a", "latest"))
    sinks = [{"table_uri": raw},
             {"table_uri": only_a, "filter": "get_json_object(CAST(value AS STRING), '$.type') = 'a'"},
             {"table_uri": latest, "write_mode": "merge", "merge_key": "id",
              "transform_sql": "SELECT CAST(key AS STRING) AS id, topic, partition, offset, value FROM source"}]
    result = fan_out(kafka_config, topic, spark_path.submitter(), sinks).run(RunIdentity("r1"))
    assert [t.table_uri for t in result.tables] == sorted([raw, only_a, latest])
    assert {t.status for t in result.tables} == {"committed"}
    assert read_table(raw).num_rows == 40
    assert read_table(only_a).num_rows == 20
    assert read_table(latest).num_rows == 7
    assert committed_end(raw, topic) == committed_end(only_a, topic) == committed_end(latest, topic) == 40
    again = fan_out(kafka_config, topic, spark_path.submitter(), sinks).run(RunIdentity("r1"))
    assert {t.status for t in again.tables} == {"already_committed"}
    # a sink added later starts from its own start (earliest) while the others read on
    produce_events(kafka_config, topic, 10, start=40)
    late = str(tmp_path / "late")
    more = fan_out(kafka_config, topic, spark_path.submitter(), [*sinks, {"table_uri": late}]).run(RunIdentity("r2"))
    assert {t.table_uri: t.rows for t in more.tables if t.table_uri != latest} == {raw: 10, only_a: 5, late: 50}
    assert read_table(late).num_rows == 50 and read_table(raw).num_rows == 50
    assert committed_end(late, topic) == committed_end(raw, topic) == 50
