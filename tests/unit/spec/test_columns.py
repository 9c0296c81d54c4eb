"""One typed spec per decoded column, built once from the options users set (and from what earlier
versions wrote), with the rules about which records are bad before decoding and which options a
column needs, in one place."""

from __future__ import annotations

import pytest

from airflow_eo.core.errors import ConfigError
from airflow_eo.spec import DecodeSpec, IngestSpec
from airflow_eo.spec.columns import (
    Format, InlineAvro, InlineJsonSchema, InlineProtobuf, JsonColumn, RawColumn, RegistryAvro, RegistryJsonSchema,
    RegistryProtobuf, Source, column_of, require_registry,
)

BASE = {"table_uri": "/t", "ingest_id": "orders", "topics": "orders", "dead_letter_table_uri": "/dlq"}


@pytest.mark.parametrize("options, value, key", [
    ({}, RawColumn(source=Source.VALUE), RawColumn(source=Source.KEY)),
    ({"value_schema": "id INT", "max_value_bytes": 64},
     JsonColumn(source=Source.VALUE, ddl="id INT", max_bytes=64), RawColumn(source=Source.KEY)),
    ({"value_format": "avro", "value_schema_version": "3", "key_format": "avro", "key_schema_version": "2"},
     RegistryAvro(source=Source.VALUE, subject="orders-value", version=3),
     RegistryAvro(source=Source.KEY, subject="orders-key", version=2)),
    ({"value_format": "avro", "avro_schema": '"long"', "key_format": "json", "key_schema": "id STRING"},
     InlineAvro(source=Source.VALUE, schema='"long"'), JsonColumn(source=Source.KEY, ddl="id STRING")),
    ({"value_format": "raw", "max_value_bytes": 10, "key_format": "avro", "key_avro_schema": '"string"',
      "key_subject": "ignored-when-inline"},
     RawColumn(source=Source.VALUE, max_bytes=10), InlineAvro(source=Source.KEY, schema='"string"')),
    ({"value_format": "avro", "value_subject": "shared-value", "key_format": "avro", "key_subject": "k"},
     RegistryAvro(source=Source.VALUE, subject="shared-value"), RegistryAvro(source=Source.KEY, subject="k")),
    ({"value_format": "protobuf", "message_name": "shop.Order", "value_schema_version": "2",
      "key_format": "json_schema"},
     RegistryProtobuf(source=Source.VALUE, subject="orders-value", version=2, message_name="shop.Order"),
     RegistryJsonSchema(source=Source.KEY, subject="orders-key")),
    ({"value_format": "json_schema", "json_schema": '{"type": "object"}', "json_schema_validation": "false",
      "key_format": "protobuf", "key_protobuf_schema": "message K {}", "key_message_name": "K"},
     InlineJsonSchema(source=Source.VALUE, schema='{"type": "object"}', validate=False),
     InlineProtobuf(source=Source.KEY, schema="message K {}", message_name="K")),
    ({"value_format": "json_schema", "json_schema_validation": ""},  # an unset template: validation stays on
     RegistryJsonSchema(source=Source.VALUE, subject="orders-value"), RawColumn(source=Source.KEY)),
])
def test_each_column_gets_one_typed_spec_from_its_options(options, value, key):
    spec = IngestSpec.of(**BASE, **options)
    assert (spec.decode.value, spec.decode.key) == (value, key)
    assert spec.decode.columns == (value, key)
    again = IngestSpec.from_dict(spec.to_dict()).decode  # the attempt's JSON round trip builds the same
    assert (again.value, again.key) == (value, key)


def test_the_options_stay_as_they_were_written_and_read():
    spec = IngestSpec.of(**BASE, value_format="avro", key_format="json", key_schema="id STRING")
    written = spec.to_dict()["decode"]
    assert written["value_format"] == "avro" and written["key_format"] == "json"  # text, as before
    assert spec.decode.value_format is Format.AVRO and spec.decode.value_format == "avro"
    # an attempt an earlier version wrote: no key_schema_version, formats as text
    old = {"value_schema": None, "value_format": "avro", "max_value_bytes": None, "avro_schema": None,
           "value_subject": "orders-value", "value_schema_version": "latest", "key_format": "raw", "key_schema": None,
           "key_avro_schema": None, "key_subject": None}
    loaded = IngestSpec.from_dict({**spec.to_dict(), "decode": old}).decode
    assert loaded.value == RegistryAvro(source=Source.VALUE, subject="orders-value") and loaded.key_schema_version == \
        "latest"


