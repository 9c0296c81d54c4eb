"""The read step's decoder: each Arrow batch of Kafka records gets its decoded columns and one dead-letter reason.

One interface decodes a column (:class:`ColumnDecoder`: raw values in, the decoded Arrow column
and a reason per value out; Avro's is :class:`airflow_eo.decoding.avro.AvroColumn`, Protobuf's
:class:`airflow_eo.decoding.protobuf.ProtobufColumn`, JSON Schema's
:class:`airflow_eo.decoding.json_schema.JsonSchemaColumn`: :func:`airflow_eo.decoding.formats.decoder_of`), and one
:class:`RecordDecoder` applies the columns' decoders, in order (the value, then the key), in the
Spark task that read the batch (:func:`airflow_eo.driver.source.read_plan` pickles it there),
so raw values cross into Python once. Before any decoding, every checked column goes through the
one rule that needs no decoding (:func:`precheck`: a null value, a value over ``max_value_bytes``),
whatever its format. JSON is the one format Spark parses (its DDL types are Spark's): the driver's
glue (:mod:`airflow_eo.driver.decode`) adds those reasons after these.

A record's reason is the first found: the checks and decoding here (value, then key), then
Spark's JSON parsing (value, then key); null when the record decoded. The reasons travel in
:data:`REASON_COLUMN` until the dead letters are split off (:mod:`airflow_eo.driver.dead_letters`).

Example::

    >>> import pyarrow as pa
    >>> spec = column_of(Source.VALUE, Format.RAW, max_bytes=3)
    >>> precheck(pa.array([b"ab", None, b"abcdef"]), spec).to_pylist()
    [None, 'value is null', 'value of 6 bytes exceeds max_value_bytes=3']
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from airflow_eo.decoding.formats import decoder_of
from airflow_eo.decoding.reader_schemas import reader_schemas
from airflow_eo.decoding.registry import SchemaRegistry
from airflow_eo.core.planning import BatchPlan, ReaderSchema
from airflow_eo.spec.columns import (  # noqa: F401 - Format: the example
    REASON_COLUMN, ColumnSpec, Format, Source, column_of, require_registry,
)


class ColumnDecoder(Protocol):
    """Decodes the values of one Kafka column into the struct column ``spec.target``."""

    @property
    def spec(self) -> ColumnSpec:
        """The column it decodes."""

    def spark_type(self) -> Any:
        """The Spark type of the decoded column."""

    def to_arrow(self, values: list, arrow_type: pa.DataType) -> tuple[pa.Array, list[str | None]]:
        """(the decoded column, a dead-letter reason or None per value); a None value (null, or
        already a dead letter) decodes to null without a reason."""


def precheck(values: pa.Array, spec: ColumnSpec) -> pa.Array | None:
    """The dead-letter reason of each value before it is decoded (null where it passes), or None
    when ``spec`` checks nothing: a null value where :attr:`~ColumnSpec.null_is_bad`, a value
    longer than :attr:`~ColumnSpec.max_bytes`. Whole columns at once, in Arrow."""
    if not spec.checked:
        return None
    reasons = pa.nulls(len(values), pa.string())
    if spec.max_bytes is not None:
        sizes = pc.binary_length(values)
        over = pc.greater(sizes, spec.max_bytes)
        if pc.any(over).as_py():
            before, after = spec.size_reason("\0").split("\0")
            reasons = pc.if_else(over, pc.binary_join_element_wise(before, pc.cast(sizes, pa.string()), after, ""),
                                 reasons)
    if spec.null_is_bad and values.null_count:
        reasons = pc.if_else(values.is_null(), spec.null_reason(), reasons)
    return reasons


def _first(found: pa.Array | None, more: pa.Array | None) -> pa.Array | None:
    """Each record's first reason: ``found``'s, else ``more``'s."""
    if more is None:
        return found
    return more if found is None else pc.coalesce(found, more)


class RecordDecoder:
    """Adds each decoded column, and the record's dead-letter reason, to Arrow batches of Kafka
    records. Picklable: the read step applies it inside the task that read the batch."""

    def __init__(self, columns: tuple[ColumnSpec, ...], decoders: tuple[ColumnDecoder, ...] = ()):
        from airflow_eo.compat import arrow_type_of

        self.columns = tuple(columns)
        self.decoders = {d.spec.source: d for d in decoders}
        self.types = {source: d.spark_type() for source, d in self.decoders.items()}
        self.arrow_types = {source: arrow_type_of(t) for source, t in self.types.items()}

    @property
    def targets(self) -> list[str]:
        return [c.target for c in self.columns if c.source in self.decoders]

    def schema(self, source):
        """The Spark schema of decoded batches, from the source's (a StructType)."""
        from pyspark.sql.types import StringType, StructField, StructType

        kept = [f for f in source.fields if f.name != REASON_COLUMN]
        decoded = [StructField(c.target, self.types[c.source], True) for c in self.columns if c.source in self.decoders]
        return StructType([*kept, *decoded, StructField(REASON_COLUMN, StringType(), True)])

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One decoded batch; a reason already in the batch comes first."""
        names = [n for n in batch.schema.names if n != REASON_COLUMN]
        reason = batch.column(REASON_COLUMN) if REASON_COLUMN in batch.schema.names else None
        decoded = []
        for spec in self.columns:
            values = batch.column(spec.source.value)
            checked = precheck(values, spec)
            reason = _first(reason, checked)
            decoder = self.decoders.get(spec.source)
            if decoder is None:
                continue
            raw = values.to_pylist()
            if checked is not None and checked.null_count < len(checked):  # not decoded: already a dead letter
                for i in pc.indices_nonzero(checked.is_valid()).to_pylist():
                    raw[i] = None
            array, why = decoder.to_arrow(raw, self.arrow_types[spec.source])
            decoded.append(array)
            reason = _first(reason, pa.array(why, pa.string()))
        if reason is None:
            reason = pa.nulls(batch.num_rows, pa.string())
        return pa.RecordBatch.from_arrays([batch.column(n) for n in names] + decoded + [reason],
                                          names=[*names, *self.targets, REASON_COLUMN])


def record_decoder(columns: tuple[ColumnSpec, ...], registry_config: Mapping[str, object] | None,
                   plan: BatchPlan) -> tuple[RecordDecoder | None, tuple[ReaderSchema, ...]]:
    """The read step's decoder of ``columns`` (None when no column is decoded or checked before
    Spark), and the registry reader schemas it decodes with: the ones ``plan`` pinned
    (:func:`airflow_eo.decoding.reader_schemas.reader_schemas`). Runs in the driver."""
    require_registry(columns, registry_config is not None)
    registry = SchemaRegistry(dict(registry_config)) if registry_config and any(
        c.needs_registry for c in columns) else None
    readers = reader_schemas(columns, registry, plan)
    decoders: list = []
    for column in columns:
        pinned, found = readers.get(column.source, (None, None))
        decoder = decoder_of(column, registry, pinned, found)
        if decoder is not None:
            decoders.append(decoder)
    if not decoders and not any(c.checked for c in columns):
        return None, ()
    return RecordDecoder(columns, tuple(decoders)), tuple(pinned for pinned, _ in readers.values())
