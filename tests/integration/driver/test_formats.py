"""Protobuf and JSON Schema through the Schema Registry: real broker, real Spark (local and Spark Connect:
``spark_path``), real Delta tables read back by DuckDB's delta extension, the registry double.

Records are produced with confluent-kafka's own ``ProtobufSerializer`` / ``JSONSerializer`` (the real
wire format: magic byte, schema id, message indexes), and each table is compared with a model computed
from the broker's records (read with kafka-python) by the ``protobuf`` library (confluent-kafka's
``ProtobufDeserializer`` for the framing, ``json_format`` for the fields) and by ``jsonschema`` directly.
Bad input is refused in one line with nothing written; a registry that is down is retryable.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import jsonschema
import pytest
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import SerializationError
from google.protobuf import json_format, message_factory

from airflow_eo.core.errors import ConfigError, SchemaRegistryUnavailableError
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.decoding.protobuf_schemas import compile_proto
from airflow_eo.loop.config import IngestConfig
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.spec import Transform
from airflow_eo.table.commit import COMMITTED
from airflow_eo.testing.kafka import TestBroker
from tests.delta_tables import duckdb_rows
from tests.helpers import broker_records, new_topic

ALL = "SELECT topic, partition, offset, data.* FROM source"
# shop.Order is the second message of its file: its records' wire format names message index [1]
PROTO_V1 = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

message Refund { int64 order_id = 1; }
message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  message Line { string sku = 1; int32 qty = 2; }
  int64 id = 1;
  string customer = 2;
  Status status = 3;
  repeated Line lines = 4;
  map<string, int32> attrs = 5;
  oneof payment { string card = 6; int64 voucher = 7; }
  google.protobuf.Timestamp at = 8;
  google.protobuf.DoubleValue discount = 9;
}
"""
# version 2 adds a field with presence and one without: both null for records written with version 1
PROTO_V2 = PROTO_V1.replace("  google.protobuf.DoubleValue discount = 9;\n",
                            "  google.protobuf.DoubleValue discount = 9;\n  optional string coupon = 10;\n"
                            "  string channel = 11;\n")
COLUMNS = ["id", "customer", "status", "lines", "attrs", "card", "voucher", "at", "discount", "coupon", "channel"]


def order_class(text: str):
    return message_factory.GetMessageClass(compile_proto(text, "shop/order.proto").message("shop.Order"))


def order(cls, i: int, v2: bool = False):
    message = cls(id=i, customer=f"c{i % 13}", status=i % 3)
    for j in range(i % 3):
        message.lines.add(sku=f"s{j}", qty=j + 1)
    if i % 2:
        message.attrs["n"] = i % 7
    if i % 4 == 0:
        message.card = f"card-{i}"
    elif i % 4 == 1:
        message.voucher = i * 10
    if i % 5:
        message.at.FromDatetime(datetime.fromtimestamp(1_767_225_600 + i, timezone.utc))
    if i % 3 == 0:
        message.discount.value = i / 4
    if v2:
        if i % 2:
            message.coupon = f"k{i}"
        if i % 3:
            message.channel = "web"
    return message


def protobuf_model(kafka_config, topic, v1_id: int) -> dict[tuple[int, int], tuple]:
    """The rows of the topic's Protobuf records, decoded from the broker's bytes by the protobuf library:
    a field its writer schema (version 1) lacks is null; otherwise proto3's presence rules."""
    deserialize = ProtobufDeserializer(order_class(PROTO_V2), {"use.deprecated.format": False})
    model = {}
    for (_, partition, offset), raw in broker_records(kafka_config["bootstrap.servers"], topic).items():
        if raw is None or raw[:1] != b"\x00" or int.from_bytes(raw[1:5], "big") not in (v1_id, v1_id + 1):
            continue  # the bad records: dead letters
        try:
            message = deserialize(raw, None)
        except SerializationError:  # the corrupt record: a dead letter
            continue
        fields = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                           always_print_fields_with_no_presence=True)
        old = int.from_bytes(raw[1:5], "big") == v1_id
        at = fields.get("at")
        model[(partition, offset)] = (
            int(fields["id"]), fields["customer"], fields["status"],
            [{"sku": line["sku"], "qty": line["qty"]} for line in fields["lines"]],
            {k: int(v) for k, v in fields["attrs"].items()},
            fields.get("card"), int(fields["voucher"]) if "voucher" in fields else None,
            datetime.fromisoformat(at.replace("Z", "+00:00")) if at else None,
            fields.get("discount"), None if old else fields.get("coupon"), None if old else fields["channel"])
    return model


def table_rows(table_uri: str) -> dict[tuple[int, int], tuple]:
    quoted = ", ".join(f'"{c}"' for c in COLUMNS)
    rows = duckdb_rows(table_uri, f'SELECT partition, "offset", {quoted} FROM t')
    out = {}
    for partition, offset, *values in rows:
        values[3] = [dict(line) for line in values[3]]
        values[4] = dict(values[4])
        values[7] = values[7].astimezone(timezone.utc) if values[7] is not None else None
        out[(partition, offset)] = tuple(values)
    return out


