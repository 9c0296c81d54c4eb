"""Protobuf messages → column types, decoded messages → Arrow columns, and what a writer's message lacks.

No I/O. The descriptors come from :mod:`.protobuf_schemas`; the records are the ``protobuf``
runtime's dynamic messages, parsed by :mod:`.protobuf`. Columns are built a field at a time over
a whole batch (each message's set fields from one ``ListFields()`` call, lists flattened once),
not record by record into dicts.

==================================================  =========================================
Protobuf                                            Spark / Arrow / Delta
==================================================  =========================================
bool, string, bytes                                 boolean, string, binary
int32, sint32, sfixed32                             int
int64, sint64, sfixed64, uint32, fixed32            bigint
uint64, fixed64                                     decimal(20, 0)
float, double                                       float, double
enum                                                string (the value's name; an unknown number as text)
message                                             struct
repeated T                                          array<T>
map<K, V>                                           map<K, V>
oneof                                               each member a nullable field (null unless set)
google.protobuf.Timestamp                           timestamp (UTC)
google.protobuf.Duration                            bigint (microseconds)
google.protobuf.*Value (wrappers)                   the wrapped scalar, nullable
google.protobuf.Struct, Value, ListValue, Any,      string: the value's JSON (Protobuf's JSON mapping)
Empty, FieldMask
==================================================  =========================================

Presence follows the schema (proto3): a scalar without ``optional`` reads its default when
absent (0, "", false, the enum's first value), a field with presence (``optional``, a oneof
member, a message, a wrapper) reads null. A field the record's **writer** schema does not have
reads null whatever its presence (:func:`absent_fields`): a field added later is null for older
records. A recursive message cannot be a column: refused when the schema is checked.

Example::

    >>> spark_type(descriptor).simpleString()                                   # doctest: +SKIP
    'struct<id:bigint,status:string,at:timestamp>'
"""

from __future__ import annotations

import json
from typing import Any, Callable

from airflow_eo.core.errors import ConfigError

# FieldDescriptor.TYPE_* (stable numbers of descriptor.proto)
DOUBLE, FLOAT, INT64, UINT64, INT32, FIXED64, FIXED32, BOOL, STRING, GROUP, MESSAGE, BYTES, UINT32, ENUM, \
    SFIXED32, SFIXED64, SINT32, SINT64 = range(1, 19)
TYPE_NAMES = {DOUBLE: "double", FLOAT: "float", INT64: "int64", UINT64: "uint64", INT32: "int32", FIXED64: "fixed64",
              FIXED32: "fixed32", BOOL: "bool", STRING: "string", GROUP: "group", MESSAGE: "message", BYTES: "bytes",
              UINT32: "uint32", ENUM: "enum", SFIXED32: "sfixed32", SFIXED64: "sfixed64", SINT32: "sint32",
              SINT64: "sint64"}
# the types that read each other's bytes as the same numbers (Protobuf's compatible changes)
_WIRE_GROUPS = ({INT32, INT64, UINT32, UINT64, BOOL, ENUM}, {SINT32, SINT64}, {FIXED32, SFIXED32},
                {FIXED64, SFIXED64}, {STRING, BYTES})
TIMESTAMP, DURATION = "google.protobuf.Timestamp", "google.protobuf.Duration"
WRAPPERS = {"google.protobuf.DoubleValue": DOUBLE, "google.protobuf.FloatValue": FLOAT,
            "google.protobuf.Int64Value": INT64, "google.protobuf.UInt64Value": UINT64,
            "google.protobuf.Int32Value": INT32, "google.protobuf.UInt32Value": UINT32,
            "google.protobuf.BoolValue": BOOL, "google.protobuf.StringValue": STRING,
            "google.protobuf.BytesValue": BYTES}
AS_JSON = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue", "google.protobuf.Any",
           "google.protobuf.Empty", "google.protobuf.FieldMask"}
_MIN_SECONDS, _MAX_SECONDS = -62_135_596_800, 253_402_300_799  # 0001-01-01 .. 9999-12-31 (UTC)


class NotDecodable(Exception):
    """A value the column cannot hold (a timestamp outside years 1-9999): that record is a dead letter."""


def _spark():
    from pyspark.sql import types as T

    return T


def _scalar_type(kind: int):
    T = _spark()
    if kind in (INT32, SINT32, SFIXED32):
        return T.IntegerType()
    if kind in (INT64, SINT64, SFIXED64, UINT32, FIXED32):
        return T.LongType()
    if kind in (UINT64, FIXED64):
        return T.DecimalType(20, 0)
    return {DOUBLE: T.DoubleType, FLOAT: T.FloatType, BOOL: T.BooleanType, STRING: T.StringType,
            BYTES: T.BinaryType, ENUM: T.StringType}[kind]()


