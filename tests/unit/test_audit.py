"""The audit's reconciliation core: tiling of committed ranges, and offsets compared per partition."""

from __future__ import annotations

import json

import numpy as np
import pytest

from airflow_eo.audit.findings import (
    AuditReport, BatchRanges, FindingKind, PartitionScope, account_batches, check_tiling, reconcile_partition,
)
from airflow_eo.core.offsets import OffsetRange, SkippedRange, TopicPartition

TP = TopicPartition("t", 0)
NONE = np.array([], dtype=np.int64)


def batch(n: int, *ranges: tuple[int, int], skipped=(), dropped=0, to_dlq=False) -> BatchRanges:
    return BatchRanges(n, n, tuple(OffsetRange("t", 0, s, e) for s, e in ranges),
                       tuple(SkippedRange("t", 0, s, e, "retention") for s, e in skipped), dropped, to_dlq)


def kinds(findings) -> list[tuple[str, int, int | None, int | None]]:
    return [(f.kind.value, f.count, f.start, f.end) for f in findings]


def test_contiguous_ranges_ending_at_txn_are_clean():
    assert check_tiling([batch(1, (0, 10)), batch(2, (10, 20))], {TP: 20}) == []


def test_recorded_skip_is_listed_not_drift_and_an_unrecorded_gap_is():
    found = check_tiling([batch(1, (0, 10)), batch(2, (15, 20), skipped=[(10, 15)])], {TP: 20})
    assert kinds(found) == [("skipped", 5, 10, 15)] and not any(f.drift for f in found)
    found = check_tiling([batch(1, (0, 10)), batch(2, (15, 20), skipped=[(10, 12)])], {TP: 20})
    assert kinds(f for f in found if f.drift) == [("gap", 3, 12, 15)]


def test_overlap_and_txn_past_the_last_range():
    found = check_tiling([batch(1, (0, 10)), batch(2, (8, 20))], {TP: 25})
    assert kinds(found) == [("overlap", 2, 8, 10), ("txn_mismatch", 5, 20, 25)]
    assert found[0].batch == 2


def scope(*batches: BatchRanges, log_start: int = 0) -> PartitionScope:
    return PartitionScope(TP, log_start, tuple((b, r) for b in batches for r in b.ranges))


def test_each_offset_once_is_clean():
    b = batch(1, (0, 6))
    res = reconcile_partition(scope(b), np.arange(6), np.arange(6), NONE, [(0, 6)])
    assert res.findings == () and res.missing == {} and res.checked_offsets == 6


def test_duplicate_stray_and_missing_are_reported_by_offset():
    b = batch(1, (0, 10))
    kafka = np.array([0, 1, 2, 4, 5, 6, 7, 8, 9])  # 3 is an aborted record: never delivered
    table = np.array([0, 1, 1, 2, 3, 4, 5, 7, 8, 9, 12])  # 1 twice, 3 aborted, 6 gone, 12 outside every range
    res = reconcile_partition(scope(b), kafka, table, NONE, [(0, 10)])
    by = {f.kind: f for f in res.findings}
    assert by[FindingKind.DUPLICATED].offsets == (1,) and by[FindingKind.DUPLICATED].count == 1
    assert by[FindingKind.STRAY].offsets == (3, 12)
    assert res.missing == {1: (6,)}
    lost = account_batches([res], {1: b})
    assert [(f.kind, f.offsets) for f in lost] == [(FindingKind.LOST, (6,))]


def test_dead_letters_account_for_missing_rows():
    b = batch(1, (0, 4))
    res = reconcile_partition(scope(b), np.arange(4), np.array([0, 1, 3]), np.array([2]), [(0, 4)])
    assert kinds(res.findings) == [("dead_lettered", 1, None, None)] and res.missing == {}