def config_for(table_uri, topic, kafka_config, registry, **options) -> IngestConfig:
    options.setdefault("transform", Transform(sql=ALL))
    options.setdefault("driver_read_max_offsets", 0)
    options.setdefault("schema_registry", registry.config)
    return IngestConfig(table_uri=table_uri, ingest_id="formats", topics=[topic], kafka_config=kafka_config,
                        dead_letter_table_uri=table_uri + "_dlq", **options)


def test_protobuf_two_versions_every_type_and_bad_records_equal_the_model(spark_path, kafka_config, schema_registry,
                                                                          table_uri):
    topic = new_topic(kafka_config, 2)
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    v1, v2 = order_class(PROTO_V1), order_class(PROTO_V2)
    broker.produce_protobuf(topic, [order(v1, i) for i in range(40)], schema_registry.config)
    config = config_for(table_uri, topic, kafka_config, schema_registry, value_format="protobuf",
                        message_name="shop.Order", schema_evolution=True)
    submitter = spark_path.submitter()
    first = Ingestion(config, submitter).run(RunIdentity(run_key="r1"))
    assert (first.status, first.rows, first.dead_letters) == (COMMITTED, 40, 0)
    v1_id = schema_registry.subjects[f"{topic}-value"][0]
    # a new producer on version 2 beside an old one still on version 1, and records no reader can decode
    broker.produce_protobuf(topic, [order(v2, i, v2=True) for i in range(41, 80, 2)], schema_registry.config)
    broker.produce_protobuf(topic, [order(v1, i) for i in range(40, 80, 2)], schema_registry.config)
    unknown = b"\x00" + (9999).to_bytes(4, "big") + b"\x00" + order(v1, 1).SerializeToString()
    broker.produce(topic, [b"\x01junk", unknown, b"\x00" + v1_id.to_bytes(4, "big") + bytes([2, 2]) + b"\xff\xff"])
    second = Ingestion(config, submitter).run(RunIdentity(run_key="r2"))
    assert (second.status, second.rows, second.dead_letters) == (COMMITTED, 40, 3)
    assert schema_registry.subjects[f"{topic}-value"] == [v1_id, v1_id + 1]
    assert table_rows(table_uri) == protobuf_model(kafka_config, topic, v1_id)
    reasons = sorted(r for (r,) in duckdb_rows(table_uri + "_dlq", "SELECT reason FROM t"))
    assert [r.split(" (")[0].split(":")[0] for r in reasons] == [
        "unknown schema id 9999", "value is not decodable as Protobuf shop.Order", "value is not in the Confluent wire "
        "format"]


JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "kind": {"enum": ["click", "view"]},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "user": {"$ref": "#/$defs/User"},
        "score": {"type": ["number", "null"]},
    },
    "required": ["id", "kind"],
    "$defs": {"User": {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": True}},
}


def event(i: int) -> dict:
    out = {"id": i, "kind": "click" if i % 2 else "view", "at": f"2026-01-0{1 + i % 9}T10:00:0{i % 10}Z",
           "tags": [f"t{j}" for j in range(i % 3)], "user": {"name": f"u{i}", **({"plan": "pro"} if i % 4 else {})},
           "score": None if i % 5 == 0 else i / 2}
    if i % 7 == 3:
        del out["id"]  # a required property missing: a dead letter
    return out


def json_model(records: dict[tuple[int, int], dict]) -> tuple[dict, set]:
    """The rows and the dead letters of the records, by jsonschema itself."""
    validator = jsonschema.Draft7Validator(JSON_SCHEMA)
    rows, dead = {}, set()
    for key, record in records.items():
        if not validator.is_valid(record):
            dead.add(key)
            continue
        extra = {k: v for k, v in record["user"].items() if k != "name"}
        rows[key] = (record["id"], record["kind"], datetime.fromisoformat(record["at"].replace("Z", "+00:00")),
                     record["tags"], {"name": record["user"]["name"],
                                      "_additional_properties": json.dumps(extra) if extra else None},
                     record["score"])
    return rows, dead


def test_json_schema_records_missing_a_required_property_are_dead_letters(spark_path, kafka_config, schema_registry,
                                                                          table_uri):
    topic = new_topic(kafka_config, 2)
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    broker.produce_json_schema(topic, [event(i) for i in range(60)], json.dumps(JSON_SCHEMA), schema_registry.config,
                               validate=False)
    config = config_for(table_uri, topic, kafka_config, schema_registry, value_format="json_schema")
    result = Ingestion(config, spark_path.submitter()).run(RunIdentity(run_key="r1"))
    records = {(p, o): json.loads(raw[5:]) for (_, p, o), raw in
               broker_records(kafka_config["bootstrap.servers"], topic).items()}
    rows, dead = json_model(records)
    assert (result.status, result.rows, result.dead_letters) == (COMMITTED, len(rows), len(dead)) and dead
    found = {(p, o): (i, k, at.astimezone(timezone.utc), tags, user, score) for p, o, i, k, at, tags, user, score in
             duckdb_rows(table_uri, 'SELECT partition, "offset", id, kind, "at", tags, "user", score FROM t')}
    for *_, user, _ in found.values():
        if user["_additional_properties"]:
            user["_additional_properties"] = json.dumps(json.loads(user["_additional_properties"]))
    assert found == rows
    letters = duckdb_rows(table_uri + "_dlq", 'SELECT partition, "offset", reason FROM t')
    assert {(p, o) for p, o, _ in letters} == dead
    assert {r for *_, r in letters} == {"value does not match its JSON Schema (writer schema id "
                                        f"{schema_registry.subjects[f'{topic}-value'][0]}): 'id' is a required property"}
    # validation off: the same records all become rows, a missing property null
    unchecked = config_for(table_uri + "_unchecked", topic, kafka_config, schema_registry, value_format="json_schema",
                           json_schema_validation=False)
    loose = Ingestion(unchecked, spark_path.submitter()).run(RunIdentity(run_key="r1"))
    assert (loose.rows, loose.dead_letters) == (60, 0)
    assert len(duckdb_rows(unchecked.table_uri, "SELECT id FROM t WHERE id IS NULL")) == len(dead)


class NeverSubmit:
    def submit(self, attempt, secrets):  # pragma: no cover - refused before Spark
        raise AssertionError("no Spark job expected")


@pytest.mark.parametrize("case", ["avro_subject_as_protobuf", "unknown_message", "unknown_version",
                                  "registry_down", "protobuf_subject_as_json_schema"])
def test_bad_input_is_one_line_before_spark_and_writes_nothing(case, kafka_config, schema_registry, table_uri):
    topic = new_topic(kafka_config, 1)
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    if case == "avro_subject_as_protobuf":
        broker.produce_avro(topic, [{"id": 1}], json.dumps({"type": "record", "name": "A", "fields": [
            {"name": "id", "type": "long"}]}), schema_registry.config)
    else:
        broker.produce_protobuf(topic, [order(order_class(PROTO_V1), 1)], schema_registry.config)
    options, error, message = {
        "avro_subject_as_protobuf": ({"value_format": "protobuf"}, ConfigError,
                                     rf"^{topic}-value version 1 \(schema id \d+\) is a AVRO schema, not Protobuf: "
                                     "value_format='protobuf' reads Protobuf subjects"),
        "unknown_message": ({"value_format": "protobuf", "message_name": "shop.Invoice"}, ConfigError,
                            rf"^message_name 'shop.Invoice' is not a message of {topic}-value version 1 .*"
                            r"\(its messages: shop.Refund, shop.Order\)"),
        "unknown_version": ({"value_format": "protobuf", "value_schema_version": "7"}, ConfigError,
                            rf"has no version 7 of subject '{topic}-value'"),
        "registry_down": ({"value_format": "protobuf", "schema_registry": {"url": "http://127.0.0.1:1"}},
                          SchemaRegistryUnavailableError, r"^the Schema Registry at http://127.0.0.1:1 is not reachable"),
        "protobuf_subject_as_json_schema": ({"value_format": "json_schema"}, ConfigError,
                                            "is a PROTOBUF schema, not JSON Schema"),
    }[case]
    config = config_for(table_uri, topic, kafka_config, schema_registry, **options)
    with pytest.raises(error, match=message) as raised:
        Ingestion(config, NeverSubmit()).run(RunIdentity(run_key="r1"))
    assert "\n" not in str(raised.value) and raised.value.retryable is (case == "registry_down")
    assert not _exists(table_uri) and not _exists(table_uri + "_dlq")


def _exists(table_uri: str) -> bool:
    import os

    return os.path.exists(os.path.join(table_uri, "_delta_log"))


def test_a_registry_failing_mid_batch_is_retryable_and_writes_nothing(spark_path, kafka_config, schema_registry,
                                                                      table_uri):
    topic = new_topic(kafka_config, 1)
    TestBroker.connect(kafka_config["bootstrap.servers"]).produce_protobuf(
        topic, [order(order_class(PROTO_V1), i) for i in range(5)], schema_registry.config)
    config = config_for(table_uri, topic, kafka_config, schema_registry, value_format="protobuf",
                        message_name="shop.Order")
    schema_registry.failing = True  # the subject answers (the plan), the schema lookups by id fail
    try:
        with pytest.raises(SchemaRegistryUnavailableError, match="503|Service Unavailable") as raised:
            Ingestion(config, spark_path.submitter()).run(RunIdentity(run_key="r1"))
    finally:
        schema_registry.failing = False
    assert raised.value.retryable and not _exists(table_uri) and not _exists(table_uri + "_dlq")
    retried = Ingestion(config, spark_path.submitter()).run(RunIdentity(run_key="r1"))  # the retry commits
    assert (retried.status, retried.rows) == (COMMITTED, 5)
