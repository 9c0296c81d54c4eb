"""Avro keys and values decoded into struct columns with fastavro, a batch at a time inside Spark tasks.

Spark's own ``from_avro`` lives in the spark-avro jar, which cannot be installed here, so
the records are decoded in the executors' Python workers with **fastavro**, one Arrow batch
at a time, in the task that read the batch (:class:`AvroColumn`, one
:class:`~airflow_eo.decoding.decoder.ColumnDecoder`, applied by the read step's
:class:`~airflow_eo.decoding.decoder.RecordDecoder`): per batch one pass over the values,
writer schemas fetched once per schema id and task
(:class:`airflow_eo.decoding.registry.SchemaRegistry`), one Arrow conversion into the column's type.

Two sources of schemas (:class:`~airflow_eo.spec.columns.RegistryAvro`, :class:`~airflow_eo.spec.columns.InlineAvro`):

- **Schema Registry** (Confluent wire format: magic byte 0, 4-byte schema id, Avro body).
  Each record is read with the schema it was written with and *resolved* to the reader
  schema (Avro schema resolution): the subject's version pinned in the batch's plan
  (:mod:`airflow_eo.decoding.reader_schemas`). A new optional field in the reader schema is a
  new nullable column (null for older records); a writer schema that cannot be resolved
  to the reader schema fails the batch (:class:`IncompatibleSchemaError`), nothing committed.
- **An inline schema** (plain Avro binary, no header): writer and reader are that schema.

A record that cannot be decoded (no wire header, an unknown schema id, a truncated or
undecodable body, trailing bytes) is a dead letter with its reason; a null or too large value
never gets here (the read step's checks: :func:`airflow_eo.decoding.decoder.precheck`). An
unreachable registry fails the batch (retryable). Type mapping: :func:`.avro_types.spark_type`.

Example::

    >>> col = AvroColumn(InlineAvro(source=Source.VALUE, schema='"long"'), '"long"')
    >>> col.decode([b"\\x02", None, b"\\x02\\x00"])
    ([1, None, None], [None, None, 'value has 1 bytes after its Avro record (the inline schema)'])
"""

from __future__ import annotations

import gc
import io
import json
from dataclasses import dataclass
from functools import lru_cache

from airflow_eo.decoding.avro_columns import NotColumnar, to_column
from airflow_eo.decoding.avro_types import canonical, converter, is_columnar, parse, spark_type
from airflow_eo.decoding.registry import WIRE_HEADER_BYTES, WIRE_MAGIC, SchemaRegistry
from airflow_eo.decoding.shared import fitted_array
from airflow_eo.core.errors import IncompatibleSchemaError
from airflow_eo.spec.columns import ColumnSpec, InlineAvro, Source  # noqa: F401 - Source, InlineAvro: the example


