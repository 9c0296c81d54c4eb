"""Interval batches are keyed by their interval: a commit rebases onto intervals that landed since it
was planned (airflow_eo.table.commit._rebase), only two runs of one interval conflict; and a table's
first commit lands only once, however many runs race to create it. On temporary Delta tables,
staged Parquet written by pyarrow."""

import threading
from dataclasses import replace

import pytest
from deltalake import DeltaTable

import airflow_eo.table.commit as commit_module
from airflow_eo.core.errors import CommitConflictError, TableFeatureError
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.core.offsets import Interval, OffsetRange, RunIdentity, TopicPartition
from airflow_eo.sinks.append import BatchCommit
from airflow_eo.table.commit import ALREADY_COMMITTED, COMMITTED, commit
from airflow_eo.table.files import StagedFile
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger, batch_of_path
from airflow_eo.table.metadata import BatchFindings, DeadLetterManifest, Duplicates
from tests.delta_tables import add_features, duckdb_rows, log_digest
from tests.unit.table.test_commit import INGEST, RUN1, RUN2, batch_plan, rows, stage

TP = TopicPartition("orders", 0)


def interval_plan(batch: int, start: int, end: int, hour: int, run: RunIdentity = RUN1, attempt: str = "a") -> BatchPlan:
    """The plan of the interval [hour, hour + 1) (as epoch ms 0, 1, … for brevity) owning offsets [start, end)."""
    return BatchPlan(INGEST, batch, (OffsetRange("orders", 0, start, end),), run, interval=Interval(hour, hour + 1),
                     attempt_id=f"{attempt}{hour:015d}")


def test_an_interval_planned_before_another_landed_commits_as_the_next_batch(tmp_path):
    uri = str(tmp_path / "t")
    first, second = interval_plan(1, 0, 10, hour=0), interval_plan(1, 10, 20, hour=1, run=RUN2)  # both from an empty table
    assert commit(BatchCommit(stage(uri, first)), uri).status == COMMITTED
    outcome = commit(BatchCommit(stage(uri, second)), uri)
    assert (outcome.status, outcome.batch, outcome.version) == (COMMITTED, 2, 1)  # rebased: no conflict, no Spark again
    ledger = Ledger.open(uri)
    assert ledger.last_batch(INGEST) == 2 and sorted(rows(uri)) == list(range(20))
    intervals = IntervalLedger(ledger, INGEST)
    assert [(c.batch, c.interval) for c in intervals.committed()] == [(1, Interval(0, 1)), (2, Interval(1, 2))]
    assert intervals.span() == (0, 2) and ledger.committed_offsets(INGEST, [TP]) == {TP: 20}
    assert (intervals.boundary(1, TP), intervals.boundary(2, TP)) == (10, 20)
    # its files moved to the directory of the batch it became: reprocess and dedup find them by that number
    record = ledger.find_batch(INGEST, batch=2)
    assert (record.meta.planned_batch, record.meta.run_key, record.meta.ranges) == (1, RUN2.run_key, second.ranges)
    whole, mixed = ledger.files_of_batch(2, second.ranges)
    assert whole and not mixed and {batch_of_path(p) for p in whole} == {2}
    assert {batch_of_path(p) for p in ledger.files_of_batch(1, first.ranges)[0]} == {1}
    assert ledger.find_batch(INGEST, batch=1).meta.planned_batch is None  # not rebased: as earlier versions wrote it
    # the logged plan (batch 1) of the rebased run: committed, under batch 2 (a retry reports it, starts nothing)
    assert ledger.state_of(second) is CommitCheck.ALREADY_COMMITTED and ledger.committed_plan(second).batch == 2
    assert commit(BatchCommit(stage(uri, second)), uri).status == ALREADY_COMMITTED


def test_only_two_runs_of_one_interval_conflict_and_the_loser_finds_it_committed(tmp_path):
    uri = str(tmp_path / "t")
    commit(BatchCommit(stage(uri, interval_plan(1, 0, 10, hour=0))), uri)
    loser = interval_plan(1, 0, 10, hour=0, run=RUN2, attempt="b")  # the same interval, another run, same snapshot
    outcome = commit(BatchCommit(stage(uri, loser)), uri)
    assert outcome.status == ALREADY_COMMITTED and DeltaTable(uri).version() == 0 and len(rows(uri)) == 10
    ledger = Ledger.open(uri)
    assert ledger.state_of(loser) is CommitCheck.ALREADY_COMMITTED
    assert ledger.find_batch(INGEST, batch=ledger.committed_plan(loser).batch).meta.run_key == RUN1.run_key


def test_a_plan_whose_boundaries_a_neighbour_fixed_otherwise_conflicts(tmp_path):
    uri = str(tmp_path / "t")
    commit(BatchCommit(stage(uri, interval_plan(1, 0, 10, hour=1))), uri)  # fixes B(1) = 0 and B(2) = 10
    for plan in (interval_plan(1, 11, 20, hour=2),  # starts at 11, the table says B(2) = 10
                 interval_plan(1, 0, 3, hour=0),  # ends at 3, the table says B(1) = 0
                 interval_plan(1, 8, 12, hour=4)):  # starts below B(2) = 10, a boundary before it
        with pytest.raises(CommitConflictError, match="no longer fits"):
            commit(BatchCommit(stage(uri, plan)), uri)
    assert DeltaTable(uri).version() == 0
    overlapping = BatchPlan(INGEST, 1, (OffsetRange("orders", 0, 10, 20),), RUN2, interval=Interval(1, 3))
    assert Ledger.open(uri).state_of(overlapping) is CommitCheck.CONFLICT


