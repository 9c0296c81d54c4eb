"""One table's batch in the driver: steps 2-5 of a recorded attempt, over the records the attempt's
one read gave it (:mod:`airflow_eo.driver.tables` reads once for every table of the attempt, a single
table's too, and runs this per table).

1. **read** the plan's ranges (:mod:`airflow_eo.driver.source`, read_committed: done by the one read) —
   a small batch on the direct path in this process, without Spark
   (:attr:`airflow_eo.driver.direct.DirectStage.in_driver`);
2. **decode** keys and values (:mod:`airflow_eo.decoding` in the read step, JSON by
   :mod:`airflow_eo.driver.decode`), undecodable records to the dead-letter table
   (:mod:`airflow_eo.driver.dead_letters`);
3. **filter and transform** them into the table's columns (:mod:`airflow_eo.driver.transforms`);
4. **stage** Parquet files into the attempt's own directory (:mod:`airflow_eo.driver.writer`);
5. **compare-and-set commit** the files with the offsets in one Delta commit, then
   **verify** it in the log (:func:`airflow_eo.table.commit.commit`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_eo.attempt import TIMESTAMP_COLUMN, Attempt, AttemptKind, Secrets
from airflow_eo.driver.cdc import decoding_attempt
from airflow_eo.driver.constraints import enforce
from airflow_eo.driver.direct import DirectStage
from airflow_eo.driver.stages import spark_stage
from airflow_eo.driver.lateness import late_records
from airflow_eo.driver.progress import Progress
from airflow_eo.driver.transforms import apply_transform, keep
from airflow_eo.driver.writer import stage
from airflow_eo.faults import failpoint
from airflow_eo.sinks import Sink, sink_of
from airflow_eo.sinks.dead_letters import DeadLetterSink
from airflow_eo.table.commit import ALREADY_COMMITTED, COMMITTED, CommitOutcome, StagedBatch, commit
from airflow_eo.table.features import TableFeatures
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import BatchFindings, DeadLetterManifest, LateRecords
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.files import StagedFile

if TYPE_CHECKING:
    from airflow_eo.driver.dead_letters import DeadLetters

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Staged:
    """Steps 1-4's outcome: the staged files and what the commit records beside them."""

    files: list[StagedFile]
    rows: dict[str, int]
    arrow_schema: pa.Schema
    planned: float  # when the read was planned (monotonic): the phase timings
    reader_schemas: tuple = ()
    dead: "DeadLetters | None" = None
    dropped: int | None = None
    late: dict | None = None
    extra: object = None  # what the sink's commit rule takes beside the files (a merge's file swap)
    notes: tuple[str, ...] = ()  # what the sink's stage step reports (one line each)


@dataclass(frozen=True)
class SharedRead:
    """One table's records from its attempt's one read (:mod:`airflow_eo.driver.tables`): for a table
    whose rows the read tasks wrote themselves (``direct``: the direct path), its staged files and rows;
    else its share of the records (its own ranges, decoded) and the reader schemas they were decoded with."""

    source: object = None  # a DataFrame
    reader_schemas: tuple = ()
    staged: "tuple[list[StagedFile], dict[str, int]] | None" = None
    direct: DirectStage | None = None
    started: float = 0.0  # when the read was planned (monotonic): the phase timings


def run_staged_attempt(spark, attempt: Attempt, secrets: Secrets, staging: StagingArea,
                       shared: SharedRead) -> CommitOutcome:
    """Steps 2-5 of one table's attempt on ``shared``, its records from the attempt's one read."""
    started = shared.started or time.monotonic()
    plan, storage_options = attempt.plan, secrets.storage_options
    planned_offsets = sum(r.size for r in plan.data_ranges)
    features = features_of(attempt, storage_options)
    sink = sink_of(attempt.spec.sink)
    if shared.direct is not None and shared.staged is not None:  # the read tasks wrote its rows
        files, rows = shared.staged
        late = None
        if plan.interval is not None and attempt.kind is AttemptKind.INGEST:
            late = late_records(files, staging.loc, shared.direct.arrow_schema, plan.interval.start_ms, None)
        out = Staged(files, rows, shared.direct.arrow_schema, time.monotonic(), late=late)
    else:
        out = _stage_with_spark(spark, attempt, secrets, staging, planned_offsets, features, sink, shared)
    staged = time.monotonic()
    # phase timings: where a run's time goes (README "Performance")
    log.info("batch %s: read+transform planned in %.2fs; read, transformed and staged %d rows in %d file(s) "
             "in %.2fs", plan.batch, out.planned - started, sum(out.rows.values()), len(out.files),
             staged - out.planned)
    for note in out.notes:
        log.info("batch %s: %s", plan.batch, note)
    failpoint("after_stage")
    failpoint("before_commit")
    batch = StagedBatch(plan, tuple(out.files), out.rows, out.arrow_schema, attempt.partition_by, features)
    if out.late is not None:  # records that arrived after their interval (airflow_eo.driver.lateness)
        log.info("batch %s: interval %s, %d late record(s)", plan.batch, plan.interval, out.late["records"])
    # what the commit records beside the rows: the one builder the quiet-interval commit uses too
    findings = sink.findings(attempt, DeadLetterManifest.from_dict(out.dead.manifest()) if out.dead else None,
                             out.dropped, LateRecords(**out.late) if out.late is not None else None,
                             out.reader_schemas)
    outcome = commit_staged(attempt, staging, batch, findings, storage_options, out.extra, sink)
    log.info("batch %s: %s (compare-and-set commit and verify) in %.2fs", plan.batch, outcome.status,
             time.monotonic() - staged)
    if outcome.status == ALREADY_COMMITTED:
        log.info("batch %s was already committed by an earlier attempt", plan.batch)
    return outcome