def test_dropped_duplicates_account_for_missing_rows_up_to_the_recorded_count():
    b = batch(1, (0, 4), dropped=1)
    res = reconcile_partition(scope(b), np.arange(4), np.array([0, 1, 3]), NONE, [(0, 4)])
    assert [f.kind for f in account_batches([res], {1: b})] == [FindingKind.DEDUPLICATED]
    res = reconcile_partition(scope(b), np.arange(4), np.array([0, 3]), NONE, [(0, 4)])
    lost = account_batches([res], {1: b})
    assert [(f.kind, f.offsets) for f in lost] == [(FindingKind.LOST, (1, 2))]
    to_dlq = batch(1, (0, 4), dropped=1, to_dlq=True)  # then they must be in the dead letters
    assert account_batches([res], {1: to_dlq})[0].kind is FindingKind.LOST


def test_retention_deleted_start_is_unverifiable_not_lost():
    b = batch(1, (0, 10))
    res = reconcile_partition(scope(b, log_start=4), np.arange(4, 10), np.arange(0, 10), NONE, [(0, 10)])
    assert kinds(res.findings) == [("unverifiable", 4, 0, 4)] and res.missing == {}
    assert res.checked_offsets == 6


def test_report_exit_code_lines_and_dict():
    b = batch(1, (0, 3))
    res = reconcile_partition(scope(b), np.arange(3), np.array([0, 0, 1, 2]), NONE, [(0, 3)])
    report = AuditReport("/t", "i", 3, (1,), 1, (TP,), res.findings, 3, 4)
    assert report.drift and report.exit_code == 1 and report.count(FindingKind.DUPLICATED) == 1
    assert report.lines()[0] == "t[0]: DRIFT: duplicated 1 at 0: 1 offset(s) held by more than one row"
    assert report.to_dict()["counts"]["duplicated"] == 1
    clean = AuditReport("/t", "i", 3, (1,), 1, (TP,), (), 3, 3)
    assert clean.exit_code == 0 and clean.lines() == [clean.summary()] and "audit clean" in clean.summary()


def test_selection_of_batches():
    from airflow_eo.audit.run import AuditRequest, Selection, select

    batches = [batch(n, (n * 10, n * 10 + 10)) for n in (1, 2, 3)]

    def pick(selection, value=None, since=None):
        return [b.batch for b in select(batches, AuditRequest("/t", "i", {}, None, selection, value), since)]

    assert pick(Selection.ALL) == [1, 2, 3] and pick(Selection.BATCHES, 2) == [2, 3]
    assert pick(Selection.SINCE_VERSION, 2) == [2, 3]
    assert pick(Selection.SINCE_LAST_AUDIT) == [1, 2, 3] and pick(Selection.SINCE_LAST_AUDIT, since=2) == [3]


def test_audit_log_keeps_the_newest_record_per_ingest(tmp_path):
    from airflow_eo.table.audit_log import AuditLog
    from airflow_eo.table.storage import TableLocation

    audits = AuditLog(TableLocation.of(str(tmp_path)))
    assert audits.last("i") is None
    for at, through in (("2026-01-01T00:00:00.000000Z", 3), ("2026-01-02T00:00:00.000000Z", 7)):
        audits.record("i", at, json.dumps({"ingest_id": "i", "audited_at": at, "through_version": through,
                                           "drift": False, "summary": "audit clean"}))
    assert audits.last("i").through_version == 7 and audits.last("other") is None
    assert audits.newest_of_each() == {audits.paths("i")[-1]}


# -- slices: the same findings whatever the slicing -----------------------------------------------