def is_map(field) -> bool:
    return field.type == MESSAGE and field.message_type.GetOptions().map_entry


def spark_type(message, stack: tuple = ()):
    """The Spark struct type of a message descriptor (every field nullable: a dead letter has no value)."""
    T = _spark()
    if message.full_name in stack:
        raise ConfigError(f"Protobuf message {message.full_name!r} is recursive: a Delta column cannot hold it; "
                          "flatten it in the producer's schema (or read the field as bytes)")
    inner = (*stack, message.full_name)
    return T.StructType([T.StructField(f.name, _field_type(f, inner), True) for f in message.fields])


def _field_type(field, stack: tuple):
    T = _spark()
    if is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return T.MapType(_element_type(key, stack), _element_type(value, stack), True)
    element = _element_type(field, stack)
    return T.ArrayType(element, True) if field.is_repeated else element


def _element_type(field, stack: tuple):
    T = _spark()
    if field.type == GROUP:
        raise ConfigError(f"Protobuf field {field.full_name!r} is a proto2 group, which airflow-eo does not read")
    if field.type != MESSAGE:
        return _scalar_type(field.type)
    name = field.message_type.full_name
    if name == TIMESTAMP:
        return T.TimestampType()
    if name == DURATION:
        return T.LongType()
    if name in WRAPPERS:
        return _scalar_type(WRAPPERS[name])
    if name in AS_JSON:
        return T.StringType()
    return spark_type(field.message_type, stack)


def type_name(field) -> str:
    """How messages name a field's type (``repeated shop.Line``, ``int64``)."""
    kind = field.message_type.full_name if field.type == MESSAGE else (
        field.enum_type.full_name if field.type == ENUM else TYPE_NAMES[field.type])
    return ("repeated " if field.is_repeated and not is_map(field) else "") + kind


def incompatibility(reader, writer, seen: set | None = None) -> str | None:
    """Why records of message ``writer`` cannot be read as ``reader`` (a field whose number both have
    with types that do not read each other's bytes), or None: fields only one side has are fine."""
    seen = set() if seen is None else seen
    if (reader.full_name, writer.full_name) in seen:
        return None
    seen.add((reader.full_name, writer.full_name))
    for field in reader.fields:
        other = writer.fields_by_number.get(field.number)
        if other is None:
            continue
        same = field.type == other.type or any(field.type in g and other.type in g for g in _WIRE_GROUPS)
        if field.is_repeated != other.is_repeated or not same:
            return (f"field {reader.full_name}.{field.name} (number {field.number}) is {type_name(other)} in the "
                    f"writer schema, {type_name(field)} in the reader schema")
        if field.type == MESSAGE:
            why = incompatibility(field.message_type, other.message_type, seen)
            if why is not None:
                return why
    return None


def absent_fields(reader, writer, seen: tuple = ()) -> dict | None:
    """The reader's fields that the writer's message lacks, as a tree: name → None (the writer has no
    such field number) or the tree of a message field both have; None when the writer lacks nothing."""
    if writer is None or reader is writer:
        return None
    tree: dict = {}
    for field in reader.fields:
        other = writer.fields_by_number.get(field.number)
        if other is None:
            tree[field.name] = None
        elif field.type == MESSAGE and other.type == MESSAGE and reader.full_name not in seen:
            sub = absent_fields(field.message_type, other.message_type, (*seen, reader.full_name))
            if sub:
                tree[field.name] = sub
    return tree or None


# -- columns ---------------------------------------------------------------------------------------
def _pa():
    import pyarrow as pa

    return pa


def _scalars(kind: int, arrow_type) -> Callable[[list], Any]:
    pa = _pa()
    if kind in (UINT64, FIXED64):
        return lambda values: pa.array(values, pa.uint64()).cast(arrow_type)
    return lambda values: pa.array(values, arrow_type)


def _enum_names(enum) -> Callable[[list], Any]:
    pa = _pa()
    names = {v.number: v.name for v in enum.values}
    return lambda values: pa.array([None if v is None else names.get(v, str(v)) for v in values], pa.string())


def _micros(seconds: int, nanos: int) -> int:
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        raise NotDecodable(f"a Timestamp of {seconds} seconds is outside years 1-9999")
    return seconds * 1_000_000 + nanos // 1000


