"""Avro keys and values decoded into struct columns, a batch at a time inside Spark tasks.

Spark's own ``from_avro`` lives in the spark-avro jar, which cannot be installed here, so
the records are decoded in the executors' Python workers with **fastavro**, one Arrow batch
at a time, in the task that read the batch (:class:`AvroDecoder`, applied by the read step):
per batch one pass over the values, writer schemas fetched once per schema id and task
(:class:`airflow_eo.registry.SchemaRegistry`), one Arrow conversion into the column's type.

Two sources of schemas:

- **Schema Registry** (Confluent wire format: magic byte 0, 4-byte schema id, Avro body).
  Each record is read with the schema it was written with and *resolved* to the reader
  schema (Avro schema resolution): by default the latest version of the subject
  ``<topic>-value``, or a pinned version. A new optional field in the reader schema is a
  new nullable column (null for older records); a writer schema that cannot be resolved
  to the reader schema fails the batch (:class:`IncompatibleSchemaError`), nothing committed.
- **An inline schema** (plain Avro binary, no header): writer and reader are that schema.

A record that cannot be decoded (null value, too large, no wire header, an unknown schema id,
a truncated or undecodable body, trailing bytes) is a dead letter with its reason; an
unreachable registry fails the batch (retryable). Type mapping: :func:`spark_type`.

Example::

    >>> col = AvroColumn("value", "data", reader_schema='{"type": "record", ...}')   # doctest: +SKIP
    >>> col.decode([b"\\x02..."])                                                      # doctest: +SKIP
    ([{'id': 1, ...}], [None])
"""

from __future__ import annotations

import gc
import io
import json
from dataclasses import dataclass
from functools import lru_cache

from airflow_eo.avro_schema import canonical, check_schema, converter, is_columnar, parse, spark_type
from airflow_eo.driver.avro_columns import NotColumnar, to_column
from airflow_eo.errors import ConfigError, IncompatibleSchemaError
from airflow_eo.registry import WIRE_HEADER_BYTES, WIRE_MAGIC, SchemaRegistry

DATA_COLUMN_NAME, KEY_DATA_COLUMN_NAME = "data", "key_data"  # the columns decode.py documents
REASON_COLUMN = "_airflow_eo_reason"  # a record's dead-letter reason; null when it decoded


@dataclass(frozen=True)
class AvroColumn:
    """How one Kafka column (``value`` or ``key``) is decoded into a struct column (``target``).

    With ``registry`` the bytes are in the Confluent wire format and each record is resolved
    from its writer schema to ``reader_schema``; without, they are plain Avro of ``reader_schema``.
    """

    source: str
    target: str
    reader_schema: str
    registry: SchemaRegistry | None = None
    reader_name: str = "the inline schema"  # for messages: "orders-value version 3"
    max_bytes: int | None = None
    null_is_bad: bool = True

    def __post_init__(self):  # one text per schema: the same parsed object for reader and writer
        object.__setattr__(self, "reader_schema", canonical(self.reader_schema))

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
        return _to_arrow(records, reasons, arrow_type), reasons

    def decode(self, values: list, columnar: bool = False) -> tuple[list, list]:
        """(decoded records or None, dead-letter reason or None) for each raw value; ``columnar``
        leaves timestamps, dates and decimals as integers and bytes (:func:`.avro_columns.to_column`)."""
        reader = parse(self.reader_schema, columnar)
        convert = None if columnar else converter(json.loads(self.reader_schema))
        records, reasons = [], []
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
            if raw is None:
                reason = f"{self.source} is null" if self.null_is_bad else None
            elif self.max_bytes and len(raw) > self.max_bytes:
                reason = f"{self.source} of {len(raw)} bytes exceeds max_value_bytes={self.max_bytes}"
            else:
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


