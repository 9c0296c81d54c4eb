"""Which sink writes a table (airflow_eo.sinks.registry), and what each sink answers for its write mode:
the table's use, the direct path, the audit's check, its commit rule per attempt kind, its findings and
result counts. The commit rules themselves are tested on temporary tables (tests/unit/table/test_commit.py,
tests/unit/sinks/test_merge.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_eo.attempt import Attempt, AttemptKind
from airflow_eo.core.errors import ConfigError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.sinks import kind_of, recorded_sink, sink_of
from airflow_eo.sinks.append import AppendSink, BatchCommit, ReprocessCommit
from airflow_eo.sinks.dead_letters import DeadLetterCommit, DeadLetterSink
from airflow_eo.sinks.dedup import DedupSink
from airflow_eo.sinks.merge import FileSwap, MergeCommit, MergeReprocessCommit, MergeSink, MergeStaged
from airflow_eo.sinks.registry import SINKS
from airflow_eo.spec import IngestSpec, WriteMode
from airflow_eo.table.commit import StagedBatch
from airflow_eo.table.features import TableUse
from airflow_eo.table.metadata import BatchMetadata, Duplicates, MergeInfo

BASE = {"table_uri": "/data/t", "ingest_id": "t", "topics": "orders"}


def spec(**options) -> IngestSpec:
    return IngestSpec.of(**BASE, **options)


def attempt(s: IngestSpec, kind: AttemptKind = AttemptKind.INGEST) -> Attempt:
    plan = BatchPlan("t", 1, (OffsetRange("orders", 0, 0, 10),), RunIdentity("r1"), attempt_id="a1")
    return Attempt(plan, s, kind, reprocess_from=0 if kind is AttemptKind.REPROCESS else None)


@pytest.mark.parametrize("options, kind, cls", [
    ({}, "append", AppendSink),
    ({"dedup_key": "headers['id']"}, "dedup", DedupSink),
    ({"write_mode": "merge", "merge_key": "id"}, "merge", MergeSink),
])
def test_the_write_mode_chooses_the_sink(options, kind, cls):
    s = spec(**options)
    assert kind_of(s.sink) == kind and type(sink_of(s.sink)) is cls and sink_of(s.sink).spec == s.sink


def test_every_write_mode_has_a_sink_listed_once_by_its_name_and_each_names_a_spark_step():
    from airflow_eo.driver.append import SparkStage
    from airflow_eo.driver.stages import stage_class

    assert {m.value for m in WriteMode} <= set(SINKS)
    assert all(SINKS[k].kind == k for k in SINKS)
    assert {k: stage_class(SINKS[k](spec().sink)).__name__ for k in SINKS} == {
        "append": "SparkStage", "dedup": "DedupStage", "merge": "MergeStage"}
    assert all(issubclass(stage_class(SINKS[k](spec().sink)), SparkStage) for k in SINKS)


def test_a_recorded_write_mode_names_its_sink():
    assert recorded_sink("merge") is MergeSink and recorded_sink(WriteMode.APPEND) is AppendSink
    old = BatchMetadata.from_json('{"ingest_id": "i", "batch": 1}')  # written before write modes existed
    assert recorded_sink(old.write_mode) is AppendSink


def test_what_each_sink_does_to_the_table():
    append, dedup, merge = (sink_of(spec(**o).sink) for o in ({}, {"dedup_key": "key"},
                                                                {"write_mode": "merge", "merge_key": "id"}))
    assert (append.use, dedup.use, merge.use) == (TableUse.APPEND, TableUse.DEDUP, TableUse.MERGE)
    assert (append.direct, dedup.direct, merge.direct) == (True, False, False)
    assert (append.rows_keep_offsets, dedup.rows_keep_offsets, merge.rows_keep_offsets) == (True, True, False)
    assert (append.describe(), merge.describe()) == ("append", "merge by id")
    assert (append.table_note, merge.table_note) == ("", "merge by key")
    assert (append.write_mode, dedup.write_mode, merge.write_mode) == (WriteMode.APPEND, WriteMode.APPEND,
                                                                       WriteMode.MERGE)


def test_only_a_dedup_sink_asked_to_sends_records_to_the_dead_letters():
    asked = spec(dedup_key="key", dead_letter_table_uri="/data/dlq", duplicates_to_dead_letters=True)
    assert sink_of(asked.sink).sends_dead_letters
    assert not sink_of(spec(dedup_key="key").sink).sends_dead_letters
    assert not sink_of(spec(dead_letter_table_uri="/data/dlq").sink).sends_dead_letters


def test_a_tables_mark_names_its_sink(tmp_path):
    from airflow_eo.sinks import table_sink
    from airflow_eo.table.ledger import Ledger

    assert table_sink(Ledger.open(str(tmp_path / "none")), "t") is AppendSink  # no table yet: appends


def test_the_commit_rule_follows_the_attempt_kind():
    staged = StagedBatch(attempt(spec()).plan, ())
    s = spec()
    sink = sink_of(s.sink)
    findings = sink.findings(attempt(s))
    assert type(sink.rule(staged, attempt(s), findings)) is BatchCommit
    assert type(sink.rule(staged, attempt(s, AttemptKind.REPROCESS), findings)) is ReprocessCommit
    m = spec(write_mode="merge", merge_key="id")
    merge = sink_of(m.sink)
    extra = MergeStaged(FileSwap((), pa.table({"id": pa.array([], pa.int64())}), ("id",), frozenset()),
                        MergeInfo(("id",), 0))
    assert type(merge.rule(staged, attempt(m), findings, extra)) is MergeCommit
    assert type(merge.rule(staged, attempt(m, AttemptKind.REPROCESS), findings, extra)) is MergeReprocessCommit
    assert type(DeadLetterSink(s.sink).ingest_rule(staged)) is DeadLetterCommit
    # an interval without records commits its boundaries as an append does, whatever the write mode
    assert type(sink.boundaries_rule(staged, attempt(s))) is BatchCommit
    assert type(merge.boundaries_rule(staged, attempt(m))) is BatchCommit


def test_only_a_dedup_sink_records_duplicates():
    d = spec(dedup_key="key", dead_letter_table_uri="/data/dlq", duplicates_to_dead_letters=True)
    assert sink_of(d.sink).findings(attempt(d), dropped=3).duplicates == Duplicates(3, True)
    assert sink_of(d.sink).findings(attempt(d)).duplicates == Duplicates(0, True)  # an empty batch measured none
    assert sink_of(spec().sink).findings(attempt(spec()), dropped=3).duplicates is None


def test_result_counts_come_from_the_recorded_merge():
    meta = BatchMetadata.from_json('{"ingest_id": "i", "batch": 2, "merge": {"key": ["id"], "inserted": 1, '
                                   '"updated": 2, "deleted": 3, "files_rewritten": 4}}')
    assert recorded_sink(meta.write_mode).result_counts(meta) == {
        "write_mode": "merge", "inserted": 1, "updated": 2, "deleted": 3, "files_rewritten": 4}
    assert AppendSink.result_counts(BatchMetadata.from_json('{"ingest_id": "i", "batch": 1}')) == {}


def test_the_sink_half_of_the_spec_checks_its_own_rules():
    s = spec(write_mode="merge", merge_key="id", partition_by="day")
    assert s.sinks == (s.sink,) and s.sink.table_uri == "/data/t" and s.sink.table.partition_by == ("day",)
    assert s.source_side.topics == ("orders",)
    with pytest.raises(ConfigError, match="dead_letter_table_uri must be another path"):
        spec(dead_letter_table_uri="/data/t")
    with pytest.raises(ConfigError, match="dedup_key and merge_key do not go together"):
        spec(write_mode="merge", merge_key="id", dedup_key="key")
    with pytest.raises(ConfigError, match="duplicates_to_dead_letters needs a dead_letter_table_uri"):
        spec(dedup_key="key", duplicates_to_dead_letters=True)
