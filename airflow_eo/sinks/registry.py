"""Which sink writes a table: one registration per :class:`~airflow_eo.sinks.base.SinkKind`.

A new write mode is a module in :mod:`airflow_eo.sinks` (its :class:`~airflow_eo.sinks.base.Sink`),
its Spark step registered in :mod:`airflow_eo.driver.stages`, and one line here.
"""

from __future__ import annotations

from airflow_eo.sinks.append import AppendSink
from airflow_eo.sinks.base import Sink, SinkKind
from airflow_eo.sinks.dedup import DedupSink
from airflow_eo.sinks.merge import MergeSink
from airflow_eo.spec import SinkSpec, WriteMode
from airflow_eo.table.ledger import Ledger

SINKS: dict[SinkKind, type[Sink]] = {
    SinkKind.APPEND: AppendSink,
    SinkKind.DEDUP: DedupSink,
    SinkKind.MERGE: MergeSink,
}


def kind_of(spec: SinkSpec) -> SinkKind:
    """The sink kind ``spec`` writes with: its write mode; an append with a ``dedup_key`` dedups.

    >>> from airflow_eo.spec import IngestSpec
    >>> kind_of(IngestSpec.of(table_uri="/t", ingest_id="i", topics="a", dedup_key="key").sink).value
    'dedup'
    """
    kind = SinkKind(spec.merge.write_mode.value)
    return SinkKind.DEDUP if kind is SinkKind.APPEND and spec.dedup.enabled else kind


def sink_of(spec: SinkSpec) -> Sink:
    """The sink that writes ``spec``'s table."""
    return SINKS[kind_of(spec)](spec)


def table_sink(ledger: Ledger, ingest_id: str) -> type[Sink]:
    """The sink class a table's write-mode mark says its batches were written with (dedup apart)."""
    return MergeSink if ledger.is_merge_table(ingest_id) else AppendSink


def recorded_sink(write_mode: WriteMode | str) -> type[Sink]:
    """The sink class of a batch as its commit recorded it (its write mode: the log does not say
    whether an append deduplicated, and nothing read from it needs to)."""
    return SINKS[SinkKind(WriteMode.parse(write_mode).value)]