def element_builder(field, arrow_type, absent: dict | None, pool) -> Callable[[list], Any]:
    """Builds the Arrow column of a list of a field's element values (scalars, or messages; None: null)."""
    pa = _pa()
    if field.type == ENUM:
        return _enum_names(field.enum_type)
    if field.type != MESSAGE:
        return _scalars(field.type, arrow_type)
    name = field.message_type.full_name
    if name == TIMESTAMP:
        return lambda ms: pa.array([None if m is None else _micros(m.seconds, m.nanos) for m in ms],
                                   pa.int64()).cast(arrow_type)
    if name == DURATION:
        return lambda ms: pa.array([None if m is None else m.seconds * 1_000_000 + int(m.nanos / 1000) for m in ms],
                                   pa.int64())
    if name in WRAPPERS:
        values = _scalars(WRAPPERS[name], arrow_type)
        return lambda ms: values([None if m is None else m.value for m in ms])
    if name in AS_JSON:
        return lambda ms: pa.array([None if m is None else _json(m, pool) for m in ms], pa.string())
    return struct_builder(field.message_type, arrow_type, absent, pool)


def _json(message, pool) -> str:
    from google.protobuf import json_format

    try:
        return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=None,
                                         descriptor_pool=pool)
    except (TypeError, KeyError, json_format.Error):  # an Any of a type the schema does not know
        import base64

        return json.dumps({"@type": getattr(message, "type_url", ""),
                           "value": base64.b64encode(getattr(message, "value", b"")).decode()})


def _default(field):
    """What a field reads in a message that did not set it (before its column is built): None where it
    has presence, ``[]`` for a repeated field, ``{}`` for a map, else the scalar's default."""
    if is_map(field):
        return {}
    if field.is_repeated:
        return []
    if field.has_presence:
        return None
    return field.default_value


def values_builder(field, arrow_type, absent: dict | None, pool) -> Callable[[list], Any]:
    """Builds a field's column from its value in each record (a scalar, a message or None, a repeated
    field's or a map's container)."""
    pa = _pa()
    if is_map(field):
        key_f, value_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        keys = element_builder(key_f, arrow_type.key_type, None, pool)
        items = element_builder(value_f, arrow_type.item_type, (absent or {}).get("value"), pool)

        def build_map(maps: list):
            offsets, ks, vs, at = [0], [], [], 0
            for entries in maps:
                if entries:
                    for k in entries:
                        ks.append(k)
                        vs.append(entries[k])
                    at += len(entries)
                offsets.append(at)
            return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys(ks), items(vs), type=arrow_type)
        return build_map
    if field.is_repeated:
        element = element_builder(field, arrow_type.value_type, absent, pool)

        def build_list(lists: list):
            offsets, at = [0], 0
            for one in lists:
                at += len(one)
                offsets.append(at)
            return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), element([x for one in lists for x in one]),
                                            type=arrow_type)
        return build_list
    return element_builder(field, arrow_type, absent, pool)


def struct_builder(message, arrow_type, absent: dict | None, pool) -> Callable[[list], Any]:
    """Builds the struct column of ``message`` from a list of messages (None: null); ``absent``: the
    fields the writer lacks (:func:`absent_fields`), null in every row. Each message's set fields come
    from one ``ListFields()`` call (the runtime's, in C), not a lookup per field."""
    pa = _pa()
    absent = absent or {}
    types = {f.name: f.type for f in arrow_type}
    gone = [f for f in message.fields if f.name in absent and absent[f.name] is None]
    kept = [f for f in message.fields if f not in gone]
    position = {f.number: k for k, f in enumerate(kept)}
    defaults = [_default(f) for f in kept]
    columns = [values_builder(f, types[f.name], absent.get(f.name), pool) for f in kept]

    def build(messages: list):
        count = len(messages)
        values = [[default] * count for default in defaults]
        nulls = False
        for i, m in enumerate(messages):
            if m is None:
                nulls = True
                continue
            for fd, value in m.ListFields():
                at = position.get(fd.number)
                if at is not None:  # an extension, or a field the reader has and the writer lacks
                    values[at][i] = value
        children = {f.name: build_column(values[k]) for k, (f, build_column) in enumerate(zip(kept, columns))}
        children.update({f.name: pa.nulls(count, types[f.name]) for f in gone})
        mask = pa.array([m is None for m in messages], pa.bool_()) if nulls else None
        return pa.StructArray.from_arrays([children[f.name] for f in arrow_type], fields=list(arrow_type), mask=mask)
    return build
