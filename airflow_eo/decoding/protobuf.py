"""Protobuf keys and values decoded into struct columns with Google's runtime, a batch at a time inside Spark tasks.

:class:`ProtobufColumn` is Protobuf's :class:`~airflow_eo.decoding.decoder.ColumnDecoder`: the read
step's :class:`~airflow_eo.decoding.decoder.RecordDecoder` applies it in the task that read each
batch, as Avro's. Each record is parsed by the ``protobuf`` runtime (upb) as a dynamic message of the
reader's message (:mod:`.protobuf_schemas`), and the batch's column is built field by field
(:mod:`.protobuf_types`).

Two sources of schemas (:class:`~airflow_eo.spec.columns.RegistryProtobuf`,
:class:`~airflow_eo.spec.columns.InlineProtobuf`):

- **Schema Registry** (Confluent wire format: magic byte 0, a 4-byte schema id, the message-index
  list as zig-zag varints — a single 0 for the file's first message — then the message). The reader
  is ``message_name`` (or the first message) of the subject's version pinned in the batch's plan.
  A record's writer schema (by its id, fetched once per id and task) says which message it is and
  which fields it has: a field of the reader that the writer lacks reads null (a field added later
  is null for older records); a writer whose field has the number of a reader field but a type that
  does not read the same bytes fails the batch (:class:`~airflow_eo.core.errors.IncompatibleSchemaError`,
  nothing committed); a record of another message than the reader's is a dead letter.
- **An inline schema** (``protobuf_schema``): plain messages, no header.

A record that cannot be decoded (no wire header, an unknown schema id, a message index the writer
schema has not, bytes the runtime cannot parse, a value the column cannot hold) is a dead letter
with its reason. An unreachable registry fails the batch (retryable).

Example::

    >>> column = ProtobufColumn(spec, compile_proto(text))              # doctest: +SKIP
    >>> column.to_arrow([message.SerializeToString(), b"\\xff"], arrow_type)  # doctest: +SKIP
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

from airflow_eo.core.errors import IncompatibleSchemaError
from airflow_eo.decoding.protobuf_schemas import ProtoSchema, registry_schema
from airflow_eo.decoding.protobuf_types import NotDecodable, absent_fields, incompatibility, spark_type, struct_builder
from airflow_eo.decoding.registry import SERIALIZED, WIRE_HEADER_BYTES, WIRE_MAGIC, SchemaRegistry
from airflow_eo.decoding.shared import TaskCache
from airflow_eo.spec.columns import ColumnSpec


_FIRST: tuple[int, ...] = (0,)


class _BadWire(Exception):
    """The message-index list is malformed."""


def message_indexes(raw: bytes, at: int = WIRE_HEADER_BYTES) -> tuple[tuple[int, ...], int]:
    """The wire format's message-index path and where the message starts: a zig-zag varint count
    (0: the first message, ``[0]``), then that many zig-zag varints.

    >>> message_indexes(b"\\x00\\x00\\x00\\x00\\x01" + b"\\x00" + b"body")
    ((0,), 6)
    >>> message_indexes(b"\\x00\\x00\\x00\\x00\\x01" + bytes([4, 2, 0]))   # two indexes: [1, 0]
    ((1, 0), 8)
    """
    def varint(pos: int) -> tuple[int, int]:
        result = shift = 0
        while True:
            if pos >= len(raw) or shift > 63:
                raise _BadWire("the message-index list is cut short")
            byte = raw[pos]
            result |= (byte & 0x7F) << shift
            pos += 1
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1), pos
            shift += 7

    count, at = varint(at)
    if count == 0:
        return (0,), at
    if count < 0 or count > 64:
        raise _BadWire(f"a message-index list of {count} entries")
    indexes = []
    for _ in range(count):
        index, at = varint(at)
        indexes.append(index)
    return tuple(indexes), at


@dataclass(frozen=True)
class _Writer:
    """What one writer (schema id, message indexes) means for the reader: its message's absent fields,
    or the reason its records are dead letters."""

    absent: dict | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ProtobufColumn(TaskCache):
    """Decodes one Kafka column into the struct column of ``schema``'s message ``message_name``: the
    :class:`~airflow_eo.decoding.decoder.ColumnDecoder` of Protobuf. With ``registry`` the bytes are in the
    Confluent wire format; without, plain messages of the reader."""

    spec: ColumnSpec
    schema: ProtoSchema
    message_name: str | None = None
    registry: SchemaRegistry | None = None
    reader_name: str = "the inline schema"  # "orders-value version 3 (schema id 7)"
    reader_id: int | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def source(self) -> str:
        return self.spec.source.value

    @property
    def reader(self):
        """The reader's message descriptor."""
        return self.schema.message(self.message_name, self.spec.source.option("message_name"))

    def check(self) -> None:
        """Raise a one-line ConfigError unless the reader message can be a column (found, not recursive)."""
        spark_type(self.reader)

    def spark_type(self):
        return spark_type(self.reader)

    def to_arrow(self, values: list, arrow_type) -> tuple:
        """(the Arrow column of the decoded values, dead-letter reason or None per value)."""
        import pyarrow as pa

        reader = self.reader
        parse = self._message_class(reader).FromString
        messages: list = [None] * len(values)
        reasons: list = [None] * len(values)
        groups: dict = {}  # writer key → the positions of its records
        collecting = gc.isenabled()
        gc.disable()  # many small objects, no cycles: the collector would rescan the batch (as for Avro)
        try:
            for i, raw in enumerate(values):
                if raw is None:
                    continue
                key, body, reason = self._writer_of(raw)
                if reason is None:
                    try:
                        messages[i] = parse(body)
                    except Exception as exc:  # DecodeError: truncated, wrong wire types, bad UTF-8
                        reason = (f"{self.source} is not decodable as Protobuf {reader.full_name} "
                                  f"({self._which(key)}): {type(exc).__name__}: {str(exc)[:200]}")
                if reason is not None:
                    reasons[i] = reason
                    continue
                groups.setdefault(key, []).append(i)
        finally:
            if collecting:
                gc.enable()
        nulls = [i for i, m in enumerate(messages) if m is None]
        parts, order = [], []
        for key, positions in groups.items():
            parts.append(self._build(key, [messages[i] for i in positions], arrow_type, positions, reasons))
            order.extend(positions)
        if nulls:
            parts.append(pa.nulls(len(nulls), arrow_type))
            order.extend(nulls)
        if not parts:
            return pa.nulls(0, arrow_type), reasons
        column = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
        if order != list(range(len(values))):
            inverse = [0] * len(order)
            for at, position in enumerate(order):
                inverse[position] = at
            column = column.take(pa.array(inverse, pa.int64()))
        return column, reasons

    def _build(self, key, messages: list, arrow_type, positions: list, reasons: list):
        """The column of one writer's records; a record the column cannot hold becomes a dead letter."""
        import pyarrow as pa

        build = self._builder(key, arrow_type)
        try:
            return build(messages)
        except (NotDecodable, pa.ArrowException, ValueError, TypeError, OverflowError):
            column = []
            for position, message in zip(positions, messages):
                try:
                    column.append(build([message]))
                except (NotDecodable, pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                    reasons[position] = f"decoded Protobuf record does not fit its column type: {str(exc)[:200]}"
                    column.append(pa.nulls(1, arrow_type))
            return pa.concat_arrays(column)

    def _builder(self, key, arrow_type):
        cached = self._cache.get(("builder", key))
        if cached is None:
            writer = self._cache.get(("writer", key))
            cached = struct_builder(self.reader, arrow_type, writer.absent if writer else None, self.schema.pool)
            self._cache[("builder", key)] = cached
        return cached

    def _message_class(self, message):
        from google.protobuf import message_factory

        found = self._cache.get(("class", message.full_name))
        if found is None:
            found = self._cache[("class", message.full_name)] = message_factory.GetMessageClass(message)
        return found

    def _which(self, key) -> str:
        return self.reader_name if key is None else f"writer schema id {key[0]}"

    def _writer_of(self, raw: bytes) -> tuple:
        """(writer key or None, message bytes, reason if the record cannot be read)."""
        if self.registry is None:
            return None, raw, None
        if len(raw) < WIRE_HEADER_BYTES + 1 or raw[0] != WIRE_MAGIC:
            return None, b"", (f"{self.source} is not in the Confluent wire format (magic byte 0, a 4-byte schema "
                               f"id and the message indexes; got first byte {raw[0] if raw else 'none'})")
        schema_id = int.from_bytes(raw[1:WIRE_HEADER_BYTES], "big")
        if raw[WIRE_HEADER_BYTES] == 0:  # the file's first message: the common case, one byte
            indexes, start = _FIRST, WIRE_HEADER_BYTES + 1
        else:
            try:
                indexes, start = message_indexes(raw)
            except _BadWire as exc:
                return None, b"", f"{self.source} is not in the Confluent wire format: {exc}"
        key = (schema_id, indexes)
        writer = self._cache.get(("writer", key))
        if writer is None:
            writer = self._cache[("writer", key)] = self._resolve(schema_id, indexes)
        return key, raw[start:], writer.reason

    def _resolve(self, schema_id: int, indexes: tuple[int, ...]) -> _Writer:
        """What records of writer schema ``schema_id``'s message at ``indexes`` are for the reader."""
        assert self.registry is not None
        reader = self.reader
        schema: ProtoSchema | None = self.schema if schema_id == self.reader_id else self._cache.get(("schema", schema_id))
        if schema is None:  # fetched once per id and task
            found = self.registry.schema(schema_id, fmt=SERIALIZED)
            if found is None:
                return _Writer(reason=f"unknown schema id {schema_id} (not in the Schema Registry {self.registry.url})")
            if found.schema_type != "PROTOBUF":
                return _Writer(reason=f"{self.source} was written with schema id {schema_id}, a {found.schema_type} "
                                      "schema, not Protobuf")
            schema = self._cache[("schema", schema_id)] = registry_schema(found, self.registry,
                                                                          f"writer schema id {schema_id}")
        message = schema.message_at(indexes)
        if message is None:
            return _Writer(reason=f"{self.source} names message {list(indexes)}, which writer schema id {schema_id} "
                                  "does not have")
        if message.full_name != reader.full_name:
            return _Writer(reason=f"{self.source} is a {message.full_name} (writer schema id {schema_id}), not the "
                                  f"reader's {reader.full_name}")
        if schema is self.schema:
            return _Writer()
        why = incompatibility(reader, message)
        if why is not None:
            raise IncompatibleSchemaError(
                f"writer schema id {schema_id} cannot be read as {self.reader_name}: {why}; nothing was committed: "
                "make the change compatible (a new field gets a new number) or pin the reader schema version")
        return _Writer(absent=absent_fields(reader, message))
