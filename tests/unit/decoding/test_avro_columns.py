"""The columnar path of Avro decoding (logical types converted in Arrow) against the
value-by-value path: same column, same dead letters, and a fall back where it must."""

from __future__ import annotations

import io
import json
from datetime import date, datetime, timezone
from decimal import Decimal

import fastavro
import pyarrow as pa
import pytest

from airflow_eo.compat import arrow_type_of
from airflow_eo.decoding.avro import AvroColumn
from airflow_eo.decoding.shared import fitted_array
from airflow_eo.decoding.avro_columns import NotColumnar, to_column
from airflow_eo.decoding.avro_types import is_columnar
from airflow_eo.spec.columns import InlineAvro, Source

MONEY = {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4}
SCHEMA = {"type": "record", "name": "Event", "namespace": "t", "fields": [
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "fee", "type": MONEY},
    {"name": "fees", "type": {"type": "array", "items": "t.Money"}},
    {"name": "history", "type": {"type": "map", "values": ["null", {"type": "long", "logicalType": "timestamp-millis"}]}},
    {"name": "inner", "type": ["null", {"type": "record", "name": "Inner", "fields": [
        {"name": "when", "type": {"type": "int", "logicalType": "date"}}, {"name": "id", "type": "string"}]}],
     "default": None},
]}


def event(i: int) -> dict:
    utc = timezone.utc
    return {"day": date(2026, 1, 1 + i % 28), "ms": datetime(2026, 3, 4, 5, 6, 7, i * 1000 % 1_000_000, utc),
            "us": None if i % 3 == 0 else datetime(1969, 12, 31, 23, 59, 59, i % 1_000_000, utc),
            "local": datetime(2026, 1, 1, i % 24), "price": Decimal(-i * 7) / 100,
            "fee": Decimal(i) / 10_000, "fees": [Decimal(j) / 10_000 for j in range(i % 3)],
            "history": {f"k{j}": None if j % 2 else datetime(2025, 1, 1, tzinfo=utc) for j in range(i % 4)},
            "inner": None if i % 2 else {"when": date(1, 1, 1) if i == 4 else date(9999, 12, 31), "id": str(i)}}


def encode(schema: dict, records) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for record in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def both_paths(schema: dict, values: list):
    text = json.dumps(schema)
    column = AvroColumn(InlineAvro(source=Source.VALUE, schema=text), text)
    arrow_type = arrow_type_of(column.spark_type())
    records, reasons = column.decode(values)
    return column, arrow_type, (fitted_array(records, reasons, arrow_type, "Avro"), reasons)


def test_the_columnar_column_equals_the_value_by_value_one():
    # a null (already a dead letter, or a null key: no record, no reason) and a truncated value
    values = encode(SCHEMA, [event(i) for i in range(200)]) + [None, b"\x02"]
    column, arrow_type, (expected, expected_reasons) = both_paths(SCHEMA, values)
    assert is_columnar(SCHEMA)
    array, reasons = column.to_arrow(values, arrow_type)
    assert array.type == arrow_type and array.equals(expected), array.to_pylist()[:2]
    assert reasons == expected_reasons and reasons[-2] is None and "not decodable" in reasons[-1]
    assert array[200].as_py() is None
    assert array[0].as_py()["price"] == Decimal("0.00") and array[5].as_py()["price"] == Decimal("-0.35")


def test_a_value_the_column_cannot_hold_falls_back_and_becomes_one_dead_letter():
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}}]}
    wide = (123_456).to_bytes(3, "big", signed=True)  # 1234.56 has 6 digits: more than precision 4
    values = encode({**schema, "fields": [{"name": "price", "type": "bytes"}]}, [{"price": b"\x07"}, {"price": wide}])
    column, arrow_type, (expected, expected_reasons) = both_paths(schema, values)
    with pytest.raises(NotColumnar):
        to_column([{"price": b"\x07"}, {"price": wide}], schema, arrow_type)
    array, reasons = column.to_arrow(values, arrow_type)
    assert array.equals(expected) and reasons == expected_reasons
    assert array.to_pylist() == [{"price": Decimal("0.07")}, None] and "does not fit" in reasons[1]


def test_timestamps_outside_years_1_to_9999_are_not_columnar():
    schema = {"type": "record", "name": "R", "fields": [{"name": "at", "type": {"type": "long",
                                                                                "logicalType": "timestamp-millis"}}]}
    target = pa.struct([("at", pa.timestamp("us", tz="UTC"))])
    assert to_column([{"at": 0}], schema, target).to_pylist()[0]["at"] == datetime(1970, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(NotColumnar):
        to_column([{"at": 0}, {"at": 2 ** 62}], schema, target)


@pytest.mark.parametrize("schema, columnar", [
    (SCHEMA, True),
    ({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}, False),  # nothing to gain
    ({"type": "record", "name": "R", "fields": [  # a several-type union is reshaped into JSON text
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "u", "type": ["null", "long", "string"]}]}, False),
    ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0}, False),  # held as text
    ({"type": "string", "logicalType": "date"}, False),  # a logical type on the wrong type
])
def test_which_schemas_go_columnar(schema, columnar):
    assert is_columnar(schema) is columnar
