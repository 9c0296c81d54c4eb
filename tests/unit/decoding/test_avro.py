"""Avro values decoded from bytes: in the Confluent wire format (each record with its writer schema,
resolved to the reader schema) and plain Avro of an inline schema; what cannot be decoded is a
dead letter with its reason, what cannot be resolved fails the batch."""

from __future__ import annotations

import json

import pytest

from airflow_eo.decoding.avro import AvroColumn
from airflow_eo.core.errors import IncompatibleSchemaError
from airflow_eo.spec.columns import InlineAvro, RegistryAvro, Source
from tests.unit.decoding.fake_registry import INCOMPATIBLE, V1, V2, avro, registry, wire


def column(reader: dict, reg=None, source=Source.VALUE, **kw) -> AvroColumn:
    text = json.dumps(reader)
    spec = RegistryAvro(source=source, subject="orders-value") if reg else InlineAvro(source=source, schema=text)
    return AvroColumn(spec, text, registry=reg, **kw)


def test_each_record_is_read_with_its_writer_schema_and_resolved_to_the_reader():
    reg = registry()
    values = [wire(1, V1, {"id": 1, "item": "pen"}), wire(2, V2, {"id": 2, "item": "ink", "note": "blue"})]
    records, reasons = column(V2, reg).decode(values)
    assert records == [{"id": 1, "item": "pen", "note": None}, {"id": 2, "item": "ink", "note": "blue"}]
    assert reasons == [None, None]
    assert [c for c in reg.fake.calls if c[0] == "get_schema"] == [("get_schema", 1), ("get_schema", 2)]


def test_undecodable_values_become_dead_letters_with_their_reason():
    good = wire(1, V1, {"id": 1, "item": "pen"})
    values = [None, b"\x01abc", b"\x00\x00", wire(77, V1, {"id": 1, "item": "x"}), good[:-2], good + b"\x00\x00",
              good]
    records, reasons = column(V1, registry()).decode(values)
    assert records[:-1] == [None] * 6 and records[-1] == {"id": 1, "item": "pen"}
    assert reasons[0] is None  # a null value never reaches the decoder as a record (the read step's checks)
    assert "not in the Confluent wire format" in reasons[1] and "got first byte 1" in reasons[1]
    assert "not in the Confluent wire format" in reasons[2]
    assert reasons[3] == "unknown schema id 77 (not in the Schema Registry http://registry:8081)"
    assert reasons[4].startswith("value is not decodable as Avro (writer schema id 1)")
    assert reasons[5] == "value has 2 bytes after its Avro record (writer schema id 1)"
    assert reasons[6] is None


def test_a_writer_schema_the_reader_cannot_resolve_fails_the_batch():
    with pytest.raises(IncompatibleSchemaError, match="writer schema id 3 cannot be read as orders-value v2"):
        column(V1, registry(), reader_name="orders-value v2").decode([wire(3, INCOMPATIBLE, {"id": "x"})])


def test_inline_schemas_read_plain_avro_and_keys_name_their_column():
    records, reasons = column(V1).decode([avro(V1, {"id": 5, "item": "cup"}), None])
    assert records == [{"id": 5, "item": "cup"}, None] and reasons == [None, None]
    key = column(V1, source=Source.KEY)
    assert key.spec.target == "key_data"
    assert key.decode([avro(V1, {"id": 5, "item": "cup"}) + b"\x00"])[1] == \
        ["key has 1 bytes after its Avro record (the inline schema)"]