def test_many_slices_find_exactly_what_one_slice_finds():
    from airflow_eo.audit.findings import SliceResult, compare_slice, merge_slices, plan_slices

    rng = np.random.default_rng(7)
    b1, b2 = batch(1, (0, 400)), batch(2, (400, 1000), dropped=3)
    sc = scope(b1, b2, log_start=50)  # 0..50 unverifiable
    kafka = np.setdiff1d(np.arange(50, 1000), rng.choice(np.arange(50, 1000), 40, replace=False))  # markers
    table = np.concatenate([kafka[rng.random(kafka.size) > 0.01],  # some lost
                            rng.choice(kafka, 30),  # some twice
                            rng.integers(0, 50, 10),  # rows where Kafka no longer holds records
                            np.array([1000, 1003, 5000])])  # past every committed range: stray
    dead = rng.choice(kafka, 5, replace=False)
    whole = reconcile_partition(sc, kafka, table, dead, [(0, 400), (400, 1000)])
    for size in (1, 7, 100, 999, 10_000):
        specs = plan_slices(sc, [(0, 400), (400, 1000)], size, table_upper=int(table.max()))
        assert specs[-1].hi is None and all(a.hi == b.lo for a, b in zip(specs, specs[1:]))

        def part(values, s):
            return values[(values >= s.lo) & ((values < s.hi) if s.hi is not None else True)]
        results = [compare_slice(s, part(kafka, s), part(table, s), part(dead, s)) for s in specs]
        results = [SliceResult.from_dict(r.to_dict()) for r in results]  # as they travel back from Spark tasks
        merged = merge_slices(sc, results[::-1])  # in any order
        assert merged.findings == whole.findings and merged.missing == whole.missing
        assert merged.missing_counts == whole.missing_counts and merged.checked_offsets == whole.checked_offsets
        assert merged.rows_read == table.size and merged.delivered == whole.delivered
    assert {f.kind for f in whole.findings} == {FindingKind.UNVERIFIABLE, FindingKind.DUPLICATED, FindingKind.STRAY,
                                                FindingKind.DEAD_LETTERED}
    assert whole.delivered == {1: int((kafka < 400).sum()), 2: int((kafka >= 400).sum())}


def test_slices_cover_rows_past_every_range_and_statistics():
    from airflow_eo.audit.findings import plan_slices

    specs = plan_slices(scope(batch(1, (10, 30))), [(10, 30)], 10, table_upper=55)
    assert [(s.lo, s.hi) for s in specs] == [(10, 20), (20, 30), (30, 40), (40, 50), (50, None)]
    assert [s.checked_offsets for s in specs] == [10, 10, 0, 0, 0]
    assert plan_slices(scope(batch(1, (10, 30))), [(10, 30)], 100)[0].hi is None  # one open slice
    with pytest.raises(ValueError):
        plan_slices(scope(batch(1, (0, 3))), [(0, 3)], 0)


def test_file_statistics_prune_what_a_slice_reads():
    from airflow_eo.audit.coordinates import Bounds, FileIndex, FileRef, FileStats

    a = FileStats(FileRef("a.parquet"), Bounds("t", "t"), Bounds(0, 0), Bounds(0, 99))
    b = FileStats(FileRef("b.parquet"), Bounds("t", "t"), Bounds(1, 1), Bounds(0, 49))
    by_value = FileStats(FileRef("topic=t/c.parquet", "t", 0), Bounds("t", "t"), Bounds(0, 0))  # no offset stats
    assert a.may_hold(TP, 50, 60) and not a.may_hold(TP, 100, None) and not b.may_hold(TP, 0, None)
    assert not a.may_hold(TP, 0, 0) and by_value.may_hold(TP, 10**9, None)
    assert not FileStats(FileRef("u"), Bounds("u", "u")).may_hold(TP, 0, None)
    index = FileIndex([a, b])
    assert index.highest_offset(TP) == 99 and FileIndex([b]).highest_offset(TP) is None
    assert FileIndex([a, by_value]).highest_offset(TP) is None  # unknown: the last slice stays open
    assert index.files(TP, 50, 60) == (a.ref,) and index.files(TopicPartition("t", 1), 0, None) == (b.ref,)
    spanning = FileStats(FileRef("d.parquet"), Bounds("t", "t"), Bounds(0, 1), Bounds(10, 20))  # rows of two partitions: asked for both
    assert FileIndex([a, spanning]).files(TopicPartition("t", 1), 0, None) == (spanning.ref,)


