"""The compare-and-set commit (airflow_eo.table.commit) on temporary Delta tables, with staged
Parquet files written by pyarrow instead of Spark; and what deltalake itself detects underneath."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_eo.core.errors import CommitConflictError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.sinks.append import BatchCommit, ReprocessCommit
from airflow_eo.sinks.dead_letters import DeadLetterCommit, ensure_table
from airflow_eo.table.commit import ALREADY_COMMITTED, COMMITTED, StagedBatch, commit
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.app_ids import dlq_app_id
from airflow_eo.table.staging import StagingArea, attempt_dir_name
from airflow_eo.table.storage import TableLocation


def test_deltalake_conflict_detection_on_txn_app_ids(tmp_path):
    """What delta-rs catches by itself: same txn appId from one snapshot conflicts;
    disjoint appIds are rebased and both land (hence every batch writes every txn)."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"x": [1]}))
    a, b = DeltaTable(uri), DeltaTable(uri)
    schema = a.schema()
    a.create_write_transaction([], "append", schema, commit_properties=CommitProperties(app_transactions=[Transaction("p0", 10)]))
    with pytest.raises(CommitFailedError):
        b.create_write_transaction([], "append", schema, commit_properties=CommitProperties(app_transactions=[Transaction("p0", 10)]))
    c = DeltaTable(uri)
    d = DeltaTable(uri)
    c.create_write_transaction([], "append", schema, commit_properties=CommitProperties(app_transactions=[Transaction("p1", 5)]))
    d.create_write_transaction([], "append", schema, commit_properties=CommitProperties(app_transactions=[Transaction("p2", 5)]))
    final = DeltaTable(uri)
    assert (final.transaction_version("p1"), final.transaction_version("p2")) == (5, 5)


INGEST = "orders_raw"
RUN1, RUN2 = RunIdentity("dag/run-1/ingest/-1"), RunIdentity("dag/run-2/ingest/-1")
SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("body", pa.string())])


def batch_plan(batch: int, start: int, end: int, run: RunIdentity = RUN1, attempt_id: str = "a1") -> BatchPlan:
    r = OffsetRange("orders", 0, start, end)
    return BatchPlan(INGEST, batch, (r,), run, new_partitions=(r.tp,) if batch == 1 else (),
                     planned_at="2026-11-24T00:00:00+00:00", attempt_id=f"{attempt_id}{batch:014d}")


def stage(uri: str, plan: BatchPlan, body: str = "v", files: int = 2) -> StagedBatch:
    """Parquet files of the plan's offsets in the attempt's directory, as the driver stages them."""
    staging = StagingArea(TableLocation.of(uri))
    directory = staging.attempt_path(plan)
    offsets = list(range(plan.ranges[0].start, plan.ranges[0].end))
    staging.loc.fs.create_dir(directory, recursive=True)
    for i in range(files):
        part = offsets[i::files]
        table = pa.table({"topic": ["orders"] * len(part), "partition": pa.array([0] * len(part), pa.int32()),
                          "offset": pa.array(part, pa.int64()), "body": [f"{body}{o}" for o in part]}, schema=SCHEMA)
        pq.write_table(table, f"{directory}/part-{i}.parquet", filesystem=staging.loc.fs)
    staged = staging.staged_files(directory)
    return StagedBatch(plan, tuple(staged), staging.rows_per_partition(staged), SCHEMA)


def rows(uri: str) -> dict[int, str]:
    """offset → body of the table's current snapshot (read file by file: no Delta reader at exit)."""
    out = {}
    for path in DeltaTable(uri).file_uris():
        t = pq.read_table(path)
        out.update(zip(t["offset"].to_pylist(), t["body"].to_pylist()))
    return out


def test_a_batch_commit_creates_the_table_and_sets_offsets_counter_and_metadata(tmp_path):
    uri = str(tmp_path / "t")
    first = stage(uri, batch_plan(1, 0, 10))
    outcome = commit(BatchCommit(first), uri)
    assert (outcome.status, outcome.batch, outcome.version, outcome.rows) == (COMMITTED, 1, 0, 10)
    assert outcome.rows_per_partition == {"orders[0]": 10}
    ledger = Ledger.open(uri)
    assert ledger.committed_offsets(INGEST, [first.plan.ranges[0].tp]) == {first.plan.ranges[0].tp: 10}
    assert ledger.last_batch(INGEST) == 1 and rows(uri) == {o: f"v{o}" for o in range(10)}
    record = ledger.find_batch(INGEST, batch=1)
    assert (record.meta.rows, record.meta.run_key, record.meta.ranges) == (10, RUN1.run_key, first.plan.ranges)
    assert all(p.startswith(attempt_dir_name(first.plan) + "/") for p in ledger.file_paths())


