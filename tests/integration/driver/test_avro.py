"""Avro values through a Schema Registry (Confluent wire format) and inline schemas.

Real broker, real Spark (local and Spark Connect: every test on both paths), real Delta; the
registry is ``airflow_eo.testing.registry`` (a labelled test double of the Confluent REST API: no
registry server installs here). Records are produced with confluent-kafka's own
``AvroSerializer``, so the bytes are the real wire format.
"""

from __future__ import annotations

import dataclasses
import io
import json

import fastavro
import pytest
from confluent_kafka import Producer

from airflow_eo.spec import Transform
from airflow_eo.core.errors import ConfigError, IncompatibleSchemaError, SchemaRegistryUnavailableError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.table.commit import COMMITTED
from tests.helpers import ORDER_SCHEMA as ORDER
from tests.helpers import new_topic, order, produce_avro, read_table
from airflow_eo.testing.registry import RegistryDouble

ALL_COLUMNS = "SELECT topic, partition, offset, data.* FROM source"


@pytest.fixture(scope="module")
def registry():
    double = RegistryDouble().start()
    yield double
    double.stop()


def produce_raw(kafka_config, topic, values, partitions=1):
    producer = Producer(kafka_config)
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % partitions)
    producer.flush(30)


def config_for(topic, tmp_path, **options) -> IngestConfig:
    return IngestConfig(table_uri=str(tmp_path / "orders"), ingest_id="orders_avro", topics=[topic],
                        kafka_config=options.pop("kafka_config"),
                        value_format=options.pop("value_format", "avro"),
                        transform=Transform(sql=options.pop("sql", ALL_COLUMNS)),
                        dead_letter_table_uri=str(tmp_path / "orders_dlq"), **options)


def run(config, submitter, run_key="r1"):
    return Ingestion(config, submitter).run(RunIdentity(run_key=run_key))


def test_100k_nested_records_via_the_registry_arrive_once_with_their_values(spark_path, kafka_config, registry, tmp_path):
    topic = new_topic(kafka_config, 3)
    produce_avro(kafka_config, topic, (order(i) for i in range(100_000)), ORDER, {"url": registry.url})
    before = registry.requests["schema_by_id"]
    config = config_for(topic, tmp_path, kafka_config=kafka_config, schema_registry={"url": registry.url})
    result = run(config, spark_path.submitter())
    assert result.status == COMMITTED and result.rows == 100_000 and result.dead_letters == 0
    assert registry.requests["schema_by_id"] - before <= 32  # per task and id, not per record
    table = read_table(config.table_uri)
    assert table.num_rows == 100_000
    assert len(set(zip(table["partition"].to_pylist(), table["offset"].to_pylist()))) == 100_000
    rows = {r["id"]: r for r in table.select(["id", "customer", "attrs", "price", "at", "note", "status"]).to_pylist()}
    assert sorted(rows) == list(range(100_000))
    for i in (0, 1, 5, 12_345, 99_999):
        want, got = order(i), rows[i]
        assert got["customer"] == want["customer"] and dict(got["attrs"]) == want["attrs"]
        assert got["price"] == want["price"] and got["at"] == want["at"]
        assert got["note"] == want["note"] and got["status"] == want["status"]
    assert all(dict(r["attrs"]) == order(i)["attrs"] and r["price"] == order(i)["price"] for i, r in rows.items())
    assert str(table.schema.field("price").type) == "decimal128(12, 2)"
    assert str(table.schema.field("at").type).startswith("timestamp")