def features_of(attempt: Attempt, storage_options) -> TableFeatures:
    """The table's features the batch's rows are checked and written by (constraints, generated
    columns, column mapping): as the run planned them (carried by the attempt: no second open of
    the table here; the commit compares them with its own snapshot), or, for an attempt that
    carries none, from the table now."""
    if attempt.features is not None:
        return TableFeatures.of_pinned(attempt.features)
    return Ledger.open(attempt.table_uri, storage_options).features


def _stage_with_spark(spark, attempt: Attempt, secrets: Secrets, staging: StagingArea,
                      planned_offsets: int, features: TableFeatures, sink: Sink, shared: SharedRead) -> Staged:
    """Steps 1-4 through Spark: read, decode, what the sink's write mode does before the transform,
    transform, what it does after, check the table's rules (:mod:`airflow_eo.driver.constraints`),
    stage (the sink's Spark step: :mod:`airflow_eo.driver.stages`)."""
    from airflow_eo.driver.dead_letters import DeadLetters

    plan, storage_options, location = attempt.plan, secrets.storage_options, staging.loc
    decoding = decoding_attempt(attempt)  # Debezium JSON: the envelope's DDL around the row's
    source, reader_schemas = shared.source, shared.reader_schemas
    dead = DeadLetters.of(source, decoding, secrets, features.enforced, sink.sends_dead_letters)  # None: none may
    step = spark_stage(sink, attempt, staging, features, dead, storage_options)
    view = f"source_{attempt.attempt_id}"  # the attempt's own: a warm session may be shared
    with Progress(spark, plan.batch, planned_offsets):  # Spark itself is at WARN
        try:
            if dead is not None:
                source = dead.good
            source = keep(attempt.transform.filter, source)
            source = step.source(source)
            out = apply_transform(attempt.transform, source, view, attempt.partition_by)
            out, deleted = step.output(out)
            # the table's rules: violating records to the dead letters, or counted by the write
            out, enforced = enforce(out, features, attempt, dead, deleted)
            if dead is not None:
                dead.stage(stage)  # undecodable records (duplicates, violations): staged beside the dead-letter table
            arrow_schema = step.arrow_schema(out)
            planned = time.monotonic()
            files = step.write(out, arrow_schema, stage)
            enforced.raise_if_violated()  # before anything is committed
            dropped = step.dropped(planned_offsets)
            late = None
            if plan.interval is not None and attempt.kind is AttemptKind.INGEST:
                # before the dead letters' cached rows are released: without a timestamp column
                # the count reads the batch again
                in_files, records = step.late_inputs(arrow_schema, source)
                late = late_records(files, location, in_files, plan.interval.start_ms, records,
                                    features.names.physical(TIMESTAMP_COLUMN))
        finally:  # leave nothing behind in the session: no view, no cached rows
            if dead is not None:
                dead.release()
            step.release()
            if attempt.transform.sql:
                spark.catalog.dropTempView(view)
    return Staged(files, step.rows(files), arrow_schema, planned, reader_schemas, dead, dropped, late, step.extra,
                  tuple(step.notes))


def commit_staged(attempt: Attempt, staging: StagingArea, batch: StagedBatch, findings: BatchFindings,
                  storage_options: dict | None, extra: object = None, sink: Sink | None = None) -> CommitOutcome:
    """Step 5: the compare-and-set commit of what ``attempt`` staged, by its sink's rule for the
    attempt's kind (``extra``: what the sink's stage step handed on); its dead letters follow it. Then its marker says whether it committed."""
    uri = staging.loc.uri
    sink = sink or sink_of(attempt.spec.sink)
    outcome = commit(sink.rule(batch, attempt, findings, extra), uri, storage_options)
    # the main commit decided: its dead letters follow (or an earlier attempt's; a reprocess's replace the batch's)
    DeadLetterSink.follow(attempt, findings, uri, outcome.batch, storage_options)
    staging.end_attempt(attempt.attempt_id, committed=outcome.status == COMMITTED)
    return outcome
