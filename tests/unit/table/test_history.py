"""The commit history cache: newest first, each committed version read from the log once, a
recreated table read anew, the 24-hour window and the limit, a cleaned log."""

from __future__ import annotations

import shutil
import time

from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.table.history import FIRST_WINDOW, CommitHistory
from airflow_eo.table.ledger import Ledger
from tests.unit.fakes import BatchLog

INGEST = "orders"


def plan(batch: int) -> BatchPlan:
    return BatchPlan(INGEST, batch, (OffsetRange("orders", 0, batch - 1, batch),), RunIdentity(f"d/r{batch}/t/-1"))


def build(uri: str, batches: int) -> BatchLog:
    log = BatchLog(uri)
    for b in range(1, batches + 1):
        log.batch(plan(b), {"orders[0]": b})
    return log


class Spy:
    """Counts the history() calls of a ledger's table and how many commits each asked for."""

    def __init__(self, ledger: Ledger):
        self.asked: list[int] = []
        real = ledger.table.history

        def history(limit=None):
            self.asked.append(limit)
            return real(limit)

        ledger.table.history = history


def test_newest_first_and_a_later_read_reads_only_the_new_versions(tmp_path):
    uri = str(tmp_path / "t")
    log = build(uri, 5)
    history = CommitHistory()
    first = Ledger.open(uri)
    spy = Spy(first)
    recent = history.recent(first, limit=100)
    assert [c.version for c in recent.commits] == [5, 4, 3, 2, 1, 0] and recent.complete
    assert [c.batch.batch for c in recent.commits if c.batch] == [5, 4, 3, 2, 1]
    assert recent.commits[-1].batch is None  # the table's creation is no batch
    newest = recent.commits[0]
    assert (newest.batch.ingest_id, newest.batch.rows, newest.batch.write_mode) == (INGEST, 5, "append")
    assert newest.operation == "WRITE" and newest.timestamp_ms > 0
    assert spy.asked == [6]  # the whole (short) log, once

    log.batch(plan(6), {"orders[0]": 6})
    log.batch(plan(7), {"orders[0]": 7})
    again = Ledger.open(uri)
    spy = Spy(again)
    assert [c.version for c in history.recent(again, limit=3).commits] == [7, 6, 5]
    assert spy.asked == [2]  # only versions 6 and 7
    assert [c.version for c in history.recent(again, limit=100).commits] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert spy.asked == [2]  # everything else from the cache


def test_a_long_log_is_read_in_a_first_window_then_up_to_the_limit(tmp_path):
    uri = str(tmp_path / "t")
    build(uri, FIRST_WINDOW + 10)
    ledger = Ledger.open(uri)
    spy = Spy(ledger)
    history = CommitHistory()
    recent = history.recent(ledger, limit=FIRST_WINDOW + 5)
    assert [c.version for c in recent.commits] == list(range(FIRST_WINDOW + 10, 5, -1))
    assert not recent.complete  # older commits exist: the limit cut them off
    assert spy.asked[0] == FIRST_WINDOW and len(spy.asked) == 2 and spy.asked[1] <= FIRST_WINDOW + 5


def test_since_stops_at_the_first_older_commit(tmp_path):
    uri = str(tmp_path / "t")
    log = build(uri, 3)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    log.batch(plan(4), {"orders[0]": 4})
    log.batch(plan(5), {"orders[0]": 5})
    recent = CommitHistory().recent(Ledger.open(uri), limit=100, since_ms=cut)
    assert [c.version for c in recent.commits] == [5, 4] and recent.complete


def test_a_table_created_again_at_the_same_path_is_not_served_from_the_cache(tmp_path):
    uri = str(tmp_path / "t")
    build(uri, 3)
    history = CommitHistory()
    assert [c.batch.rows for c in history.recent(Ledger.open(uri), limit=10).commits if c.batch] == [3, 2, 1]
    shutil.rmtree(uri)
    log = BatchLog(uri)
    for b, rows in ((1, 40), (2, 50), (3, 60)):  # the same versions, other commits
        log.batch(plan(b), {"orders[0]": rows})
    assert [c.batch.rows for c in history.recent(Ledger.open(uri), limit=10).commits if c.batch] == [60, 50, 40]


def test_a_cleaned_log_ends_the_history_where_it_starts(tmp_path):
    uri = str(tmp_path / "t")
    log = build(uri, 4)
    log.table.create_checkpoint()
    for version in (0, 1, 2):  # what log cleanup deletes: commits a checkpoint covers
        (tmp_path / "t" / "_delta_log" / f"{version:020d}.json").unlink()
    recent = CommitHistory().recent(Ledger.open(uri), limit=100)
    assert [c.version for c in recent.commits] == [4, 3] and recent.complete


def test_a_table_not_created_has_no_history(tmp_path):
    recent = CommitHistory().recent(Ledger.open(str(tmp_path / "none")), limit=10)
    assert recent.commits == () and recent.complete
