"""The two halves of an ingest spec: what is read (:class:`SourceSide`: the topics, where they
start, decoding, planning, interval mode, Spark's reading) and where it goes (:class:`SinkSpec`: one
table and what happens to a batch in it). No I/O.

Today an ingest has one sink (:attr:`airflow_eo.spec.IngestSpec.sinks` holds it); the flat options,
the operator's parameters and the CLI flags stay as they are: the halves are built from the same
sub-specs. The Kafka connection is no option (a secret: :class:`airflow_eo.attempt.Secrets`).

Example::

    >>> from airflow_eo.spec import IngestSpec
    >>> spec = IngestSpec.of(table_uri="/t", ingest_id="i", topics="a", write_mode="merge", merge_key="id")
    >>> spec.sink.table_uri, spec.sink.merge.key, spec.source_side.topics
    ('/t', ('id',), ('a',))
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_eo.core.errors import ConfigError
from airflow_eo.spec.parts import (
    DeadLetterSpec, DecodeSpec, DedupSpec, MergeSpec, PlanningSpec, SourceSpec, SparkSettings, TableSpec, Transform,
)


@dataclass(frozen=True)
class SourceSide:
    """What an ingest reads: its topics and where they start, how records decode, how a run plans
    (offsets or intervals) and how Spark reads them."""

    source: SourceSpec
    planning: PlanningSpec
    decode: DecodeSpec
    spark: SparkSettings

    @property
    def topics(self) -> tuple[str, ...]:
        return self.source.topics


@dataclass(frozen=True)
class SinkSpec:
    """One table and what happens to a batch in it: the table (its URI, ingest id, partitioning,
    properties, schema evolution, adoption), the sink's transform, its write mode (merge, dedup) and
    its dead letters. Its own rules are checked here; the rules between it and the source (decoding
    needs dead letters, Debezium needs decoded values) in :class:`airflow_eo.spec.IngestSpec`."""

    table: TableSpec
    transform: Transform
    dead_letters: DeadLetterSpec
    dedup: DedupSpec
    merge: MergeSpec

    def __post_init__(self):
        if self.dead_letters.table_uri and self.dead_letters.table_uri == self.table.table_uri:
            raise ConfigError("dead_letter_table_uri must be another path than table_uri")
        if self.dedup.to_dead_letters and not self.dead_letters.table_uri:
            raise ConfigError("duplicates_to_dead_letters needs a dead_letter_table_uri: set where dropped duplicates go")
        if self.merge.enabled and self.dedup.enabled:
            raise ConfigError("dedup_key and merge_key do not go together: a merge keeps one row per merge_key "
                              "already (a key's last change wins, repeats included); drop dedup_key")

    @property
    def table_uri(self) -> str:
        return self.table.table_uri
