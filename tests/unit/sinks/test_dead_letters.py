"""The dead-letter table follows the main table: every batch's dead letters once, in batch order, whatever
committed in between (temporary Delta tables, Parquet staged by pyarrow)."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from airflow_eo.core.errors import TableError
from airflow_eo.sinks.append import BatchCommit
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.sinks.dead_letters import commit_dead_letters_of, commit_reprocessed_dead_letters, ensure_table
from airflow_eo.table.app_ids import dead_letters_app_id, dlq_app_id
from airflow_eo.table.commit import COMMITTED, commit
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import BatchFindings, DeadLetterManifest
from tests.unit.table.test_commit import INGEST, RUN1, RUN2, SCHEMA, batch_plan, rows, stage


def commit_batch(main: str, dlq: str, batch: int, start: int, end: int, bad: int = 0, run=RUN1) -> None:
    """Commit a main batch of ``[start, end)``; with ``bad`` dead letters staged beside ``dlq`` (not committed
    there: as a driver killed between its two commits leaves them)."""
    plan = batch_plan(batch, start, end, run=run)
    findings = BatchFindings()
    if bad:
        letters = stage(dlq, batch_plan(batch, start, start + bad, run=run), body="bad", files=1)
        findings = BatchFindings(dead_letters=DeadLetterManifest(dlq, letters.files))
    assert commit(BatchCommit(stage(main, plan), findings=findings), main).status == COMMITTED


@pytest.fixture
def tables(tmp_path):
    main, dlq = str(tmp_path / "main"), str(tmp_path / "dlq")
    ensure_table(dlq, SCHEMA)
    return main, dlq


def test_a_batch_overtaken_before_its_dead_letters_landed_still_gets_them_once(tables):
    main, dlq = tables
    commit_batch(main, dlq, 1, 0, 10, bad=3)  # its driver dies before the dead-letter commit
    commit_batch(main, dlq, 2, 10, 20, run=RUN2)  # another run's clean batch lands after it
    assert Ledger.open(main).transaction(dead_letters_app_id(INGEST)) == 1
    assert commit_dead_letters_of(Ledger.open(main), INGEST, dlq) == 1
    assert commit_dead_letters_of(Ledger.open(main), INGEST, dlq) == 0  # a retry, the next run: nothing twice
    assert sorted(rows(dlq)) == [0, 1, 2] and Ledger.open(dlq).transaction(dlq_app_id(INGEST)) == 1


def test_every_pending_batch_is_rolled_forward_in_batch_order(tables):
    main, dlq = tables
    commit_batch(main, dlq, 1, 0, 10, bad=2)
    commit_batch(main, dlq, 2, 10, 20)
    commit_batch(main, dlq, 3, 20, 30, bad=1)
    # the follow-up of batch 1 goes no further than its own batch
    assert commit_dead_letters_of(Ledger.open(main), INGEST, dlq, upto=1) == 1
    assert sorted(rows(dlq)) == [0, 1]
    assert commit_dead_letters_of(Ledger.open(main), INGEST, dlq) == 1
    assert sorted(rows(dlq)) == [0, 1, 20] and Ledger.open(dlq).transaction(dlq_app_id(INGEST)) == 3


def test_a_table_without_dead_letters_reads_no_history_and_opens_no_dead_letter_table(tables, monkeypatch):
    main, dlq = tables
    commit_batch(main, dlq, 1, 0, 10)
    ledger = Ledger.open(main)
    monkeypatch.setattr(Ledger, "batches", lambda *a, **k: pytest.fail("history read"))
    assert ledger.transaction(dead_letters_app_id(INGEST)) == 0
    shutil.rmtree(dlq)  # not opened: a batch with dead letters would have created it
    monkeypatch.setattr(Ledger, "find_batch", lambda *a, **k: None)  # what an older table's last batch says
    assert commit_dead_letters_of(ledger, INGEST, dlq) == 0


def test_gone_staged_files_fail_in_one_line_naming_what_was_lost_and_how_to_recover(tables):
    main, dlq = tables
    commit_batch(main, dlq, 1, 0, 10, bad=3)
    record = Ledger.open(main).find_batch(INGEST, batch=1)
    assert record is not None and record.meta.findings.dead_letters is not None
    for staged in record.meta.findings.dead_letters.files:  # a VACUUM of the dead-letter table, say
        os.remove(f"{dlq}/{staged.path}")
    with pytest.raises(TableError) as raised:
        commit_dead_letters_of(Ledger.open(main), INGEST, dlq)
    message = str(raised.value)
    assert "\n" not in message
    assert re.search(r"batch 1 .*\(3 records of orders\[0\] 0\.\.10\)", message)
    assert "airflow-eo reprocess --run-key dag/run-1/ingest/-1" in message and "audit" in message
    assert Ledger.open(dlq).transaction(dlq_app_id(INGEST)) == 0 and rows(dlq) == {}


def reprocess_letters(dlq: str, batch: int, start: int, bad: int, attempt: str) -> DeadLetterManifest:
    staged = stage(dlq, batch_plan(batch, start, start + bad, attempt_id=attempt), body="again", files=1)
    return DeadLetterManifest(dlq, staged.files)


def test_a_reprocess_replaces_the_batchs_dead_letters_once(tables):
    main, dlq = tables
    commit_batch(main, dlq, 1, 0, 10, bad=3)
    assert commit_dead_letters_of(Ledger.open(main), INGEST, dlq) == 1
    letters = reprocess_letters(dlq, 1, 0, 2, attempt="r")
    plan = batch_plan(1, 0, 10, attempt_id="r")
    assert commit_reprocessed_dead_letters(Ledger.open(main), plan, 0, letters) is RunStatus.COMMITTED
    assert rows(dlq) == {0: "again0", 1: "again1"}  # the batch's three earlier ones are gone
    assert commit_reprocessed_dead_letters(Ledger.open(main), plan, 0, letters) is RunStatus.ALREADY_COMMITTED
    assert rows(dlq) == {0: "again0", 1: "again1"} and Ledger.open(dlq).reprocess_count(INGEST, 1) == 1


def test_reprocessing_a_batch_whose_dead_letters_were_lost_commits_them_and_unblocks_the_roll_forward(tables):
    main, dlq = tables
    commit_batch(main, dlq, 1, 0, 10, bad=3)
    record = Ledger.open(main).find_batch(INGEST, batch=1)
    for staged in record.meta.findings.dead_letters.files:
        os.remove(f"{dlq}/{staged.path}")
    with pytest.raises(TableError):
        commit_dead_letters_of(Ledger.open(main), INGEST, dlq)
    letters = reprocess_letters(dlq, 1, 0, 3, attempt="r")
    commit_reprocessed_dead_letters(Ledger.open(main), batch_plan(1, 0, 10, attempt_id="r"), 0, letters)
    assert sorted(rows(dlq)) == [0, 1, 2] and Ledger.open(dlq).transaction(dlq_app_id(INGEST)) == 1
    assert commit_dead_letters_of(Ledger.open(main), INGEST, dlq) == 0  # nothing pending any more
