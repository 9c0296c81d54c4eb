"""The read step's decoder on Arrow batches of Kafka records (no Spark): the checks before decoding
for every format, the column decoders behind one interface, one reason per record in a fixed order,
and the decoder the driver builds from the column specs."""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from airflow_eo.decoding.avro import AvroColumn
from airflow_eo.decoding.decoder import RecordDecoder, precheck, record_decoder
from airflow_eo.spec.columns import REASON_COLUMN, InlineAvro, JsonColumn, RawColumn, RegistryAvro, Source
from airflow_eo.core.errors import ConfigError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import RunIdentity
from tests.unit.decoding.fake_registry import V1, avro

PLAN = BatchPlan("orders", 1, (), RunIdentity("r1"), reader_schemas=())


def batch(values, keys=None, reasons=None) -> pa.RecordBatch:
    columns = {"offset": pa.array(range(len(values)), pa.int64()), "key": pa.array(keys or [None] * len(values),
                                                                                   pa.binary()),
               "value": pa.array(values, pa.binary())}
    if reasons is not None:
        columns[REASON_COLUMN] = pa.array(reasons, pa.string())
    return pa.RecordBatch.from_pydict(columns)


@pytest.mark.parametrize("column, values, expected", [
    (RawColumn(source=Source.VALUE, max_bytes=3), [b"abc", b"abcd", None, b""],
     [None, "value of 4 bytes exceeds max_value_bytes=3", "value is null", None]),
    (JsonColumn(source=Source.VALUE, ddl="id INT"), [b"{}", None], [None, "value is null"]),
    (JsonColumn(source=Source.KEY, ddl="id INT"), [b"{}", None], None),  # a key is never bad before parsing
    (RawColumn(source=Source.VALUE), [None, b"x" * 10_000], None),  # nothing to check
    (InlineAvro(source=Source.VALUE, schema='"long"', max_bytes=1), [b"\x02", b"\x02\x00", None],
     [None, "value of 2 bytes exceeds max_value_bytes=1", "value is null"]),
])
def test_the_checks_before_decoding_apply_to_every_format(column, values, expected):
    found = precheck(pa.array(values, pa.binary()), column)
    assert (found.to_pylist() if found is not None else None) == expected


class Spy:
    """A column decoder (the interface any format plugs into): remembers what it was given."""

    def __init__(self, spec):
        self.spec, self.given = spec, []

    def spark_type(self):
        return LongType()

    def to_arrow(self, values, arrow_type):
        self.given.append(values)
        return pa.array([len(v) if v is not None else None for v in values], arrow_type), \
            [None if v is None or v != b"bad" else f"{self.spec.source.value} is bad" for v in values]


def test_one_reason_per_record_the_first_found_and_bad_values_are_not_decoded():
    value = RawColumn(source=Source.VALUE, max_bytes=4)
    key = InlineAvro(source=Source.KEY, schema='"long"')
    spy = Spy(key)
    decoder = RecordDecoder((value, key), (spy,))
    out = decoder(batch([b"ok", None, b"toolong", b"ok", b"ok"], keys=[b"k", b"bad", b"bad", None, b"k"],
                        reasons=[None, None, None, None, "read step said so"]))
    assert out.schema.names == ["offset", "key", "value", "key_data", REASON_COLUMN]
    assert out.column(REASON_COLUMN).to_pylist() == [
        None, "value is null", "value of 7 bytes exceeds max_value_bytes=4", None, "read step said so"]
    assert spy.given == [[b"k", b"bad", b"bad", None, b"k"]]  # a key is decoded whatever the value's fate
    assert out.column("key_data").to_pylist() == [1, 3, 3, None, 1]
    clean = decoder(batch([b"ok"], keys=[b"bad"]))
    assert clean.column(REASON_COLUMN).to_pylist() == ["key is bad"]


def test_a_value_that_failed_its_checks_is_not_decoded():
    value = InlineAvro(source=Source.VALUE, schema=json.dumps(V1), max_bytes=20)
    decoder = RecordDecoder((value, RawColumn(source=Source.KEY)), (AvroColumn(value, json.dumps(V1)),))
    good, big = avro(V1, {"id": 1, "item": "pen"}), avro(V1, {"id": 2, "item": "x" * 40})
    out = decoder(batch([good, big, None, b"\xff"]))
    assert out.column("data").to_pylist() == [{"id": 1, "item": "pen"}, None, None, None]
    reasons = out.column(REASON_COLUMN).to_pylist()
    assert reasons[:3] == [None, f"value of {len(big)} bytes exceeds max_value_bytes=20", "value is null"]
    assert reasons[3].startswith("value is not decodable as Avro (the inline schema)")


def test_the_decoded_schema_and_a_pickled_decoder_in_a_task():
    value = InlineAvro(source=Source.VALUE, schema='"long"')
    decoder = RecordDecoder((value, RawColumn(source=Source.KEY)), (AvroColumn(value, '"long"'),))
    source = StructType([StructField("offset", LongType()), StructField("value", BinaryType()),
                         StructField(REASON_COLUMN, BinaryType())])
    assert [(f.name, f.dataType.simpleString()) for f in decoder.schema(source).fields] == [
        ("offset", "bigint"), ("value", "binary"), ("data", "bigint"), (REASON_COLUMN, "string")]
    in_task = pickle.loads(pickle.dumps(decoder))
    values = [b"\x02", b"\x04", None]
    assert in_task(batch(values)).equals(decoder(batch(values)))
    assert in_task(batch(values)).column("data").to_pylist() == [1, 2, None]


def test_the_driver_builds_a_decoder_only_where_something_is_decoded_or_checked():
    assert record_decoder((RawColumn(source=Source.VALUE), JsonColumn(source=Source.KEY, ddl="id INT")), None,
                          PLAN) == (None, ())
    checks_only, pins = record_decoder((JsonColumn(source=Source.VALUE, ddl="id INT"), RawColumn(source=Source.KEY)),
                                       None, PLAN)
    assert checks_only is not None and checks_only.decoders == {} and pins == ()
    assert checks_only(batch([None])).column(REASON_COLUMN).to_pylist() == ["value is null"]
    inline, _ = record_decoder((RawColumn(source=Source.VALUE), InlineAvro(source=Source.KEY, schema='"string"')),
                               None, PLAN)
    assert isinstance(inline.decoders[Source.KEY], AvroColumn) and inline.targets == ["key_data"]
    with pytest.raises(ConfigError, match="value_format='avro': Avro without an inline schema needs a Schema Registry"):
        record_decoder((RegistryAvro(source=Source.VALUE, subject="orders-value"), RawColumn(source=Source.KEY)),
                       None, PLAN)
    with pytest.raises(ConfigError, match="recursive"):
        record_decoder((InlineAvro(source=Source.VALUE, schema=json.dumps(
            {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]})),
            RawColumn(source=Source.KEY)), None, PLAN)
