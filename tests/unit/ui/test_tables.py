"""What the page reads of a table from its Delta log: the list's row (24-hour counts, mode,
audit, maintenance), a table's page (batches, offsets, interval time line), one log open per
table, and a table that cannot be read."""

from __future__ import annotations

import os
import socket
import time

import pytest

from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import Interval, OffsetRange, RunIdentity, TopicPartition
from airflow_eo.table.audit_log import AuditLog
from airflow_eo.table.lease import Claim, LeasePurpose, TableLease
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import BatchFindings, CommitKind, DeadLetterManifest, LateRecords
from airflow_eo.table.files import StagedFile
from airflow_eo.table.storage import TableLocation
from airflow_eo.ui.tables import DAY_MS, SpanState, TableMode, TableReader, display_uri
from tests.unit.fakes import BatchLog

INGEST = "orders"
H = 3_600_000


def run(n: int) -> RunIdentity:
    return RunIdentity(f"dag/run-{n}/ingest/-1", dag_id="dag", run_id=f"run-{n}", task_id="ingest", try_number=n)


def offsets_plan(batch: int, start: int, size: int) -> BatchPlan:
    ranges = (OffsetRange("orders", 0, start, start + size), OffsetRange("orders", 1, 0, 0))
    return BatchPlan(INGEST, batch, ranges, run(batch), planned_at="2026-11-24T00:00:00+00:00", attempt_id=f"a{batch}")


def dead_letters(records: int) -> BatchFindings:
    return BatchFindings(dead_letters=DeadLetterManifest("/dlq", (StagedFile("f.parquet", 10, 0, records, "{}"),)))


@pytest.fixture
def offsets_table(tmp_path):
    uri = str(tmp_path / "orders")
    log = BatchLog(uri)
    log.batch(offsets_plan(1, 0, 10), {"orders[0]": 10})
    log.batch(offsets_plan(2, 10, 5), {"orders[0]": 4}, findings=dead_letters(1))
    log.commit()  # someone else's commit (e.g. a compaction) in between
    log.batch(offsets_plan(1, 0, 10), {"orders[0]": 10}, kind=CommitKind.REPROCESS)
    return uri


def test_the_lists_row_counts_the_last_day_and_names_the_mode(offsets_table):
    state = TableReader().states(offsets_table, [INGEST])[INGEST]
    assert state.error is None and state.version == 4 and state.last_batch == 2
    assert state.mode is TableMode.OFFSETS and state.write_mode == "append"
    assert state.rows_24h == 14  # the reprocess replaced rows already counted
    assert state.dead_letters_24h == 1 and state.counts_complete
    assert state.last_audit is None and state.due == ()


def test_commits_older_than_a_day_are_not_counted(offsets_table):
    tomorrow = TableReader(clock=lambda: time.time() + DAY_MS / 1000 + 60)
    state = tomorrow.states(offsets_table, [INGEST])[INGEST]
    assert (state.rows_24h, state.dead_letters_24h, state.counts_complete) == (0, 0, True)


def test_the_newest_audit_is_shown(offsets_table):
    audits = AuditLog(TableLocation.of(offsets_table))
    audits.record(INGEST, "2026-11-24T10:00:00+0000", '{"ingest_id": "orders", "audited_at": "2026-11-24T10:00:00+0000", '
                  '"through_version": 3, "drift": false, "summary": "0 lost, 0 duplicated"}')
    audit = TableReader().states(offsets_table, [INGEST])[INGEST].last_audit
    assert (audit.through_version, audit.drift, audit.summary) == (3, False, "0 lost, 0 duplicated")