def test_a_new_optional_field_mid_stream_becomes_a_nullable_column(spark_path, kafka_config, registry, tmp_path):
    topic = new_topic(kafka_config, 1)
    v1 = json.dumps({"type": "record", "name": "User", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]})
    v2 = json.dumps({"type": "record", "name": "User", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None}]})
    produce_avro(kafka_config, topic, [{"id": i, "name": f"u{i}"} for i in range(5)], v1, {"url": registry.url}, 1)
    config = config_for(topic, tmp_path, kafka_config=kafka_config, schema_registry={"url": registry.url},
                        schema_evolution=True)
    submitter = spark_path.submitter()
    assert run(config, submitter, "r1").rows == 5
    # two producers interleaved: an old one still on v1, a new one on v2 (registered: the latest)
    for i in range(5, 15):
        schema, record = (v2, {"id": i, "name": f"u{i}", "email": f"u{i}@x"}) if i % 2 else (v1, {"id": i, "name": f"u{i}"})
        produce_avro(kafka_config, topic, [record], schema, {"url": registry.url}, 1)
    assert registry.subjects[f"{topic}-value"] == [registry.register(f"{topic}-value", v1),
                                                   registry.register(f"{topic}-value", v2)]
    result = run(config, submitter, "r2")
    assert result.status == COMMITTED and result.rows == 10
    rows = {r["id"]: r for r in read_table(config.table_uri, ["id", "name", "email"]).to_pylist()}
    assert sorted(rows) == list(range(15))
    assert all(rows[i]["email"] is None for i in range(5))  # rows before the column existed
    assert [rows[i]["email"] for i in range(5, 15)] == [f"u{i}@x" if i % 2 else None for i in range(5, 15)]


