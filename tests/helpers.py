"""Test helpers shared by every suite: topics, producers, reading a table back, checking it.

Where the pytest plugin users get (airflow_eo/testing/) does the same, these delegate to it: the
table is read back as a Delta reader reads it (deltalake's QueryBuilder) and checked against what
the broker holds using kafka-python, a different client from the one the pipeline reads with, so
a reader bug cannot hide itself.
"""

from __future__ import annotations

import json

import uuid
from collections import Counter

import pyarrow as pa
from confluent_kafka import Producer

from airflow_eo.testing.kafka import TestBroker
from airflow_eo.testing.tables import TestTable
from airflow_eo.testing.tables import read_table as plugin_read_table


def _broker(config: dict) -> TestBroker:
    return TestBroker.connect(str(config["bootstrap.servers"]))


def new_topic(config: dict, partitions: int = 3, name: str | None = None) -> str:
    return _broker(config).create_topic(partitions, name)


def add_partitions(config: dict, topic: str, total: int) -> None:
    _broker(config).add_partitions(topic, total)


def produce(config: dict, topic: str, count: int, partitions: int = 3, prefix: str = "v", start: int = 0) -> list[bytes]:
    """Produce ``count`` records round-robin over partitions with an idempotent producer."""
    producer = Producer({**config, "enable.idempotence": True, "linger.ms": 5})
    values = []
    for i in range(start, start + count):
        value = f"{prefix}{i}".encode()
        producer.produce(topic, key=str(i).encode(), value=value, partition=i % partitions,
                         headers=[("seq", str(i).encode())])
        values.append(value)
    producer.flush(30)
    return values


def produce_avro(config: dict, topic: str, records, schema: str, registry: dict, partitions: int = 3,
                 subject_topic: str | None = None) -> None:
    """Produce Avro in the Confluent wire format with confluent-kafka's own ``AvroSerializer``
    (registering ``schema`` under ``<subject_topic or topic>-value``), round-robin over partitions."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(SchemaRegistryClient(registry), schema)
    context = SerializationContext(subject_topic or topic, MessageField.VALUE)
    producer = Producer({**config, "enable.idempotence": True, "linger.ms": 20})
    for i, record in enumerate(records):
        send(producer, topic, serialize(record, context), i % partitions)
    producer.flush(60)


def send(producer: Producer, topic: str, value: bytes, partition: int) -> None:
    """``produce`` that waits while the client's local queue is full (large loads)."""
    while True:
        try:
            producer.produce(topic, value=value, partition=partition)
            break
        except BufferError:  # let deliveries drain
            producer.poll(0.5)
    producer.poll(0)


# A nested Avro schema with the types users meet most (record, array, map, decimal,
# timestamp-millis, nullable union, enum) and its records: the Avro tests and the benchmark.
ORDER_SCHEMA = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "name", "type": "string"}, {"name": "tags", "type": {"type": "array", "items": "string"}}]}},
    {"name": "attrs", "type": {"type": "map", "values": "int"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
]})
ORDER_DDL = ("id BIGINT, customer STRUCT<name: STRING, tags: ARRAY<STRING>>, attrs MAP<STRING, INT>, "
             "price DECIMAL(12,2), at TIMESTAMP, note STRING, status STRING")  # the same as JSON


def order(i: int) -> dict:
    """Record ``i`` of :data:`ORDER_SCHEMA`."""
    from datetime import datetime, timezone
    from decimal import Decimal

    return {"id": i, "customer": {"name": f"c{i % 97}", "tags": [f"t{j}" for j in range(i % 3)]},
            "attrs": {"n": i % 7} if i % 2 else {}, "price": Decimal(i % 10_000_000) / 100,
            "at": datetime.fromtimestamp(1_767_225_600 + i, timezone.utc), "note": None if i % 5 else f"note {i}",
            "status": "PAID" if i % 4 == 0 else "NEW"}


def transactional_producer(config: dict) -> Producer:
    producer = Producer({**config, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    return producer


def read_table(table_uri: str, columns: list[str] | None = None) -> pa.Table:
    """The table's rows as a Delta reader sees them (the plugin's reader: deletion vectors applied)."""
    return plugin_read_table(table_uri, columns or (["topic", "partition", "offset"] if not
                                                    TestTable(table_uri).exists else None))


def keys_of(table: pa.Table) -> list[tuple[str, int, int]]:
    return list(zip(table["topic"].to_pylist(), table["partition"].to_pylist(), table["offset"].to_pylist()))


def duplicates(table: pa.Table) -> dict:
    return {k: n for k, n in Counter(keys_of(table)).items() if n > 1}


def visible_records(bootstrap: str, topic: str, read_committed: bool = True):
    """Every visible record of a topic, read with kafka-python (the plugin's reader: independent of the pipeline)."""
    return TestBroker.connect(bootstrap).records(topic, read_committed)


def broker_records(bootstrap: str, topic: str, read_committed: bool = True) -> dict[tuple[str, int, int], bytes]:
    """Every visible record of a topic, read with kafka-python (independent of the pipeline)."""
    return {(r.topic, r.partition, r.offset): r.value for r in visible_records(bootstrap, topic, read_committed)}


def committed_offsets(table_uri: str, ingest_id: str, topic: str, partitions: int) -> dict[int, int | None]:
    return TestTable(table_uri).committed_offsets(ingest_id, topic, range(partitions))


def assert_exactly_once(table_uri, bootstrap, topics, ingest_id="test"):
    """Table == broker up to the committed offsets: nothing lost, nothing doubled, values intact."""
    table = read_table(table_uri, ["topic", "partition", "offset", "value"])
    assert duplicates(table) == {}
    got = dict(zip(keys_of(table), table["value"].to_pylist()))
    expected = {}
    for topic in topics:
        records = broker_records(bootstrap, topic)
        parts = {p for (_, p, _) in records} | {0}
        committed = committed_offsets(table_uri, ingest_id, topic, max(parts) + 1)
        expected.update({k: v for k, v in records.items() if committed.get(k[1]) is not None and k[2] < committed[k[1]]})
    assert got == expected
    return len(got)