def test_a_tables_page_lists_its_batches_newest_first_and_its_offsets(offsets_table):
    detail = TableReader().detail(offsets_table, INGEST)
    assert [(b.batch, b.version, b.operation) for b in detail.batches] == [
        (1, 4, CommitKind.REPROCESS), (2, 2, CommitKind.BATCH), (1, 1, CommitKind.BATCH)]
    second = detail.batches[1]
    assert second.ranges == (OffsetRange("orders", 0, 10, 15),)  # empty ranges left out
    assert (second.rows, second.dead_letters, second.attempt_id, second.run.run_id, second.run.try_number) == \
        (4, 1, "a2", "run-2", 2)
    assert second.seconds is not None and second.seconds > 0  # from the plan (2026-11-24) to the commit
    assert [(o.topic, o.partition, o.next_offset) for o in detail.offsets] == [("orders", 0, 15), ("orders", 1, 0)]
    assert detail.layout is not None and detail.layout.version == 4 and detail.spans == ()
    assert detail.lease is None  # no run holds the table
    held = TableLease(TableLocation.of(offsets_table)).try_take(Claim(LeasePurpose.INGEST, "dag/r9/ingest/-1", INGEST))
    try:
        holder = TableReader().detail(offsets_table, INGEST).lease
        assert (holder.run_key, holder.host, holder.pid) == ("dag/r9/ingest/-1", socket.gethostname(), os.getpid())
    finally:
        held.release()
    assert TableReader().states(offsets_table, [INGEST])[INGEST].error is None  # the list reads no lease


def test_an_interval_tables_time_line_has_its_gaps_and_what_is_not_closed(tmp_path):
    uri, base = str(tmp_path / "hourly"), 1_780_000_000_000 // H * H
    log = BatchLog(uri)
    for batch, hour, late in ((1, 2, 1), (2, 0, 0), (3, 3, 0)):  # hour 1 never ran
        p = BatchPlan(INGEST, batch, (OffsetRange("orders", 0, hour * 10, hour * 10 + 10),), run(batch),
                      interval=Interval(base + hour * H, base + (hour + 1) * H))
        log.batch(p, {"orders[0]": 10}, findings=BatchFindings(late=LateRecords(late)))
    reader = TableReader(clock=lambda: (base + 5 * H) / 1000)
    detail = reader.detail(uri, INGEST)
    assert detail.state.mode is TableMode.INTERVAL
    assert [(s.state, (s.start_ms - base) // H, (s.end_ms - base) // H, s.batch, s.late) for s in detail.spans] == [
        (SpanState.COMMITTED, 0, 1, 2, 0), (SpanState.GAP, 1, 2, None, None), (SpanState.COMMITTED, 2, 3, 1, 1),
        (SpanState.COMMITTED, 3, 4, 3, 0), (SpanState.NOT_CLOSED, 4, 5, None, None)]


def test_one_log_open_serves_every_ingest_id_of_a_table(offsets_table, monkeypatch):
    opened = []
    real = Ledger.open.__func__

    def spy(cls, uri, storage_options=None):
        opened.append(uri)
        return real(cls, uri, storage_options)

    monkeypatch.setattr(Ledger, "open", classmethod(spy))
    states = TableReader().states(offsets_table, [INGEST, "someone_else"])
    assert len(opened) == 1
    assert states[INGEST].error is None
    assert "was not written by ingest_id 'someone_else'" in states["someone_else"].error


def test_a_table_that_cannot_be_read_becomes_a_line_saying_why(tmp_path):
    gone = TableReader().states(str(tmp_path / "gone"), [INGEST])[INGEST]
    assert "there is no Delta table" in gone.error and gone.version is None
    (tmp_path / "broken" / "_delta_log").mkdir(parents=True)
    (tmp_path / "broken" / "_delta_log" / "00000000000000000000.json").write_text("not json")
    broken = TableReader().detail(str(tmp_path / "broken"), INGEST)
    assert broken.state.error and broken.batches == () and "\n" not in broken.state.error


def test_uris_are_shown_without_credentials():
    assert display_uri("s3://AKIA:secret@bucket/t?X-Amz-Signature=abc") == "s3://bucket/t"
    assert display_uri("abfss://c@acct.dfs.core.windows.net/t?sv=1&sig=xyz") == "abfss://acct.dfs.core.windows.net/t"
    assert display_uri("s3://bucket:9000/t") == "s3://bucket:9000/t"
    state = TableReader().states("s3://AKIA:secret@bucket/t", [INGEST])[INGEST]
    assert state.table_uri == "s3://bucket/t" and "secret" not in (state.error or "") and "AKIA" not in (state.error or "")


def test_a_ranges_partitions_come_from_the_batches(offsets_table):
    detail = TableReader().detail(offsets_table, INGEST, batches=1)
    assert len(detail.batches) == 1 and TopicPartition("orders", 1) in {TopicPartition(o.topic, o.partition)
                                                                          for o in detail.offsets}
