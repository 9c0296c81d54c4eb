"""Which sink writes a table: the one registry of write modes, each sink class listed once by its
:attr:`~airflow_eo.sinks.base.Sink.kind` (the name its commits record: ``append``, ``merge``; ``dedup``,
an append that drops repeated keys, records ``append``).

A new write mode is a module in :mod:`airflow_eo.sinks` (its :class:`~airflow_eo.sinks.base.Sink`, naming
its Spark step in :attr:`~airflow_eo.sinks.base.Sink.stage`) and one line here.
"""

from __future__ import annotations

from airflow_eo.sinks.append import AppendSink
from airflow_eo.sinks.base import Sink
from airflow_eo.sinks.dedup import DedupSink
from airflow_eo.sinks.merge import MergeSink
from airflow_eo.spec import SinkSpec, WriteMode
from airflow_eo.table.ledger import Ledger

SINKS: dict[str, type[Sink]] = {sink.kind: sink for sink in (AppendSink, DedupSink, MergeSink)}


def kind_of(spec: SinkSpec) -> str:
    """The sink ``spec`` writes with: its write mode; an append with a ``dedup_key`` dedups.

    >>> from airflow_eo.spec import IngestSpec
    >>> kind_of(IngestSpec.of(table_uri="/t", ingest_id="i", topics="a", dedup_key="key").sink)
    'dedup'
    """
    kind = spec.merge.write_mode.value
    return DedupSink.kind if kind == AppendSink.kind and spec.dedup.enabled else kind


def sink_of(spec: SinkSpec) -> Sink:
    """The sink that writes ``spec``'s table."""
    return SINKS[kind_of(spec)](spec)


def table_sink(ledger: Ledger, ingest_id: str) -> type[Sink]:
    """The sink class a table's write-mode mark says its batches were written with (dedup apart)."""
    return MergeSink if ledger.is_merge_table(ingest_id) else AppendSink


def recorded_sink(write_mode: WriteMode | str) -> type[Sink]:
    """The sink class of a batch as its commit recorded it (its write mode: the log does not say
    whether an append deduplicated, and nothing read from it needs to)."""
    return SINKS[WriteMode.parse(write_mode).value]