def test_inline_schema_reads_plain_avro_without_a_registry(spark_path, kafka_config, tmp_path):
    topic = new_topic(kafka_config, 1)
    parsed = fastavro.parse_schema(json.loads(ORDER))
    values = []
    for i in range(50):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, order(i))
        values.append(out.getvalue())
    produce_raw(kafka_config, topic, values)
    config = config_for(topic, tmp_path, kafka_config=kafka_config, avro_schema=ORDER)
    assert run(config, spark_path.submitter()).rows == 50
    rows = sorted(read_table(config.table_uri, ["id", "price", "status"]).to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": i, "price": order(i)["price"], "status": order(i)["status"]} for i in range(50)]


def test_bad_records_are_dead_letters_with_reasons_and_counts_add_up(spark_path, kafka_config, registry, tmp_path):
    topic = new_topic(kafka_config, 1)
    schema = json.dumps({"type": "record", "name": "P", "fields": [{"name": "id", "type": "long"},
                                                                     {"name": "name", "type": "string"}]})
    produce_avro(kafka_config, topic, [{"id": i, "name": f"p{i}"} for i in range(6)], schema, {"url": registry.url}, 1)
    good = registry.register(f"{topic}-value", schema)
    header = bytes([0]) + good.to_bytes(4, "big")
    bad = {
        b"\x01\x00\x00\x00\x01\x02": "not in the Confluent wire format",
        bytes([0]) + (9999).to_bytes(4, "big") + b"\x02": "unknown schema id 9999",
        header + b"\x02": "not decodable as Avro",  # id, then the name's length is missing
        header + b"\x02\x02a\x00\x00": "bytes after its Avro record",
        None: "value is null",
    }
    produce_raw(kafka_config, topic, list(bad))
    config = config_for(topic, tmp_path, kafka_config=kafka_config, schema_registry={"url": registry.url})
    result = run(config, spark_path.submitter())
    assert result.status == COMMITTED and result.rows == 6 and result.dead_letters == 5
    letters = sorted(read_table(config.spec.dead_letters.table_uri, ["offset", "value", "reason"]).to_pylist(),
                     key=lambda r: r["offset"])
    assert [r["offset"] for r in letters] == [6, 7, 8, 9, 10]
    for letter, (raw, why) in zip(letters, bad.items()):
        assert letter["value"] == raw and why in letter["reason"], letter
    assert sorted(read_table(config.table_uri, ["id"])["id"].to_pylist()) == list(range(6))


def test_an_unreachable_registry_is_retryable_and_changes_nothing(spark_path, kafka_config, registry, tmp_path):
    topic = new_topic(kafka_config, 1)
    produce_avro(kafka_config, topic, [{"id": 1, "name": "a"}], json.dumps({
        "type": "record", "name": "Q", "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}),
        {"url": registry.url}, 1)
    away = config_for(topic, tmp_path, kafka_config=kafka_config, schema_registry={"url": "http://127.0.0.1:1"})
    with pytest.raises(SchemaRegistryUnavailableError, match=r"http://127.0.0.1:1 is not reachable") as raised:
        run(away, spark_path.submitter())
    assert raised.value.retryable
    assert not (tmp_path / "orders" / "_delta_log").exists() and not (tmp_path / "orders_dlq" / "_delta_log").exists()
    # the registry answers the subject but fails the lookups the Spark tasks make (mid-batch)
    registry.failing = True
    try:
        with pytest.raises(SchemaRegistryUnavailableError, match="503|Service Unavailable"):
            run(dataclasses.replace(away, schema_registry={"url": registry.url}), spark_path.submitter(), "r2")
    finally:
        registry.failing = False
    assert not (tmp_path / "orders" / "_delta_log").exists() and not (tmp_path / "orders_dlq" / "_delta_log").exists()


def test_an_incompatible_writer_schema_fails_the_batch_naming_it(spark_path, kafka_config, registry, tmp_path):
    topic = new_topic(kafka_config, 1)
    reader = json.dumps({"type": "record", "name": "S", "fields": [{"name": "id", "type": "long"}]})
    writer = json.dumps({"type": "record", "name": "S", "fields": [{"name": "id", "type": "string"}]})
    registry.register(f"{topic}-value", reader)
    # a real registry would refuse this version under the same subject: it comes in under another
    produce_avro(kafka_config, topic, [{"id": "x"}], writer, {"url": registry.url}, 1, subject_topic=f"{topic}-elsewhere")
    config = config_for(topic, tmp_path, kafka_config=kafka_config, schema_registry={"url": registry.url})
    with pytest.raises(IncompatibleSchemaError, match=rf"writer schema id \d+ cannot be read as {topic}-value "
                                                      r"version 1") as raised:
        run(config, spark_path.submitter())
    assert not raised.value.retryable
    assert not (tmp_path / "orders" / "_delta_log").exists()


@pytest.mark.parametrize("options, message", [
    ({"value_format": "xml"}, "value_format='xml' is not understood .*use one of json, avro, raw"),
    ({}, "Avro without an inline schema needs a Schema Registry"),
    ({"avro_schema": '{"type": "record", "name": "R"}'}, "not a valid Avro schema"),
    ({"avro_schema": "{not json"}, "is not JSON"),
    ({"avro_schema": '"long"', "value_schema": "id INT"}, "value_schema is the Spark DDL of JSON values"),
    ({"key_format": "json"}, "key_format='json' needs key_schema"),
])
def test_bad_decoding_options_are_one_line_config_errors(kafka_config, tmp_path, options, message):
    with pytest.raises(ConfigError, match=message) as raised:
        config_for("orders", tmp_path, kafka_config=kafka_config, **options)
    assert "\n" not in str(raised.value)


def test_avro_keys_beside_json_values(spark_path, kafka_config, tmp_path):
    topic = new_topic(kafka_config, 1)
    key_schema = json.dumps({"type": "record", "name": "K", "fields": [{"name": "k", "type": "string"}]})
    parsed = fastavro.parse_schema(json.loads(key_schema))

    def key(text):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, {"k": text})
        return out.getvalue()

    producer = Producer(kafka_config)
    for k, v in [(key("a"), b'{"id": 1}'), (None, b'{"id": 2}'), (b"\x09", b'{"id": 3}'), (key("d"), b"{bad")]:
        producer.produce(topic, key=k, value=v, partition=0)
    producer.flush(30)
    config = config_for(topic, tmp_path, kafka_config=kafka_config, value_format="json", value_schema="id INT",
                        key_format="avro", key_avro_schema=key_schema,
                        sql="SELECT topic, partition, offset, key_data.k AS k, data.id AS id FROM source")
    result = run(config, spark_path.submitter())
    assert result.rows == 2 and result.dead_letters == 2
    assert sorted(read_table(config.table_uri, ["id", "k"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "k": "a"}, {"id": 2, "k": None}]  # a record without a key is not a bad record
    letters = sorted(read_table(config.spec.dead_letters.table_uri, ["offset", "reason"]).to_pylist(),
                     key=lambda r: r["offset"])
    assert [r["offset"] for r in letters] == [2, 3]
    assert "key is not decodable as Avro" in letters[0]["reason"] and "does not match value_schema" in letters[1]["reason"]
