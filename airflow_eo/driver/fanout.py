"""A fan-out attempt: one read, each table's stage and compare-and-set commit in turn.

The ingest loop (:mod:`airflow_eo.loop.fanout`) records one attempt per table beside its table; the first
names the others (:attr:`airflow_eo.attempt.Attempt.companions`) and is the one Spark runs. Here the
union of their planned ranges is read once (:func:`airflow_eo.driver.source.read_plan`), kept in
Spark's cache, and each table takes its own ranges of it through the steps a single table's batch
takes (:func:`airflow_eo.driver.batch.run_staged_attempt`): filter, transform, stage, its own commit.

Tables whose records decode alike share a read (normally all: decoding is the source's). Two
differences split them: the registry reader schemas a replayed plan pinned earlier than a new one,
and tombstones: in a read that serves a merge sink a null value is a change (a delete), so an append
sink of the same read gets it as a row with null value columns instead of a dead letter.

A table whose batch fails (bad input, a constraint) records its error in its own marker and the
others go on; the job then fails with the first error, and the loop reads each table's outcome from
its log and marker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from airflow_eo.attempt import Attempt, Secrets
from airflow_eo.driver.cdc import decoding_attempt
from airflow_eo.driver.batch import SharedRead, features_of, run_staged_attempt
from airflow_eo.driver.direct import REPORT_COLUMN, Destination, DirectStage, read_for_tables, reports_by_destination
from airflow_eo.driver.writer import staged_from_reports
from airflow_eo.driver.source import read_plan
from airflow_eo.core.errors import error_line
from airflow_eo.faults import failpoint
from airflow_eo.logs import about_table
from airflow_eo.core.offsets import OffsetRange
from airflow_eo.table.commit import CommitOutcome
from airflow_eo.table.staging import Heartbeat, StagingArea
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)


def union_ranges(ranges: list[OffsetRange]) -> tuple[OffsetRange, ...]:
    """Per partition, one range from the lowest start to the highest end of ``ranges``.

    >>> union_ranges([OffsetRange("t", 0, 5, 9), OffsetRange("t", 0, 0, 9), OffsetRange("t", 1, 3, 4)])
    (OffsetRange(topic='t', partition=0, start=0, end=9), OffsetRange(topic='t', partition=1, start=3, end=4))
    """
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for r in ranges:
        start, end = spans.get((r.topic, r.partition), (r.start, r.end))
        spans[(r.topic, r.partition)] = (min(start, r.start), max(end, r.end))
    return tuple(OffsetRange(t, p, s, e) for (t, p), (s, e) in sorted(spans.items()))


def ranges_condition(ranges: tuple[OffsetRange, ...]) -> str:
    """A Spark SQL condition keeping exactly the records of ``ranges`` (topic names are Kafka's
    legal characters: letters, digits, '.', '_', '-').

    >>> ranges_condition((OffsetRange("a.b", 0, 5, 9),))
    "(topic = 'a.b' AND partition = 0 AND offset >= 5 AND offset < 9)"
    """
    return " OR ".join(f"(topic = '{r.topic}' AND partition = {r.partition} AND offset >= {r.start} "
                       f"AND offset < {r.end})" for r in ranges) or "false"


def run_fan_out(spark, first: Attempt, secrets: Secrets) -> CommitOutcome:
    """Run ``first`` and its companions: one read per group of tables that decode alike, then each
    table's steps 2-5. Returns ``first``'s outcome; raises the first table's error after every
    other table had its turn."""
    storage = dict(secrets.storage_options) if secrets.storage_options else None
    attempts = [(first, StagingArea(TableLocation.of(first.table_uri, storage)))]
    for companion in first.companions:
        staging = StagingArea(TableLocation.of(companion.table_uri, storage))
        attempts.append((staging.read_attempt(companion.attempt_id), staging))
    for attempt, staging in attempts:
        staging.driver_started(attempt.attempt_id)  # from here on, this process commits or nobody does
    outcomes: dict[str, CommitOutcome] = {}
    errors: list[Exception] = []
    try:
        if spark is None:
            raise ValueError("a fan-out batch reads through Spark but was given no session")
        groups = _read_groups([a for a, _ in attempts])
        turns = list(range(len(attempts) - 1, -1, -1))  # tables still to come after each one's turn
        with Heartbeat([(s, a.attempt_id) for a, s in attempts], first.spec.table.staging_grace_seconds):
            for columns, members in groups:
                _run_group(spark, secrets, columns, [(a, s) for a, s in attempts if a.attempt_id in members],
                           outcomes, errors, turns)
        failpoint("after_commit")  # after the last table's commit
    except Exception as exc:  # the read itself failed: no table committed in this attempt
        for attempt, staging in attempts:
            if attempt.attempt_id not in outcomes:
                staging.record_error(attempt.attempt_id, error_line(exc))
        raise
    if errors:
        raise errors[0]
    return outcomes[first.attempt_id]


def _read_groups(attempts: list[Attempt]) -> list[tuple[tuple, set[str]]]:
    """The tables that share one read: decoding alike (tombstones aside) with the same pinned reader
    schemas; in the order of ``attempts``. Each group's columns keep tombstones when a sink merges."""
    groups: dict[tuple, set[str]] = {}
    merges: dict[tuple, bool] = {}
    for attempt in attempts:
        decode = decoding_attempt(attempt).decode
        key = (replace(decode, tombstones=False).columns, attempt.plan.reader_schemas)
        groups.setdefault(key, set()).add(attempt.attempt_id)
        merges[key] = merges.get(key, False) or decode.tombstones
    return [((key, merges[key]), members) for key, members in groups.items()]


