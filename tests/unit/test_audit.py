"""The audit's reconciliation core: tiling of committed ranges, and offsets compared per partition."""

from __future__ import annotations

import json

import numpy as np

from airflow_eo.audit.findings import (
    AuditReport, BatchRanges, FindingKind, PartitionScope, account_batches, check_tiling, reconcile_partition,
)
from airflow_eo.offsets import OffsetRange, SkippedRange, TopicPartition

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
