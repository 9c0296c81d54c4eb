"""Debezium's envelope (airflow_eo.driver.cdc): what each op does, the decoders' DDL for both JSON
shapes, and the spec the decoders run with. The unwrapping itself runs on Spark (tests/integration)."""

import pytest

from airflow_eo.driver.cdc import Change, change_of, decoding_spec, envelope_ddl, key_ddl
from airflow_eo.spec import IngestSpec

BASE = dict(table_uri="/t", ingest_id="x", topics="db.public.orders", write_mode="merge", merge_key="id",
            dead_letter_table_uri="/dlq")


@pytest.mark.parametrize("op, change", [("c", Change.UPSERT), ("u", Change.UPSERT), ("r", Change.UPSERT),
                                        ("d", Change.DELETE), ("t", Change.NONE), ("m", Change.NONE),
                                        ("x", None), (None, None)])
def test_what_each_op_does(op, change):
    assert change_of(op) == change


def test_the_envelope_ddl_holds_both_json_shapes_around_the_row():
    ddl = envelope_ddl(" id INT, name STRING ")
    assert ddl.startswith("payload STRUCT<before: STRUCT<id INT, name STRING>, after: STRUCT<id INT, name STRING>, "
                          "op: STRING, ts_ms: BIGINT>")
    assert ddl.endswith(", before STRUCT<id INT, name STRING>, after STRUCT<id INT, name STRING>, op STRING, "
                        "ts_ms BIGINT")
    assert key_ddl("id INT") == "payload STRUCT<id INT>, id INT"


def test_the_decoders_get_the_envelope_for_json_and_the_spec_unchanged_otherwise():
    spec = IngestSpec.of(**BASE, cdc_format="debezium", value_schema="id INT, name STRING",
                         key_format="json", key_schema="id INT")
    decoding = decoding_spec(spec)
    assert decoding.decode.value_schema == envelope_ddl("id INT, name STRING")
    assert decoding.decode.key_schema == key_ddl("id INT")
    assert decoding.merge == spec.merge and spec.decode.value_schema == "id INT, name STRING"
    avro = IngestSpec.of(**BASE, cdc_format="debezium", value_format="avro")
    assert decoding_spec(avro) is avro
    plain = IngestSpec.of(**BASE, value_schema="id INT")
    assert decoding_spec(plain) is plain