def _run_group(spark, secrets: Secrets, group: tuple, attempts: list[tuple[Attempt, StagingArea]],
               outcomes: dict[str, CommitOutcome], errors: list[Exception], turns: list[int]) -> None:
    # imported here: the registry client it imports is ~0.2 s of every warm command that needs none
    from pyspark import StorageLevel

    from airflow_eo.decoding.decoder import record_decoder

    (columns, reader_schemas), tombstones = group
    storage = dict(secrets.storage_options) if secrets.storage_options else None
    first = attempts[0][0]
    if tombstones:
        columns = tuple(replace(c, tombstones=True) for c in columns)
    decoder, pinned = record_decoder(columns, secrets.schema_registry, first.plan)
    ranges = union_ranges([r for a, _ in attempts for r in a.plan.data_ranges])
    # the tables whose rows the read tasks write themselves (no decoding: identity or a projection)
    direct = {a.attempt_id: stage for a, _ in attempts if decoder is None
              for stage in [DirectStage.of(a, features_of(a, secrets.storage_options))] if stage is not None}
    destinations = [Destination(a.table_uri, s.attempt_path(a.plan), direct[a.attempt_id].columns, a.partition_by,
                                tuple(a.plan.data_ranges)) for a, s in attempts if a.attempt_id in direct]
    through_spark = len(direct) < len(attempts)
    started = time.monotonic()
    failpoint("before_read")
    if destinations:
        frame = read_for_tables(spark, ranges, dict(secrets.kafka_config), first.spark.max_offsets_per_task,
                                storage, destinations, keep_records=through_spark)
    else:
        frame = read_plan(spark, ranges, dict(secrets.kafka_config), first.spark.max_offsets_per_task, decoder=decoder)
    if through_spark:
        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        if destinations:  # the one read; with tables through Spark, their records are cached by it
            reports = reports_by_destination(frame.where(f"`{REPORT_COLUMN}` IS NOT NULL")
                                             .select(REPORT_COLUMN).collect(), len(destinations))
            source = frame.where(f"`{REPORT_COLUMN}` IS NULL").drop(REPORT_COLUMN)
        else:
            frame.count()
            reports, source = [], frame
        log.info("fan-out: read %s once for %d table(s) in %.2fs (%d written by the read tasks)",
                 ", ".join(str(r) for r in ranges) or "offsets only", len(attempts), time.monotonic() - started,
                 len(destinations))
        staged = {d.target: staged_from_reports(TableLocation.of(d.table_uri, storage), d.target, r)
                  for d, r in zip(destinations, reports)}
        for attempt, staging in attempts:
            own = tuple(attempt.plan.data_ranges)
            if attempt.attempt_id in direct:
                shared = SharedRead(reader_schemas=pinned, staged=staged[staging.attempt_path(attempt.plan)])
            else:
                shared = SharedRead(source if own == ranges else source.where(ranges_condition(own)), pinned)
            with about_table(attempt.table_uri):
                try:
                    outcomes[attempt.attempt_id] = run_staged_attempt(spark, attempt, secrets, staging, shared)
                except Exception as exc:  # this table stays behind; the others go on
                    staging.record_error(attempt.attempt_id, error_line(exc))
                    log.error("batch %s failed, the other tables go on: %s", attempt.plan.batch, error_line(exc))
                    errors.append(exc)
            if turns.pop(0):  # another table's commit comes after this one (in any read group)
                failpoint("between_sink_commits")
    finally:
        if through_spark:
            frame.unpersist()
