"""Protobuf and JSON Schema against Avro: the same rows through the Schema Registry, whole commands on a warm server.

Every side is one whole ``airflow-eo ingest --remote`` command on one warm Spark Connect server
(``airflow-eo connect-server --conf spark.driver.memory=4g``: a 1M batch of decoded rows does not fit
the default 1 GB heap; one batch of each side on it first, not counted), selecting every
decoded column (``SELECT topic, partition, offset, data.* FROM source``) into a fresh table, and is
paired with one plain confluent-kafka consumer (read_committed, every partition assigned, counting)
timed **right before it** on the same records. The sides alternate which goes first (A B, B A, ...).

* **protobuf** (``--formats-records``, 1M by default): the same rows (~200 bytes, 10 fields: scalars,
  an enum, a nested message, a repeated field, a map, a Timestamp, an optional field) produced as
  Protobuf and as Avro in the Confluent wire format with confluent-kafka's own serializers, on one
  broker; the ratio is Protobuf's whole command over Avro's (target: at most 1.5).
* **json_schema**: the same rows as JSON Schema (on a broker of its own: noida-db slows past a few
  hundred MB), read with validation on (the default) and off (``--json-schema-validation false``);
  the ratio is on over off.

The registry is the project's test double (``airflow_eo/testing/registry.py``), in this process: the
decode work is a real registry's (one schema fetch per task and id).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from confluent_kafka import Producer

import bench_kafka
from airflow_eo.core.offsets import OffsetRange
from bench_fanout import _Part, _raw, _times
from bench_paths import ServerCommand, _row, cli_ingest

TOPICS = {"avro": "bench-fmt-avro", "protobuf": "bench-fmt-protobuf", "json_schema": "bench-fmt-json"}
SQL = "SELECT topic, partition, offset, data.* FROM source"
PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  message Address { string city = 1; string zip = 2; }
  int64 id = 1;
  string customer = 2;
  Status status = 3;
  double amount = 4;
  int32 quantity = 5;
  google.protobuf.Timestamp at = 6;
  optional string note = 7;
  repeated string tags = 8;
  map<string, int32> attrs = 9;
  Address address = 10;
}
"""
AVRO = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "amount", "type": "double"}, {"name": "quantity", "type": "int"},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "int"}},
    {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": "string"}]}], "default": None},
]})
JSON_SCHEMA = json.dumps({
    "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
    "properties": {"id": {"type": "integer"}, "customer": {"type": "string"},
                   "status": {"enum": ["NEW", "PAID", "SHIPPED"]}, "amount": {"type": "number"},
                   "quantity": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
                   "note": {"type": ["string", "null"]}, "tags": {"type": "array", "items": {"type": "string"}},
                   "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
                   "address": {"$ref": "#/$defs/Address"}},
    "required": ["id", "customer", "status", "amount", "quantity", "at", "tags", "attrs", "address"],
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                          "required": ["city", "zip"], "additionalProperties": False}},
})
STATUSES = ("NEW", "PAID", "SHIPPED")
# a 1M batch of decoded rows (cached for the dead-letter split) does not fit the JVM's default 1 GB heap
# (measured: OutOfMemoryError in a task, Avro and Protobuf alike): a server sized for decoded batches
SERVER_CONF = ("spark.driver.memory=4g",)


def row(i: int) -> dict:
    """Row ``i``: ~200 bytes in each format."""
    return {"id": i, "customer": f"customer-{i % 10_007:05d} of the northern region, key account since {2000 + i % 26}",
            "status": STATUSES[i % 3],
            "amount": (i % 100_000) / 100, "quantity": i % 50,
            "at": datetime.fromtimestamp(1_767_225_600 + i, timezone.utc),
            "note": None if i % 3 else f"deliver after {i % 24}:00, ring twice, leave with the neighbour if away",
            "tags": [f"tag-{j}" for j in range(i % 4)], "attrs": {"priority": i % 5, "lane": i % 9},
            "address": {"city": f"city-{i % 997} on the river", "zip": f"{i % 100_000:05d}"}}