@dataclass(frozen=True)
class AvroColumn:
    """Decodes one Kafka column (``spec.source``) into a struct column: the
    :class:`~airflow_eo.decoding.decoder.ColumnDecoder` of Avro.

    With ``registry`` the bytes are in the Confluent wire format and each record is resolved
    from its writer schema to ``reader_schema``; without, they are plain Avro of ``reader_schema``.
    """

    spec: ColumnSpec
    reader_schema: str
    registry: SchemaRegistry | None = None
    reader_name: str = "the inline schema"  # for messages: "orders-value version 3 (schema id 7)"

    def __post_init__(self):  # one text per schema: the same parsed object for reader and writer
        object.__setattr__(self, "reader_schema", canonical(self.reader_schema))

    @property
    def source(self) -> str:
        return self.spec.source.value

    def spark_type(self):
        return spark_type(json.loads(self.reader_schema))

    def to_arrow(self, values: list, arrow_type) -> tuple:
        """(the Arrow column of the decoded values, dead-letter reason or None per value).

        A batch written with the reader schema itself is decoded without its timestamps', dates'
        and decimals' logical types and those are converted in Arrow (:mod:`.avro_columns`);
        any other batch, value by value."""
        if _columnar(self.reader_schema):
            try:
                records, reasons = self.decode(values, columnar=True)
                return to_column(records, json.loads(self.reader_schema), arrow_type), reasons
            except NotColumnar:  # an older writer schema, or a value the column cannot hold
                pass
        records, reasons = self.decode(values)
        return fitted_array(records, reasons, arrow_type, "Avro"), reasons

    def decode(self, values: list, columnar: bool = False) -> tuple[list, list]:
        """(decoded records or None, dead-letter reason or None) for each raw value (None: no record,
        no reason); ``columnar`` leaves timestamps, dates and decimals as integers and bytes
        (:func:`.avro_columns.to_column`)."""
        reader = parse(self.reader_schema, columnar)
        convert = None if columnar else converter(json.loads(self.reader_schema))
        records: list = []
        reasons: list[str | None] = []
        # the decoded records hold no reference cycles; with the collector on, each new dict
        # makes it rescan the growing batch (measured: half the decode time)
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._decode_into(values, reader, convert, records, reasons, columnar)
        finally:
            if collecting:
                gc.enable()
        return records, reasons

    def _decode_into(self, values: list, reader, convert, records: list, reasons: list, columnar: bool) -> None:
        from fastavro import schemaless_reader
        from fastavro.read import SchemaResolutionError

        writers: dict = {}
        for raw in values:
            record, reason = None, None
            if raw is not None:
                writer, body, schema_id, reason = self._writer_of(raw, reader, writers, columnar)
                if columnar and writer is not None and writer is not reader:
                    raise NotColumnar(f"writer schema id {schema_id} is not the reader schema")
                if reason is None:
                    try:
                        stream = io.BytesIO(body)
                        record = schemaless_reader(stream, writer, None if writer is reader else reader)
                        if stream.tell() != len(body):
                            record, reason = None, (f"{self.source} has {len(body) - stream.tell()} bytes after "
                                                    f"its Avro record ({self._which(schema_id)})")
                    except SchemaResolutionError as exc:
                        raise IncompatibleSchemaError(
                            f"{self._which(schema_id)} cannot be read as {self.reader_name}: "
                            f"{str(exc).splitlines()[0]}; nothing was committed: make the change compatible "
                            "(e.g. give a new field a default) or pin the reader schema version") from exc
                    except Exception as exc:  # truncated or corrupt body
                        reason = (f"{self.source} is not decodable as Avro ({self._which(schema_id)}): "
                                  f"{type(exc).__name__}: {str(exc)[:200]}")
                if record is not None and convert is not None:
                    record = convert(record)
            records.append(record)
            reasons.append(reason)

    def _which(self, schema_id: int | None) -> str:
        return self.reader_name if schema_id is None else f"writer schema id {schema_id}"

    def _writer_of(self, raw: bytes, reader, writers: dict, columnar: bool = False):
        """(writer schema, Avro body, schema id, reason if the record cannot be read);
        ``writers`` keeps the parsed writer schema of each id for the batch."""
        if self.registry is None:
            return reader, raw, None, None
        if len(raw) < WIRE_HEADER_BYTES or raw[0] != WIRE_MAGIC:
            return None, b"", None, (f"{self.source} is not in the Confluent wire format (magic byte 0 and a "
                                     f"4-byte schema id; got first byte {raw[0] if raw else 'none'})")
        schema_id = int.from_bytes(raw[1:WIRE_HEADER_BYTES], "big")
        if schema_id in writers:
            return writers[schema_id], raw[WIRE_HEADER_BYTES:], schema_id, None
        text = self.registry.writer_schema(schema_id)
        if text is None:
            return None, b"", schema_id, f"unknown schema id {schema_id} (not in the Schema Registry {self.registry.url})"
        writers[schema_id] = parse(canonical(text), columnar)  # the reader's own text: the reader itself
        return writers[schema_id], raw[WIRE_HEADER_BYTES:], schema_id, None


@lru_cache(maxsize=64)
def _columnar(reader_schema: str) -> bool:
    return is_columnar(json.loads(reader_schema))