def test_a_replayed_commit_commits_nothing_and_a_stale_plan_conflicts(tmp_path):
    uri = str(tmp_path / "t")
    first = stage(uri, batch_plan(1, 0, 10))
    commit(BatchCommit(first), uri)
    again = commit(BatchCommit(first), uri)  # the same attempt twice (a duplicated Spark job)
    assert (again.status, again.version) == (ALREADY_COMMITTED, 0)
    retry = commit(BatchCommit(stage(uri, batch_plan(1, 0, 10, attempt_id="a2"))), uri)  # a retry of the run
    assert retry.status == ALREADY_COMMITTED
    with pytest.raises(CommitConflictError):  # another run planned the same offsets: it lost the race
        commit(BatchCommit(stage(uri, batch_plan(1, 0, 10, run=RUN2, attempt_id="a3"))), uri)
    with pytest.raises(CommitConflictError):  # a plan made before batch 1 landed
        commit(BatchCommit(stage(uri, batch_plan(2, 5, 12, run=RUN2))), uri)
    assert DeltaTable(uri).version() == 0 and len(rows(uri)) == 10


def test_the_next_batch_appends(tmp_path):
    uri = str(tmp_path / "t")
    commit(BatchCommit(stage(uri, batch_plan(1, 0, 10))), uri)
    outcome = commit(BatchCommit(stage(uri, batch_plan(2, 10, 15, run=RUN2))), uri)
    assert (outcome.status, outcome.version, outcome.rows) == (COMMITTED, 1, 5)
    assert sorted(rows(uri)) == list(range(15)) and Ledger.open(uri).last_batch(INGEST) == 2


def test_a_reprocess_replaces_one_batchs_rows_and_leaves_the_offsets(tmp_path):
    uri = str(tmp_path / "t")
    commit(BatchCommit(stage(uri, batch_plan(1, 0, 10))), uri)
    commit(BatchCommit(stage(uri, batch_plan(2, 10, 15, run=RUN2))), uri)
    redo = stage(uri, batch_plan(1, 0, 10, attempt_id="r1"), body="NEW", files=1)
    outcome = commit(ReprocessCommit(redo, reprocess_from=0, requested_by=RunIdentity("dag/fix/ingest/-1")), uri)
    assert outcome.status == COMMITTED
    after = rows(uri)
    assert after == {**{o: f"NEW{o}" for o in range(10)}, **{o: f"v{o}" for o in range(10, 15)}}
    ledger = Ledger.open(uri)
    assert ledger.reprocess_count(INGEST, 1) == 1 and ledger.last_batch(INGEST) == 2
    assert ledger.committed_offsets(INGEST, [redo.plan.ranges[0].tp]) == {redo.plan.ranges[0].tp: 15}
    with pytest.raises(CommitConflictError):  # the counter moved on: a second reprocess from 0 lost
        commit(ReprocessCommit(stage(uri, batch_plan(1, 0, 10, attempt_id="r2")), reprocess_from=0), uri)


def test_a_compaction_racing_a_reprocess_leaves_each_row_once(tmp_path, monkeypatch):
    """The reprocess removes the batch's files by what its snapshot holds: a compaction landing
    in between (which deltalake would rebase the reprocess over without a conflict) makes it
    compare again on the compacted snapshot and rewrite the compacted file instead."""
    uri = str(tmp_path / "t")
    commit(BatchCommit(stage(uri, batch_plan(1, 0, 10))), uri)
    commit(BatchCommit(stage(uri, batch_plan(2, 10, 15, run=RUN2))), uri)
    redo = stage(uri, batch_plan(1, 0, 10, attempt_id="r1"), body="NEW", files=1)
    compacted = []

    def compaction_in_the_window(name):
        if name == "during_commit" and not compacted:
            compacted.append(DeltaTable(uri).optimize.compact())

    monkeypatch.setattr("airflow_eo.table.commit.failpoint", compaction_in_the_window)
    assert commit(ReprocessCommit(redo, reprocess_from=0), uri).status == COMMITTED
    assert compacted[0]["numFilesRemoved"] == 4
    offsets = [o for path in DeltaTable(uri).file_uris() for o in pq.read_table(path)["offset"].to_pylist()]
    assert sorted(offsets) == list(range(15))
    assert rows(uri) == {**{o: f"NEW{o}" for o in range(10)}, **{o: f"v{o}" for o in range(10, 15)}}


def test_dead_letters_land_once_per_batch(tmp_path):
    dlq = str(tmp_path / "dlq")
    ensure_table(dlq, SCHEMA)  # created when a batch first stages dead letters
    letters = stage(dlq, batch_plan(1, 0, 4), body="bad")
    assert commit(DeadLetterCommit(letters), dlq).status == COMMITTED
    assert commit(DeadLetterCommit(letters), dlq).status == ALREADY_COMMITTED
    assert Ledger.open(dlq).transaction(dlq_app_id(INGEST)) == 1 and len(rows(dlq)) == 4


def test_a_commit_whose_staged_files_are_gone_commits_nothing_and_is_retried(tmp_path):
    from airflow_eo.core.errors import StagedFilesMissingError

    uri = str(tmp_path / "t")
    staged = stage(uri, batch_plan(1, 0, 10))
    os.remove(f"{uri}/{staged.files[0].path}")  # another host's run took the attempt for dead
    with pytest.raises(StagedFilesMissingError, match=r"1 of the 2 file\(s\) batch 1 staged .* are gone") as raised:
        commit(BatchCommit(staged), uri)
    assert raised.value.retryable and not Ledger.open(uri).exists
