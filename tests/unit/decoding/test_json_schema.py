"""JSON Schema values decoded from bytes: the schema's types into columns, validation (on by default:
a record the schema refuses is a dead letter; off: decoded as far as its columns go), writer schemas of
the subject read into the pinned reader, and what fails the batch or is refused before one. Records in
the wire format come from confluent-kafka's own ``JSONSerializer``; the registry is the labelled double."""

from __future__ import annotations

import json
from datetime import date, datetime, timezone

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_eo.compat import arrow_type_of
from airflow_eo.core.errors import ConfigError, IncompatibleSchemaError
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.core.planning import BatchPlan
from airflow_eo.decoding.decoder import record_decoder
from airflow_eo.decoding.formats import decoder_of
from airflow_eo.decoding.reader_schemas import pin
from airflow_eo.spec.columns import REASON_COLUMN, InlineJsonSchema, RawColumn, RegistryJsonSchema, Source
from airflow_eo.testing.registry import RegistryDouble

ORDER = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "note": {"type": ["string", "null"]},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "price": {"type": "number"},
        "ok": {"type": "boolean"},
        "status": {"enum": ["NEW", "PAID"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"$ref": "#/$defs/Address"},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "anything": {},
        "either": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    },
    "required": ["id", "status"],
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}},
                          "additionalProperties": True}},
}
FULL = {"id": 1, "note": None, "at": "2026-03-04T05:06:07.5+01:00", "day": "2026-03-04", "price": 2, "ok": True,
        "status": "PAID", "tags": ["a", "b"], "address": {"city": "Oslo", "zip": "0150"}, "counts": {"x": 3},
        "anything": {"deep": [1, 2]}, "either": "text", "undeclared": 5}


def column(schema=ORDER, validate=True, source=Source.VALUE):
    return decoder_of(InlineJsonSchema(source=source, schema=json.dumps(schema), validate=validate))


def decode(decoder, values):
    array, reasons = decoder.to_arrow(values, arrow_type_of(decoder.spark_type()))
    return array.to_pylist(), reasons


def test_the_schemas_types_land_in_their_columns():
    decoder = column()
    assert decoder.spark_type().simpleString() == (
        "struct<id:bigint,note:string,at:timestamp,day:date,price:double,ok:boolean,status:string,tags:array<string>,"
        "address:struct<city:string,_additional_properties:string>,counts:map<string,bigint>,anything:string,"
        "either:string>")
    (row, minimal, null), reasons = decode(decoder, [json.dumps(FULL).encode(), b'{"id": 2, "status": "NEW"}', None])
    assert reasons == [None, None, None] and null is None
    assert row["at"] == datetime(2026, 3, 4, 4, 6, 7, 500000, tzinfo=timezone.utc) and row["day"] == date(2026, 3, 4)
    assert (row["id"], row["note"], row["price"], row["ok"], row["status"], row["tags"]) == \
        (1, None, 2.0, True, "PAID", ["a", "b"])
    assert row["address"] == {"city": "Oslo", "_additional_properties": '{"zip":"0150"}'}
    assert dict(row["counts"]) == {"x": 3} and json.loads(row["anything"]) == {"deep": [1, 2]}
    assert json.loads(row["either"]) == "text" and "undeclared" not in row  # additionalProperties unset: dropped
    assert minimal == {"id": 2, "note": None, "at": None, "day": None, "price": None, "ok": None, "status": "NEW",
                       "tags": None, "address": None, "counts": None, "anything": None, "either": None}


def test_records_the_schema_refuses_are_dead_letters_unless_validation_is_off():
    values = [b'{"status": "NEW"}', b'{"id": 1, "status": "LOST"}', b'{"id": "x", "status": "NEW"}', b"{oops",
              b'[1, 2]', b'{"id": 3, "status": "NEW", "day": "not a date"}']
    rows, reasons = decode(column(), values)
    assert rows == [None] * 6
    assert reasons[0] == "value does not match its JSON Schema (the inline value schema): 'id' is a required property"
    assert reasons[1] == ("value does not match its JSON Schema (the inline value schema): 'LOST' is not one of "
                          "['NEW', 'PAID'] (at $.status)")
    assert reasons[2].endswith("'x' is not of type 'integer' (at $.id)")
    assert reasons[3].startswith("value is not JSON (the inline value schema): Expecting property name")
    assert reasons[4].endswith("[1, 2] is not of type 'object'")
    assert reasons[5].endswith("'not a date' is not a 'date' (at $.day)")
    rows, reasons = decode(column(validate=False), values)  # decoded as far as the columns go
    assert rows[0]["id"] is None and rows[0]["status"] == "NEW" and rows[1]["status"] == "LOST"
    assert reasons[:2] == [None, None]
    assert reasons[2] == "value does not fit the reader schema's columns: at $.id: expected an integer, got \"x\""
    assert reasons[3].startswith("value is not JSON") and reasons[4].endswith("expected an object, got [1, 2]")
    assert reasons[5] == ("value does not fit the reader schema's columns: at $.day: expected a date (YYYY-MM-DD), "
                          "got \"not a date\"")


