"""Avro timestamps, dates and decimals converted a column at a time in Arrow.

fastavro turns each timestamp into a ``datetime`` and each decimal into a ``Decimal``, and
Arrow then turns them back into integers: for a record with a timestamp and a decimal that
is a third of the decode time (``./dev bench --only decode``). When every record of a batch
was written with the reader schema itself, :class:`airflow_eo.decoding.avro.AvroColumn` reads
them with those logical types removed (integers and bytes) and this module converts the
finished Arrow column: timestamps and dates by a cast, decimals from their big-endian two's
complement bytes into decimal128 buffers.

A value the column cannot hold (a decimal wider than its precision, a timestamp outside
years 1-9999, which Python's ``datetime`` and Spark cannot hold either) raises
:class:`NotColumnar`: the caller decodes that batch value by value, which makes exactly that
record a dead letter.

Example::

    >>> to_column([{"at": 1000}], {"type": "record", "name": "R", "fields": [
    ...     {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]},
    ...     pa.struct([("at", pa.timestamp("us", tz="UTC"))]))            # doctest: +SKIP
"""

from __future__ import annotations

import pyarrow as pa

from airflow_eo.decoding.avro_types import named_types, resolve

_MIN_MS, _MAX_MS = -62_135_596_800_000, 253_402_300_799_999  # 0001-01-01 .. 9999-12-31 (UTC)
_MIN_DAY, _MAX_DAY = -719_162, 2_932_896


class NotColumnar(Exception):
    """A value the column cannot hold: decode this batch value by value instead."""


def raw_type(schema, target: pa.DataType, names: dict | None = None) -> pa.DataType:
    """``target`` with each columnar logical type replaced by what fastavro returns without it."""
    names = named_types(schema) if names is None else names
    schema = resolve(schema, names)
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if logical == "decimal":
        return pa.binary()
    if logical == "date":
        return pa.int32()
    if logical is not None and pa.types.is_timestamp(target):
        return pa.int64()
    if pa.types.is_struct(target):
        fields = {f["name"]: f["type"] for f in schema["fields"]}
        return pa.struct([pa.field(f.name, raw_type(fields[f.name], f.type, names), f.nullable) for f in target])
    if pa.types.is_map(target):
        return pa.map_(target.key_type, raw_type(schema["values"], target.item_type, names))
    if pa.types.is_list(target):
        item = target.value_field
        return pa.list_(pa.field(item.name, raw_type(schema["items"], item.type, names), item.nullable))
    return target


def to_column(records: list, schema, target: pa.DataType) -> pa.Array:
    """The Arrow column of ``records`` (decoded without their columnar logical types)."""
    names = named_types(schema)
    return convert(pa.array(records, type=raw_type(schema, target, names)), schema, target, names)


def convert(array: pa.Array, schema, target: pa.DataType, names: dict) -> pa.Array:
    schema = resolve(schema, names)
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if logical == "decimal":
        return _decimal(array, target)
    if logical == "date":
        _check_range(array, _MIN_DAY, _MAX_DAY, "date")
        return array.cast(target)
    if logical is not None and pa.types.is_timestamp(target):
        return _timestamp(array, logical, target)
    if array.type == target:
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target):
        fields = {f["name"]: f["type"] for f in schema["fields"]}
        children = [convert(array.field(f.name), fields[f.name], f.type, names) for f in target]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_map(target):
        items = convert(array.items, schema["values"], target.item_type, names)
        return pa.MapArray.from_arrays(array.offsets, array.keys, items, type=target, mask=mask)
    if pa.types.is_list(target):
        values = convert(array.values, schema["items"], target.value_type, names)
        return pa.ListArray.from_arrays(array.offsets, values, type=target, mask=mask)
    return array.cast(target)


def _check_range(array: pa.Array, low: int, high: int, what: str) -> None:
    import pyarrow.compute as pc

    if array.null_count == len(array):
        return
    bounds = pc.min_max(array)
    if bounds["min"].as_py() < low or bounds["max"].as_py() > high:
        raise NotColumnar(f"a {what} outside years 1-9999")


def _timestamp(array: pa.Array, logical: str, target: pa.DataType) -> pa.Array:
    millis = logical.endswith("millis")
    scale = 1 if millis else 1000
    _check_range(array, _MIN_MS * scale, _MAX_MS * scale, "timestamp")
    unit = "ms" if millis else "us"
    return array.cast(pa.timestamp(unit, tz=target.tz)).cast(target)


def _decimal(array: pa.Array, target: pa.DataType) -> pa.Array:
    """decimal128 from Avro's unscaled big-endian two's complement bytes (one pass)."""
    limit = 10 ** target.precision
    zero = bytes(16)
    chunks = []
    for raw in array.to_pylist():
        if raw is None:
            chunks.append(zero)
            continue
        unscaled = int.from_bytes(raw, "big", signed=True)
        if not -limit < unscaled < limit:
            raise NotColumnar(f"a decimal wider than {target}")
        chunks.append(unscaled.to_bytes(16, "little", signed=True))
    validity = array.buffers()[0] if array.null_count else None
    if array.offset:  # a sliced validity bitmap cannot be reused as is
        validity = pa.array([v is not None for v in array.to_pylist()]).buffers()[1] if array.null_count else None
    return pa.Array.from_buffers(target, len(array), [validity, pa.py_buffer(b"".join(chunks))], array.null_count)
