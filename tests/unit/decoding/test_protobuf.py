"""Protobuf values decoded from bytes: every type the issue names into its column, proto3 presence,
the wire format's message indexes, writer schemas of the subject read into the reader (a field added
later is null for older records), references, and what is a dead letter, what fails the batch and what
is refused before a batch. Records are written by Google's runtime and, in the wire format, by
confluent-kafka's own ``ProtobufSerializer``; the registry is the labelled test double."""

from __future__ import annotations

import json
import pickle
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import message_factory

from airflow_eo.compat import arrow_type_of
from airflow_eo.core.errors import ConfigError, IncompatibleSchemaError
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.core.planning import BatchPlan
from airflow_eo.decoding.decoder import record_decoder
from airflow_eo.decoding.formats import decoder_of
from airflow_eo.decoding.protobuf import message_indexes
from airflow_eo.decoding.protobuf_schemas import compile_proto
from airflow_eo.decoding.reader_schemas import pin
from airflow_eo.spec.columns import REASON_COLUMN, InlineProtobuf, RawColumn, RegistryProtobuf, Source
from airflow_eo.testing.registry import RegistryDouble

SHOP = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/any.proto";

message Other { int32 x = 1; }
message Order {
  enum Status { NEW = 0; PAID = 1; }
  message Line { string sku = 1; int32 qty = 2; }
  int64 id = 1;
  optional string note = 2;
  Status status = 3;
  repeated Line lines = 4;
  map<string, int64> attrs = 5;
  oneof pay { string card = 6; int64 voucher = 7; }
  google.protobuf.Timestamp at = 8;
  google.protobuf.DoubleValue price = 9;
  google.protobuf.Duration took = 10;
  google.protobuf.Struct extra = 11;
  google.protobuf.Any any = 12;
  uint64 big = 13;
  bytes blob = 14;
  float ratio = 15;
  bool ok = 16;
  repeated Status history = 17;
  sint32 delta = 18;
  map<string, Line> by_sku = 19;
}
"""
ADDED = SHOP.replace("  map<string, Line> by_sku = 19;\n", "  map<string, Line> by_sku = 19;\n  string added = 20;\n"
                     "  optional int32 added_optional = 21;\n")


def classes(text: str):
    schema = compile_proto(text)
    return schema, {name: message_factory.GetMessageClass(schema.message(name)) for name in ("shop.Order", "shop.Other")}


def full_order(cls):
    order = cls(id=7, note="hi", status=1, card="visa", big=2**64 - 1, blob=b"\x00\x01", ratio=0.5, ok=True,
                history=[0, 1], delta=-3)
    order.lines.add(sku="a", qty=2)
    order.lines.add(sku="b", qty=1)
    order.attrs["k"] = 5
    order.by_sku["a"].qty = 9
    order.at.FromDatetime(datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=timezone.utc))
    order.price.value = 2.5
    order.took.seconds, order.took.nanos = 3, 500_000_000
    order.extra.update({"a": 1, "b": [True, None]})
    order.any.Pack(cls(id=1).lines.add(sku="z"))
    return order


def decode(column, values):
    spec_type = column.spark_type()
    array, reasons = column.to_arrow(values, arrow_type_of(spec_type))
    return array.to_pylist(), reasons


def inline(text=SHOP, message="shop.Order", source=Source.VALUE):
    spec = InlineProtobuf(source=source, schema=text, message_name=message)
    return decoder_of(spec)


def test_every_type_lands_in_its_column_and_presence_follows_the_schema():
    _, cls = classes(SHOP)
    column = inline()
    assert column.spark_type().simpleString() == (
        "struct<id:bigint,note:string,status:string,lines:array<struct<sku:string,qty:int>>,attrs:map<string,bigint>,"
        "card:string,voucher:bigint,at:timestamp,price:double,took:bigint,extra:string,any:string,big:decimal(20,0),"
        "blob:binary,ratio:float,ok:boolean,history:array<string>,delta:int,by_sku:map<string,struct<sku:string,"
        "qty:int>>>")
    rows, reasons = decode(column, [full_order(cls["shop.Order"]).SerializeToString(),
                                    cls["shop.Order"]().SerializeToString(), None])
    assert reasons == [None, None, None]
    full, empty, null = rows
    assert null is None
    assert {k: full[k] for k in ("id", "note", "status", "card", "voucher", "price", "took", "blob", "ratio", "ok",
                                 "history", "delta")} == {
        "id": 7, "note": "hi", "status": "PAID", "card": "visa", "voucher": None, "price": 2.5, "took": 3_500_000,
        "blob": b"\x00\x01", "ratio": 0.5, "ok": True, "history": ["NEW", "PAID"], "delta": -3}
    assert full["lines"] == [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}]
    assert dict(full["attrs"]) == {"k": 5} and dict(full["by_sku"]) == {"a": {"sku": "", "qty": 9}}
    assert full["at"] == datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=timezone.utc)
    assert int(full["big"]) == 2**64 - 1
    assert json.loads(full["extra"]) == {"a": 1, "b": [True, None]}
    assert json.loads(full["any"]) == {"@type": "type.googleapis.com/shop.Order.Line", "sku": "z"}
    # proto3: a scalar without `optional` reads its default, a field with presence reads null
    assert (empty["id"], empty["status"], empty["ok"], empty["blob"], empty["lines"], empty["history"]) == \
        (0, "NEW", False, b"", [], [])
    assert (empty["note"], empty["card"], empty["at"], empty["price"], empty["took"], empty["extra"]) == \
        (None, None, None, None, None, None)


def test_undecodable_messages_are_dead_letters_and_a_recursive_message_is_refused():
    rows, reasons = decode(inline(), [b"\xff\xff\xff", b"\x0a"])
    assert rows == [None, None]
    assert all(r.startswith("value is not decodable as Protobuf shop.Order (the inline schema)") for r in reasons)
    _, cls = classes(SHOP)
    far = cls["shop.Order"]()
    far.at.seconds = 300_000_000_000  # past year 9999: no column holds it
    rows, reasons = decode(inline(), [far.SerializeToString(), cls["shop.Order"](id=1).SerializeToString()])
    assert rows[0] is None and "does not fit its column type" in reasons[0] and rows[1]["id"] == 1
    with pytest.raises(ConfigError, match="Protobuf message 'n.Node' is recursive"):
        inline('syntax = "proto3"; package n; message Node { Node next = 1; }', "n.Node")
    with pytest.raises(ConfigError, match=r"^the inline value schema \(protobuf_schema\) is not valid Protobuf: "):
        inline("syntax = 'proto3'; message {")
    with pytest.raises(ConfigError, match="message_name 'shop.Nope' is not a message of the inline value schema "
                                          r"\(protobuf_schema\) \(its messages: shop.Other, shop.Order\)"):
        inline(message="shop.Nope")
    assert inline(message=None).reader.full_name == "shop.Other"  # no message_name: the file's first
    assert inline(message="Order").reader.full_name == "shop.Order"  # a name the file has once


def test_message_indexes_of_the_wire_format():
    assert message_indexes(b"\x00\x00\x00\x00\x01\x00rest") == ((0,), 6)
    assert message_indexes(b"\x00\x00\x00\x00\x01" + bytes([2, 2])) == ((1,), 7)
    assert message_indexes(b"\x00\x00\x00\x00\x01" + bytes([6, 2, 4, 0])) == ((1, 2, 0), 9)


def producer(registry: RegistryDouble, cls, subject_topic: str):
    serialize = ProtobufSerializer(cls, SchemaRegistryClient(registry.config))
    context = SerializationContext(subject_topic, MessageField.VALUE)
    return lambda message: serialize(message, context)


def registry_decoder(registry, column, plan_pins=None):
    columns = (column, RawColumn(source=Source.KEY))
    pins = plan_pins if plan_pins is not None else pin(columns, registry.config)
    decoder, used = record_decoder(columns, registry.config, BatchPlan("o", 1, (), RunIdentity("r"),
                                                                     reader_schemas=pins))
    return decoder, used


def run(decoder, values):
    batch = pa.RecordBatch.from_pydict({"key": pa.array([None] * len(values), pa.binary()),
                                        "value": pa.array(values, pa.binary())})
    out = decoder(batch)
    return out.column("data").to_pylist(), out.column(REASON_COLUMN).to_pylist()


def test_records_of_older_writer_schemas_are_read_into_the_pinned_reader():
    with RegistryDouble() as registry:
        _, old = classes(SHOP)
        _, new = classes(ADDED)
        write_old = producer(registry, old["shop.Order"], "orders")  # registers version 1 (serialized form)
        first = write_old(old["shop.Order"](id=1, status=1))
        registry.register("orders-value", ADDED, "PROTOBUF")  # version 2, as .proto text
        write_new = producer(registry, new["shop.Order"], "orders")
        second = write_new(new["shop.Order"](id=2, added="yes", added_optional=0))
        other = producer(registry, old["shop.Other"], "orders")(old["shop.Other"](x=1))  # index [0] of version 1
        assert first[5:7] == bytes([2, 2])  # the wire format names shop.Order: message 1 of its file
        decoder, used = registry_decoder(registry, RegistryProtobuf(source=Source.VALUE, subject="orders-value",
                                                                    message_name="shop.Order"))
        assert [(p.subject, p.version) for p in used] == [("orders-value", 2)]
        rows, reasons = run(decoder, [first, second, other, b"\x00\x00\x00\x00\x63\x00", b"\x00\x00"])
        assert rows[0]["id"] == 1 and rows[0]["status"] == "PAID"
        assert rows[0]["added"] is None and rows[0]["added_optional"] is None  # not in the writer's schema
        assert rows[1]["added"] == "yes" and rows[1]["added_optional"] == 0
        assert reasons[:2] == [None, None] and rows[2:] == [None, None, None]
        assert reasons[2].startswith("value is a shop.Other (writer schema id ")
        assert reasons[3].startswith("unknown schema id 99 (not in the Schema Registry")
        assert "not in the Confluent wire format" in reasons[4]
        assert registry.requests["schema_by_id"] <= 4  # per id, not per record
        again = pickle.loads(pickle.dumps(decoder))  # as a Spark task gets it
        assert run(again, [first])[0][0]["id"] == 1


def test_an_incompatible_writer_fails_naming_subject_version_and_field():
    with RegistryDouble() as registry:
        registry.register("orders-value", SHOP, "PROTOBUF")
        changed = SHOP.replace("int64 id = 1;", "string id = 1;")
        _, cls = classes(changed)
        value = producer(registry, cls["shop.Order"], "elsewhere")(cls["shop.Order"](id="x"))
        decoder, _ = registry_decoder(registry, RegistryProtobuf(source=Source.VALUE, subject="orders-value",
                                                                 message_name="shop.Order"))
        with pytest.raises(IncompatibleSchemaError, match=r"writer schema id 2 cannot be read as orders-value version "
                                                          r"1 \(schema id 1\): field shop.Order.id \(number 1\) is "
                                                          "string in the writer schema, int64 in the reader schema"):
            run(decoder, [value])


def test_subjects_of_another_type_and_unknown_messages_are_refused_when_a_batch_is_planned():
    with RegistryDouble() as registry:
        registry.register("avro-value", json.dumps({"type": "record", "name": "R", "fields": []}))
        registry.register("orders-value", SHOP, "PROTOBUF")
        columns = (RegistryProtobuf(source=Source.VALUE, subject="avro-value"), RawColumn(source=Source.KEY))
        with pytest.raises(ConfigError, match=r"^avro-value version 1 \(schema id 1\) is a AVRO schema, not Protobuf: "
                                              r"value_format='protobuf' reads Protobuf subjects"):
            pin(columns, registry.config)
        columns = (RegistryProtobuf(source=Source.VALUE, subject="orders-value", message_name="shop.Gone"),
                   RawColumn(source=Source.KEY))
        with pytest.raises(ConfigError, match=r"^message_name 'shop.Gone' is not a message of orders-value version 1"):
            pin(columns, registry.config)


def test_imports_resolve_through_the_registrys_references():
    money = 'syntax = "proto3"; package common; message Money { int64 units = 1; string currency = 2; }'
    order = ('syntax = "proto3"; package shop; import "common/money.proto"; '
             'message Order { int64 id = 1; common.Money total = 2; }')
    with RegistryDouble() as registry:
        registry.register("money-value", money, "PROTOBUF")
        registry.register("orders-value", order, "PROTOBUF",
                          [{"name": "common/money.proto", "subject": "money-value", "version": 1}])
        schema = compile_proto(order, "shop/order.proto", {"common/money.proto": money})
        cls = message_factory.GetMessageClass(schema.message("shop.Order"))
        record = cls(id=4)
        record.total.units, record.total.currency = 12, "EUR"
        decoder, _ = registry_decoder(registry, RegistryProtobuf(source=Source.VALUE, subject="orders-value"))
        wire = b"\x00" + (2).to_bytes(4, "big") + b"\x00" + record.SerializeToString()
        rows, reasons = run(decoder, [wire])
        assert reasons == [None] and rows == [{"id": 4, "total": {"units": 12, "currency": "EUR"}}]