class AvroDecoder:
    """Adds each Avro column's struct, and the record's dead-letter reason, to Arrow batches of
    Kafka records. Picklable: the read step applies it inside the task that read the batch
    (:func:`airflow_eo.driver.source.read_plan`), so the raw values cross into Python once.

    >>> decoder = AvroDecoder((AvroColumn("value", "data", '"long"'),))      # doctest: +SKIP
    >>> decoder.schema(kafka_struct)                                         # doctest: +SKIP
    """

    def __init__(self, columns: tuple[AvroColumn, ...]):
        from airflow_eo.compat import arrow_type_of

        self.columns = tuple(columns)
        self.types = [c.spark_type() for c in self.columns]
        self.arrow_types = [arrow_type_of(t) for t in self.types]

    def schema(self, source):
        """The Spark schema of decoded batches, from the source's (a StructType)."""
        from pyspark.sql.types import StringType, StructField, StructType

        kept = [f for f in source.fields if f.name != REASON_COLUMN]
        return StructType([*kept, *(StructField(c.target, t, True) for c, t in zip(self.columns, self.types)),
                           StructField(REASON_COLUMN, StringType(), True)])

    def __call__(self, batch):
        """One decoded batch; an earlier reason (already in the batch) wins."""
        import pyarrow as pa

        names = [n for n in batch.schema.names if n != REASON_COLUMN]
        has_reason = REASON_COLUMN in batch.schema.names
        reasons = batch.column(REASON_COLUMN).to_pylist() if has_reason else [None] * batch.num_rows
        decoded = []
        for column, arrow_type in zip(self.columns, self.arrow_types):
            array, why = column.to_arrow(batch.column(column.source).to_pylist(), arrow_type)
            decoded.append(array)
            reasons = [r if r is not None else w for r, w in zip(reasons, why)]
        return pa.RecordBatch.from_arrays(
            [batch.column(n) for n in names] + decoded + [pa.array(reasons, pa.string())],
            names=[*names, *(c.target for c in self.columns), REASON_COLUMN])


@lru_cache(maxsize=64)
def _columnar(reader_schema: str) -> bool:
    return is_columnar(json.loads(reader_schema))


def _to_arrow(records: list, reasons: list, arrow_type):
    """One conversion per batch; a record that does not fit its column (an out-of-range decimal,
    a date beyond Arrow's) is found record by record and becomes a dead letter."""
    import pyarrow as pa

    try:
        return pa.array(records, type=arrow_type)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        fitted = []
        for i, record in enumerate(records):
            try:
                pa.array([record], type=arrow_type)
                fitted.append(record)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                fitted.append(None)
                if reasons[i] is None:
                    reasons[i] = f"decoded Avro record does not fit its column type: {str(exc)[:200]}"
        return pa.array(fitted, type=arrow_type)


def avro_decoder(spec, registry_config: dict | None) -> AvroDecoder | None:
    """The decoder of a :class:`~airflow_eo.attempt.DecodeSpec`'s Avro columns, reader schemas
    resolved (the registry's version of the subject, or the inline schema), or None when
    nothing is Avro. Runs in the driver."""
    import logging

    registry = SchemaRegistry(registry_config) if registry_config else None
    wanted = []
    if spec.value_format == "avro":
        wanted.append(("value", DATA_COLUMN_NAME, spec.avro_schema, spec.value_subject, spec.value_schema_version, True))
    if spec.key_format == "avro":
        wanted.append(("key", KEY_DATA_COLUMN_NAME, spec.key_avro_schema, spec.key_subject, "latest", False))
    columns = []
    for source, target, inline, subject, version, null_is_bad in wanted:
        if inline:
            columns.append(AvroColumn(source, target, inline, None, f"the inline {source} schema",
                                      spec.max_value_bytes if source == "value" else None, null_is_bad))
            continue
        if registry is None:
            raise ConfigError(f"{source}_format='avro' needs a Schema Registry (schema_registry_conn_id / "
                              f"--schema-registry) or an inline schema ({'avro_schema' if source == 'value' else 'key_avro_schema'})")
        found = registry.version(subject, version)
        name = f"{found.subject} version {found.version} (schema id {found.schema_id})"
        logging.getLogger(__name__).info("%s: Avro in the Confluent wire format, read as %s", source, name)
        columns.append(AvroColumn(source, target, found.schema, registry, name,
                                  spec.max_value_bytes if source == "value" else None, null_is_bad))
    for column in columns:
        check_schema(column.reader_schema)
    return AvroDecoder(tuple(columns)) if columns else None