def serializers(registry_config: dict) -> dict:
    """value(i) → bytes in each format's Confluent wire format, by confluent-kafka's own serializers."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import message_factory

    from airflow_eo.decoding.protobuf_schemas import compile_proto

    client = SchemaRegistryClient(registry_config)
    order = message_factory.GetMessageClass(compile_proto(PROTO, "shop/order.proto").message("shop.Order"))
    avro = AvroSerializer(client, AVRO)
    proto = ProtobufSerializer(order, client)
    as_json = JSONSerializer(JSON_SCHEMA, client, conf={"validate": False})

    def protobuf(i: int) -> bytes:
        r = row(i)
        message = order(id=r["id"], customer=r["customer"], status=i % 3, amount=r["amount"], quantity=r["quantity"],
                        tags=r["tags"], attrs=r["attrs"], address=r["address"])
        message.at.FromDatetime(r["at"])
        if r["note"] is not None:
            message.note = r["note"]
        return proto(message, SerializationContext(TOPICS["protobuf"], MessageField.VALUE))

    def json_schema(i: int) -> bytes:
        r = row(i)
        return as_json({**r, "at": r["at"].isoformat()}, SerializationContext(TOPICS["json_schema"], MessageField.VALUE))

    return {"avro": lambda i: avro(row(i), SerializationContext(TOPICS["avro"], MessageField.VALUE)),
            "protobuf": protobuf, "json_schema": json_schema}


def load(kafka_config: dict, fmt: str, serialize, records: int, partitions: int) -> tuple[list[OffsetRange], int]:
    """``records`` rows of ``fmt`` round-robin over the partitions of its topic: its ranges, bytes per value."""
    from tests.helpers import send

    topic = TOPICS[fmt]
    bench_kafka.create_topic(kafka_config, topic, partitions)
    producer = Producer({**kafka_config, "linger.ms": 20, "enable.idempotence": True})
    size = 0
    for i in range(records):
        value = serialize(i)
        size += len(value)
        send(producer, topic, value, i % partitions)
    producer.flush(300)
    return [OffsetRange(topic, p, 0, len(range(p, records, partitions))) for p in range(partitions)], size // records


def ingest_flags(fmt: str, registry_url: str, dead_letters: str, validate: bool = True) -> tuple[str, ...]:
    flags = ["--value-format", fmt, "--schema-registry", registry_url, "--dead-letter-table", dead_letters]
    if fmt == "protobuf":
        flags += ["--message-name", "shop.Order"]
    if not validate:
        flags += ["--json-schema-validation", "false"]
    return tuple(flags)


def formats(bench, say, interleaved) -> dict:
    """The formats part of ``benchmarks/benchmark.py`` (see the module's docstring)."""
    from airflow_eo.testing.registry import RegistryDouble

    a = bench.args
    part = _Part(bench, say, "formats")
    out: dict = {"records": a.formats_records, "partitions": a.partitions, "value_bytes": {}}
    sides = {"avro": ("avro", True), "protobuf": ("protobuf", True), "json_schema": ("json_schema", True),
             "json_schema_unvalidated": ("json_schema", False)}
    with RegistryDouble() as registry, ServerCommand(a.master, bench.work, conf=SERVER_CONF) as server:
        serialize = serializers(registry.config)

        def run(side: str, records: int):
            fmt, validate = sides[side]
            table = bench.fresh(f"formats-{side}")
            return cli_ingest(table, TOPICS[fmt], bench.kafka_config, records, remote=server.url, token=server.token,
                              extra=("--transform-sql", SQL, *ingest_flags(fmt, registry.url, table + "_dlq",
                                                                           validate)))

        for group in (("avro", "protobuf"), ("json_schema", "json_schema_unvalidated")):
            part.start_broker()
            try:
                ranges = {}
                for fmt in dict.fromkeys(sides[s][0] for s in group):
                    say(f"formats: loading {a.formats_records:,} rows as {fmt}")
                    ranges[fmt], out["value_bytes"][fmt] = load(bench.kafka_config, fmt, serialize[fmt],
                                                                a.formats_records, a.partitions)
                for side in group:  # warm-up on this broker, not counted
                    run(side, min(a.formats_records, 100_000))
                for rep, side in interleaved(list(group), a.repetitions):
                    say(f"rep {rep + 1}/{a.repetitions}: formats {side}")
                    part.paired(side, ranges[sides[side][0]], lambda side=side: run(side, a.formats_records))
            finally:
                bench.stop_broker()
    out.update(part.summaries())
    med = {side: out[side]["ingest_median"] for side in sides}
    out["ratios"] = {"protobuf_over_avro": med["protobuf"] / med["avro"],
                     "json_schema_validated_over_unvalidated": med["json_schema"] / med["json_schema_unvalidated"],
                     **{f"{side}_raw_over_ingest": out[side]["raw_median"] / med[side] for side in sides}}
    out["targets"] = {"protobuf/avro<=1.5": out["ratios"]["protobuf_over_avro"] <= 1.5}
    return out


def rows(results: dict) -> list[dict]:
    """The formats rows of the report's table (when the part ran)."""
    if "formats" not in results:
        return []
    f = results["formats"]
    r, n = f["ratios"], f"{f['records']:,}"
    b = f["value_bytes"]
    return [
        _row(f"Protobuf, {n} rows (~{b['protobuf']} B): whole command / Avro's (~{b['avro']} B)", "<= 1.5x", "",
             f"{r['protobuf_over_avro']:.2f}x ({_times(f['protobuf'])} vs {_times(f['avro'])}); raw / ingest "
             f"{r['protobuf_raw_over_ingest']:.2f} vs {r['avro_raw_over_ingest']:.2f}",
             f"{_raw(f['protobuf'])}; {_raw(f['avro'])}", r["protobuf_over_avro"] <= 1.5),
        _row(f"JSON Schema, {n} rows (~{b['json_schema']} B): validation on / off", "", "",
             f"{r['json_schema_validated_over_unvalidated']:.2f}x ({_times(f['json_schema'])} vs "
             f"{_times(f['json_schema_unvalidated'])}); raw / ingest {r['json_schema_raw_over_ingest']:.2f}",
             _raw(f["json_schema"]), None),
    ]


def ratios(results: dict) -> dict:
    return dict(results.get("formats", {}).get("ratios", {}))