@pytest.mark.parametrize("findings", [
    BatchFindings(dead_letters=DeadLetterManifest("/dlq", (StagedFile("b00000001-x/d.parquet", 1, 0, 1, "{}"),))),
    BatchFindings(duplicates=Duplicates(0)),
], ids=["dead letters", "dedup"])
def test_a_batch_whose_rows_depend_on_the_table_it_read_is_not_rebased(tmp_path, findings):
    uri = str(tmp_path / "t")
    commit(BatchCommit(stage(uri, interval_plan(1, 0, 10, hour=0))), uri)
    with pytest.raises(CommitConflictError, match="not rebased") as lost:
        commit(BatchCommit(stage(uri, interval_plan(1, 10, 20, hour=1)), findings=findings), uri)
    assert lost.value.retryable and Ledger.open(uri).last_batch(INGEST) == 1
    # planned on the table as it is, it commits
    assert commit(BatchCommit(stage(uri, interval_plan(2, 10, 20, hour=1)), findings=findings), uri).status == COMMITTED


def test_a_rebased_batch_is_checked_against_the_features_of_the_table_it_commits_on(tmp_path):
    """A rebase happens on the snapshot the commit is made on, after that snapshot's feature checks: a
    constraint another engine added while the batch ran is a retryable conflict, rebased or not."""
    uri = str(tmp_path / "t")
    commit(BatchCommit(stage(uri, interval_plan(1, 0, 10, hour=0))), uri)
    late = interval_plan(1, 10, 20, hour=1, run=RUN2)  # planned from the empty table: rebased if it commits
    staged = replace(stage(uri, late), features=Ledger.open(uri).features)
    DeltaTable(uri).alter.add_constraint({"offset_small": "`offset` < 150"})
    before = log_digest(uri)
    with pytest.raises(CommitConflictError, match="constraints, generated columns.* changed while batch 1 ran") as lost:
        commit(BatchCommit(staged), uri)
    assert lost.value.retryable and log_digest(uri) == before
    # its retry, checked against the table's rules as they are now, is rebased and lands
    retry = interval_plan(1, 10, 20, hour=1, run=RUN2, attempt="r")
    outcome = commit(BatchCommit(replace(stage(uri, retry), features=Ledger.open(uri).features)), uri)
    assert (outcome.status, outcome.batch) == (COMMITTED, 2)
    assert [r[0] for r in duckdb_rows(uri, 'SELECT "offset" FROM t ORDER BY "offset"')] == list(range(20))


def test_a_rebased_batch_on_a_table_with_features_it_cannot_write_is_refused_not_retried(tmp_path, monkeypatch):
    """rowTracking turned on by another engine: the rebase's snapshot refuses the append before anything is
    renamed; and where the engine itself refuses the write (the window after the check), the rebase loop
    does not take it for a lost race to another interval."""
    uri = str(tmp_path / "t")
    commit(BatchCommit(stage(uri, interval_plan(1, 0, 10, hour=0))), uri)
    add_features(uri, writer=("rowTracking", "domainMetadata"))
    before = log_digest(uri)
    with pytest.raises(TableFeatureError, match="cannot be used for append"):
        commit(BatchCommit(stage(uri, interval_plan(1, 10, 20, hour=1, run=RUN2))), uri)
    monkeypatch.setattr("airflow_eo.sinks.append.check_features", lambda *a: None)  # the append rule's check
    # rebased (batch 2), then refused without retry: a lost race would end as a CommitConflictError
    with pytest.raises(TableFeatureError, match="refused batch 2's commit.*Unsupported table features"):
        commit(BatchCommit(stage(uri, interval_plan(1, 10, 20, hour=1, run=RUN2, attempt="r"))), uri)
    assert log_digest(uri) == before


def racing(monkeypatch, runs: int):
    """Make ``runs`` threads reach the table's creation together, each from a snapshot without a table."""
    barrier, create = threading.Barrier(runs), commit_module.create_table_with_add_actions

    def together(*args, **kwargs):
        barrier.wait(timeout=30)
        return create(*args, **kwargs)

    monkeypatch.setattr(commit_module, "create_table_with_add_actions", together)


def run_all(jobs) -> list:
    results: list = [None] * len(jobs)

    def run(i):
        try:
            results[i] = jobs[i]()
        except Exception as exc:  # the outcome under test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    return results


def test_two_first_batches_racing_to_create_the_table_land_once(tmp_path, monkeypatch):
    """deltalake 1.6 lands a second create of one table as its next version, txn conflict or not: the
    commit creates with max_commit_retries=0, so the loser fails (and, in offset mode, conflicts)."""
    uri = str(tmp_path / "t")
    staged = [stage(uri, batch_plan(1, 0, 10, run=run, attempt_id=a)) for run, a in ((RUN1, "a"), (RUN2, "b"))]
    racing(monkeypatch, 2)
    results = run_all([lambda s=s: commit(BatchCommit(s), uri) for s in staged])
    assert sorted(type(r).__name__ for r in results) == ["CommitConflictError", "CommitOutcome"]
    assert DeltaTable(uri).version() == 0 and sorted(rows(uri)) == list(range(10))  # each record once


def test_first_intervals_racing_to_create_the_table_all_land(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    staged = [stage(uri, interval_plan(1, 10 * h, 10 * h + 10, hour=h, attempt=f"c{h}")) for h in range(3)]
    racing(monkeypatch, 3)
    results = run_all([lambda s=s: commit(BatchCommit(s), uri) for s in staged])
    assert all(r.status == COMMITTED for r in results), results
    assert sorted(r.batch for r in results) == [1, 2, 3] and sorted(rows(uri)) == list(range(30))
    committed = IntervalLedger(Ledger.open(uri), INGEST).committed()
    assert sorted(c.interval.start_ms for c in committed) == [0, 1, 2] and len({c.batch for c in committed}) == 3
