"""Avro schemas checked and mapped to column types without Spark running (pyspark's type classes only)."""

from __future__ import annotations

import json

import pytest

from airflow_eo.decoding.avro_types import canonical, check_schema, converter, is_columnar, named_types, parse, resolve, \
    spark_type
from airflow_eo.core.errors import ConfigError

ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "huge", "type": {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "tag", "type": ["null", "string"], "default": None},
    {"name": "either", "type": ["null", "string", "long"], "default": None},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
    {"name": "attrs", "type": {"type": "map", "values": "double"}},
    {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
    {"name": "copy", "type": "shop.Line"},
    {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
]}


def test_each_avro_type_maps_to_its_column_type():
    assert spark_type(ORDER).simpleString() == (
        "struct<id:bigint,when:timestamp,local:timestamp_ntz,day:date,price:decimal(9,2),huge:string,status:string,"
        "tag:string,either:string,lines:array<struct<sku:string,qty:int>>,attrs:map<string,double>,hash:binary,"
        "copy:struct<sku:string,qty:int>,clock:int>")
    assert all(f.nullable for f in spark_type(ORDER).fields)  # a dead letter has no value


def test_named_types_are_found_by_short_and_full_name_and_resolved():
    names = named_types(ORDER)
    assert {"Order", "shop.Order", "Line", "shop.Line", "Status", "shop.Status", "Hash", "shop.Hash"} <= set(names)
    assert resolve("shop.Line", names)["fields"][0]["name"] == "sku"
    assert resolve(["null", {"type": "Status"}], names)["symbols"] == ["NEW", "PAID"]


def test_values_whose_column_type_differs_are_converted():
    convert = converter(ORDER)
    record = {"id": 1, "either": 7, "huge": 10 ** 39, "lines": [], "tag": None}
    out = convert(record)
    assert out["either"] == "7" and out["huge"] == str(10 ** 39) and out["id"] == 1 and out["tag"] is None
    assert converter({"type": "record", "name": "P", "fields": [{"name": "x", "type": "long"}]}) is None


def test_columnar_decoding_is_for_schemas_with_logical_types_and_nothing_reshaped():
    plain = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}
    dated = {"type": "record", "name": "R", "fields": [{"name": "d", "type": {"type": "int", "logicalType": "date"}}]}
    union = {**dated, "fields": [*dated["fields"], {"name": "u", "type": ["null", "int", "string"]}]}
    assert not is_columnar(plain) and is_columnar(dated) and not is_columnar(union) and not is_columnar(ORDER)


def test_one_text_per_schema_and_one_parse_per_text():
    text = json.dumps(ORDER, indent=2)
    assert canonical(text) == json.dumps(ORDER, sort_keys=True, separators=(",", ":"))
    assert parse(canonical(text)) is parse(canonical(json.dumps(ORDER)))


@pytest.mark.parametrize("text, message", [
    ("{not json", "the Avro schema is not JSON"),
    ('{"type": "record", "name": "R"}', "not a valid Avro schema"),
    ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nope"}]}', "not a valid Avro schema"),
    ('{"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}', "is recursive"),
])
def test_a_schema_that_cannot_be_a_column_is_a_one_line_config_error(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_schema(text)
    assert "\n" not in str(err.value)
    check_schema(json.dumps(ORDER))