def test_a_slice_reads_the_offsets_of_its_partition_and_span_from_the_files(tmp_path):
    """Parquet files as Spark, deltalake and a partitioned table write them: the rows of one
    topic-partition in ``[lo, hi)``, duplicates kept; a null offset is no offset; in a dead-letter
    table only the ingest's own rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_eo.audit.coordinates import FileRef, _ints, table_offsets
    from airflow_eo.table.storage import TableLocation

    pq.write_table(pa.table({"topic": ["t", "t", "u", "t", "t", "t"], "partition": pa.array([0, 0, 0, 1, 0, 0], pa.int32()),
                             "offset": pa.array([5, 6, 6, 7, None, 6], pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"topic": pa.array(["t"] * 3, pa.string_view()), "partition": [0, 0, 0],
                             "offset": pa.array([1, 2, 30], pa.uint32())}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"offset": [8, 9]}), tmp_path / "c.parquet")  # topic=t/partition=0/: values in the path
    pq.write_table(pa.table({"topic": ["t"] * 3, "partition": [0] * 3, "offset": [5, 6, 7],
                             "ingest_id": ["mine", "theirs", "mine"]}), tmp_path / "dlq.parquet")
    where = TableLocation.of(str(tmp_path))
    files = (FileRef("a.parquet"), FileRef("b.parquet"), FileRef("c.parquet", "t", 0), FileRef("c.parquet", "t", 1))
    assert sorted(table_offsets(where, files, TP, 2, 10).tolist()) == [2, 5, 6, 6, 8, 9]
    assert sorted(table_offsets(where, files, TP, 0, None).tolist()) == [1, 2, 5, 6, 6, 8, 9, 30]
    assert table_offsets(where, files, TopicPartition("u", 0), 0, None).tolist() == [6]
    assert table_offsets(where, (FileRef("dlq.parquet"),), TP, 0, None, "mine").tolist() == [5, 7]
    sliced = pa.array([3, 4, 5, 6], pa.int16()).slice(1, 2)  # an array that starts inside its buffer
    assert _ints(sliced).tolist() == [4, 5] and _ints(sliced).dtype == np.int64


def test_rows_are_compared_by_offset_unless_a_batch_was_written_in_merge_mode():
    from airflow_eo.audit.run import rows_keep_offsets
    from airflow_eo.table.metadata import BatchMetadata

    old = BatchMetadata.from_json('{"ingest_id": "i", "batch": 1}')  # written before write modes existed
    assert old.write_mode.value == "append" and rows_keep_offsets([batch(1, (0, 3))])
    merge = BatchMetadata.from_json('{"ingest_id": "i", "batch": 2, "merge": {"key": ["id"], "inserted": 1}}')
    assert merge.write_mode.value == "merge"
    merged = BatchRanges(2, 2, (OffsetRange("t", 0, 3, 6),), write_mode="merge")
    assert not rows_keep_offsets([batch(1, (0, 3)), merged])


def test_in_process_slices_run_in_threads_keep_task_order_and_close_every_consumer(monkeypatch):
    import threading

    from airflow_eo.attempt import Secrets
    from airflow_eo.audit import slices
    from airflow_eo.audit.findings import SliceSpec

    made, threads = [], set()

    class FakeKafka:  # the broker boundary: every offset of a span delivered
        def __init__(self, config):
            self.closed = False
            made.append(self)

        def offsets(self, tp, start, end):
            threads.add(threading.current_thread().name)
            return np.arange(start, end, dtype=np.int64)

        def close(self):
            self.closed = True

    monkeypatch.setattr(slices, "KafkaCoordinates", FakeKafka)
    specs = [SliceSpec(TopicPartition("t", p), 0, 10, ((1, 0, 10),), ((0, 10),)) for p in range(6)]
    tasks = [slices.SliceTask(s, "/nowhere") for s in specs]  # no files: the table holds no rows
    results = list(slices.InProcessSlices(workers=3).run(tasks, Secrets({"bootstrap.servers": "x:1"})))
    assert [r.spec for r in results] == specs  # in task order, whichever thread finished first
    assert all(r.delivered == {1: 10} and r.missing[1].count == 10 and r.rows_read == 0 for r in results)
    assert 1 <= len(made) <= 3 and all(k.closed for k in made) and all(n.startswith("audit-slice") for n in threads)

    class Failing(FakeKafka):
        def offsets(self, tp, start, end):
            raise RuntimeError(f"broker gone at {tp}")

    made.clear()
    monkeypatch.setattr(slices, "KafkaCoordinates", Failing)
    with pytest.raises(RuntimeError, match="broker gone"):
        list(slices.InProcessSlices(workers=2).run(tasks, Secrets({"bootstrap.servers": "x:1"})))
    assert made and all(k.closed for k in made)