@pytest.mark.parametrize("schema, message", [
    ({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}, "points outside the schema"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/gone"}}}, "points at nothing in the schema"),
    ({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"},
     "is recursive"),
    ({"type": "object", "properties": {"a": {"type": 5}}}, "is not a valid JSON Schema"),
])
def test_schemas_that_cannot_be_columns_are_refused_in_one_line(schema, message):
    with pytest.raises(ConfigError, match=message) as raised:
        column(schema)
    assert "\n" not in str(raised.value)


def serializer(registry, schema, topic="events"):
    serialize = JSONSerializer(json.dumps(schema), SchemaRegistryClient(registry.config), conf={"validate": False})
    return lambda record: serialize(record, SerializationContext(topic, MessageField.VALUE))


def registry_decoder(registry, column_spec):
    columns = (column_spec, RawColumn(source=Source.KEY))
    pins = pin(columns, registry.config)
    decoder, _ = record_decoder(columns, registry.config, BatchPlan("o", 1, (), RunIdentity("r"), reader_schemas=pins))
    return decoder


def run(decoder, values):
    out = decoder(pa.RecordBatch.from_pydict({"key": pa.array([None] * len(values), pa.binary()),
                                              "value": pa.array(values, pa.binary())}))
    return out.column("data").to_pylist(), out.column(REASON_COLUMN).to_pylist()


def test_older_writer_schemas_read_into_the_pinned_reader_and_each_is_validated_with_its_own():
    v1 = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    v2 = {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string"}},
          "required": ["id", "email"]}
    with RegistryDouble() as registry:
        old = serializer(registry, v1)({"id": 1})
        new, missing = serializer(registry, v2)({"id": 2, "email": "a@b"}), serializer(registry, v2)({"id": 3})
        decoder = registry_decoder(registry, RegistryJsonSchema(source=Source.VALUE, subject="events-value"))
        rows, reasons = run(decoder, [old, new, missing, b"\x00\x00\x00\x00\x63{}", b"{}"])
        assert rows[:2] == [{"id": 1, "email": None}, {"id": 2, "email": "a@b"}] and reasons[:2] == [None, None]
        assert reasons[2] == "value does not match its JSON Schema (writer schema id 2): 'email' is a required property"
        assert reasons[3].startswith("unknown schema id 99") and "Confluent wire format" in reasons[4]


def test_an_incompatible_writer_fails_and_a_subject_of_another_type_is_refused():
    reader = {"type": "object", "properties": {"id": {"type": "integer"}, "n": {"type": "number"}}}
    with RegistryDouble() as registry:
        registry.register("events-value", json.dumps(reader), "JSON")
        widened = serializer(registry, {"type": "object", "properties": {"n": {"type": "integer"}}}, "a")({"n": 1})
        changed = serializer(registry, {"type": "object", "properties": {"id": {"type": "string"}}}, "b")({"id": "x"})
        decoder = registry_decoder(registry, RegistryJsonSchema(source=Source.VALUE, subject="events-value"))
        assert run(decoder, [widened])[0] == [{"id": None, "n": 1.0}]  # an integer reads as a number
        with pytest.raises(IncompatibleSchemaError, match=r"writer schema id 3 cannot be read as events-value version 1 "
                                                          r"\(schema id 1\): property \$.id is string in the writer "
                                                          "schema, long in the reader schema"):
            run(decoder, [changed])
        registry.register("avro-value", json.dumps({"type": "record", "name": "R", "fields": []}))
        with pytest.raises(ConfigError, match="is a AVRO schema, not JSON Schema: value_format='json_schema'"):
            pin((RegistryJsonSchema(source=Source.VALUE, subject="avro-value"),), registry.config)


def test_records_are_checked_by_a_compiled_validator_and_later_drafts_by_jsonschema():
    draft7, later = column(), column({**ORDER, "$schema": "https://json-schema.org/draft/2020-12/schema"})
    assert draft7._writer(None).fast is not None and later._writer(None).fast is None
    values = [json.dumps(FULL).encode(), b'{"status": "NEW"}']
    assert decode(draft7, values)[1] == decode(later, values)[1] == [
        None, "value does not match its JSON Schema (the inline value schema): 'id' is a required property"]
