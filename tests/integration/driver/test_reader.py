"""The range reader against the real broker (no Spark): several partitions through one consumer,
ranges that end inside a partition, at an aborted transaction's gap and at the end; columns as
Kafka gave them (checked with kafka-python, a different client)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_eo.driver.reader import KAFKA_SCHEMA, read_range, read_ranges
from airflow_eo.core.errors import ReadIncompleteError
from airflow_eo.core.offsets import OffsetRange
from tests.helpers import broker_records, new_topic, produce, transactional_producer


def rows(batches) -> list[tuple]:
    table = pa.Table.from_batches(list(batches), schema=KAFKA_SCHEMA)
    return sorted(zip(table["topic"].to_pylist(), table["partition"].to_pylist(), table["offset"].to_pylist(),
                      table["value"].to_pylist()))


def test_one_consumer_reads_several_partitions_exactly_to_each_range_end(broker, kafka_config):
    topic = new_topic(kafka_config, 3)
    produce(kafka_config, topic, 3000, partitions=3)
    on_broker = broker_records(broker.bootstrap_servers, topic)
    ranges = [OffsetRange(topic, 0, 0, 1000), OffsetRange(topic, 1, 10, 700), OffsetRange(topic, 2, 999, 1000)]
    batches = list(read_ranges(kafka_config, ranges, batch_rows=128))
    assert all(b.schema.equals(KAFKA_SCHEMA) for b in batches)
    assert all(len(set(b.column("partition").to_pylist())) == 1 for b in batches)  # a batch holds one partition
    expected = sorted((t, p, o, v) for (t, p, o), v in on_broker.items()
                      if any(r.partition == p and r.start <= o < r.end for r in ranges))
    assert rows(batches) == expected and len(expected) == 1000 + 690 + 1


def test_the_kafka_columns_keep_timestamps_keys_and_headers(broker, kafka_config):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 5, partitions=1)
    table = pa.Table.from_batches(list(read_range(kafka_config, OffsetRange(topic, 0, 0, 5))), schema=KAFKA_SCHEMA)
    assert table["key"].to_pylist() == [str(i).encode() for i in range(5)]
    assert table["headers"].to_pylist() == [[{"key": "seq", "value": str(i).encode()}] for i in range(5)]
    assert table["timestampType"].to_pylist() == [1] * 5  # CreateTime
    assert table["timestamp"].null_count == 0 and str(table["timestamp"].type) == "timestamp[us, tz=UTC]"


def test_a_range_ending_in_an_aborted_transaction_ends_at_its_end(broker, kafka_config):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 20, partitions=2)  # offsets 0..9 in each partition
    producer = transactional_producer(kafka_config)
    producer.begin_transaction()
    for p in (0, 1):
        producer.produce(topic, value=b"aborted", partition=p)
    producer.flush(30)
    producer.abort_transaction(30)
    on_broker = broker_records(broker.bootstrap_servers, topic)
    # each range reaches past the aborted record and its marker: nothing of them is read, and the read ends
    ranges = [OffsetRange(topic, 0, 0, 12), OffsetRange(topic, 1, 5, 12)]
    got = rows(read_ranges(kafka_config, ranges))
    assert b"aborted" not in {r[3] for r in got}
    assert got == sorted((t, p, o, v) for (t, p, o), v in on_broker.items() if (p == 0) or (p == 1 and o >= 5))


def test_one_range_per_partition_and_task(kafka_config):
    with pytest.raises(ValueError, match="one range per partition"):
        list(read_ranges(kafka_config, [OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 9)]))


def test_a_range_beyond_what_kafka_holds_fails_instead_of_returning_less(broker, kafka_config):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 5, partitions=1)
    with pytest.raises(ReadIncompleteError, match="made no progress"):
        list(read_ranges(kafka_config, [OffsetRange(topic, 0, 0, 50)], stall_timeout=2.0))