@pytest.mark.parametrize("column, null_is_bad, checked, decodes", [
    (RawColumn(source=Source.VALUE), False, False, False),  # nothing decoded: a tombstone is a row like any
    (RawColumn(source=Source.VALUE, max_bytes=5), True, True, False),
    (JsonColumn(source=Source.VALUE, ddl="id INT"), True, True, True),
    (InlineAvro(source=Source.VALUE, schema='"long"'), True, True, True),
    (JsonColumn(source=Source.KEY, ddl="id INT"), False, False, True),  # a record without a key is fine
    (RegistryAvro(source=Source.KEY, subject="k"), False, False, True),
])
def test_which_records_are_bad_before_decoding(column, null_is_bad, checked, decodes):
    assert (column.null_is_bad, column.checked, column.decodes) == (null_is_bad, checked, decodes)
    assert DecodeSpec().enabled is False


def test_reasons_and_option_names_come_from_the_column():
    value, key = RawColumn(source=Source.VALUE, max_bytes=8), JsonColumn(source=Source.KEY, ddl="id INT")
    assert value.null_reason() == "value is null" and key.null_reason() == "key is null"
    assert value.size_reason(9) == "value of 9 bytes exceeds max_value_bytes=8"
    assert (value.target, key.target, key.ddl_option) == ("data", "key_data", "key_schema")
    assert [Source.KEY.option(n) for n in ("value_format", "avro_schema", "value_subject", "value_schema_version")] \
        == ["key_format", "key_avro_schema", "key_subject", "key_schema_version"]
    assert RegistryAvro(source=Source.VALUE, subject="s").requested == "latest"
    assert RegistryAvro(source=Source.VALUE, subject="s", version=4).requested == "4"


@pytest.mark.parametrize("options, message", [
    ({"key_format": "json"}, "key_format='json' needs key_schema"),
    ({"value_format": "avro", "value_schema": "id INT"}, "value_schema is the Spark DDL of JSON values"),
    ({"value_format": "avro", "value_schema_version": "v2"}, "value_schema_version 'v2' is not 'latest' or a number"),
    ({"key_format": "avro", "key_schema_version": "0"}, "key_schema_version '0' is not 'latest' or a number"),
    ({"key_format": "xml"}, "key_format='xml' is not understood .*use one of json, avro, raw, protobuf, json_schema"),
    ({"value_format": "protobuf", "avro_schema": '"long"'}, "avro_schema is the inline schema of value_format='avro', "
                                                             "but value_format='protobuf'"),
    ({"value_format": "avro", "message_name": "shop.Order"}, "message_name names a Protobuf message: it applies only "
                                                              "with value_format='protobuf'"),
    ({"key_format": "json_schema", "key_protobuf_schema": "message K {}"}, "key_protobuf_schema is the inline schema "
                                                                            "of key_format='protobuf'"),
])
def test_combinations_that_cannot_work_are_refused_naming_the_option(options, message):
    with pytest.raises(ConfigError, match=message):
        IngestSpec.of(**BASE, **options)


def test_avro_without_an_inline_schema_needs_a_registry_one_rule_for_both_columns():
    value = column_of(Source.VALUE, Format.AVRO, subject="orders-value")
    key = column_of(Source.KEY, Format.AVRO, subject="orders-key")
    require_registry((value, key), has_registry=True)
    require_registry((InlineAvro(source=Source.VALUE, schema='"long"'),), has_registry=False)
    with pytest.raises(ConfigError, match="value_format='avro': Avro without an inline schema needs a Schema Registry: "
                                          "set schema_registry_conn_id .* or avro_schema$"):
        require_registry((value, key), has_registry=False)
    with pytest.raises(ConfigError, match="key_format='avro': .* or key_avro_schema$"):
        require_registry((RawColumn(source=Source.VALUE), key), has_registry=False)
    with pytest.raises(ConfigError, match="^value_format='protobuf': Protobuf without an inline schema needs a Schema "
                                          "Registry: .* or protobuf_schema$"):
        require_registry((column_of(Source.VALUE, Format.PROTOBUF, subject="s"),), has_registry=False)
    with pytest.raises(ConfigError, match="^key_format='json_schema': JSON Schema without .* or key_json_schema$"):
        require_registry((column_of(Source.KEY, Format.JSON_SCHEMA, subject="s"),), has_registry=False)
