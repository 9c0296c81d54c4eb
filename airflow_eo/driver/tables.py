"""A recorded attempt's tables over one read: the one way the driver runs a batch.

The ingest loop (:mod:`airflow_eo.loop.ingest`) records one attempt per table beside its table; the first
names the others (:attr:`airflow_eo.attempt.Attempt.companions`; a single table's names none) and is the
one Spark runs. Here the union of their planned ranges is read once and each table takes its own
ranges of it through its steps (:func:`airflow_eo.driver.batch.run_staged_attempt`): filter, transform,
stage, its own compare-and-set commit.

How the one read serves its tables (:func:`run_tables`):

* the tables whose rows Spark need not see (no decoding, an identity or a projection of the Kafka
  columns: :class:`~airflow_eo.driver.direct.DirectStage`) are written by the read tasks themselves,
  each task writing every such table's share of what it read; a batch within
  ``driver_read_max_offsets`` whose tables are all such is read by this process itself, no Spark job;
* the other tables take their records from the same read: when the read is shared, from Parquet the
  read tasks staged (a raw append's own files, or a copy beside the first such table's attempt:
  :func:`~airflow_eo.driver.direct.feed_for`), since caching the read's rows in Spark cost more than
  reading Kafka again; decoded records for several tables from Spark's cache; a lone Spark table reads
  Kafka in its own job. Their Spark steps run side by side (one thread each, concurrent Spark jobs),
  as do the direct tables' commits after the first, not one after another.

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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from airflow_eo.attempt import Attempt, Secrets
from airflow_eo.driver.cdc import decoding_attempt
from airflow_eo.driver.batch import SharedRead, features_of, run_staged_attempt
from airflow_eo.driver.direct import Destination, DirectStage, feed_for, feed_frame, read_for_tables, remove_feed
from airflow_eo.driver.progress import Progress
from airflow_eo.driver.source import read_plan
from airflow_eo.driver.writer import staged_from_reports
from airflow_eo.core.errors import error_line
from airflow_eo.faults import failpoint
from airflow_eo.logs import about_table
from airflow_eo.core.offsets import OffsetRange
from airflow_eo.table.commit import CommitOutcome
from airflow_eo.table.features import TableFeatures
from airflow_eo.table.staging import Heartbeat, StagingArea
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)
COMMITS_AT_ONCE = 8  # staged tables committed side by side (each commit waits on its own table's log, not on the others)


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


@dataclass
class _Commits:
    """How many of the attempt's tables have yet to commit (the ``between_sink_commits`` failpoint fires
    after a commit when another is still to come, whichever read group or thread it is in)."""

    left: int
    lock: threading.Lock = field(default_factory=threading.Lock)

    def done(self) -> None:
        with self.lock:
            self.left -= 1
            more = self.left > 0
        if more:
            failpoint("between_sink_commits")


def run_tables(spark, first: Attempt, secrets: Secrets) -> CommitOutcome:
    """Run ``first`` and its companions: one read per group of tables that decode alike, then each
    table's steps 2-5. Returns ``first``'s outcome; raises the first table's error after every
    other table had its turn. ``spark`` may be None when the driver reads the batch itself
    (:func:`needs_spark`)."""
    attempts = attempts_of(first, secrets.storage_options)
    for attempt, staging in attempts:
        staging.driver_started(attempt.attempt_id)  # from here on, this process commits or nobody does
    outcomes: dict[str, CommitOutcome] = {}
    errors: list[Exception] = []
    commits = _Commits(len(attempts))
    try:  # the driver renews the heartbeats too: in cluster mode it may outlive the host that submitted it
        with Heartbeat([(s, a.attempt_id) for a, s in attempts], first.spec.table.staging_grace_seconds):
            for group, members in _read_groups([a for a, _ in attempts]):
                _run_group(spark, secrets, group, [(a, s) for a, s in attempts if a.attempt_id in members],
                           outcomes, errors, commits)
        failpoint("after_commit")  # after the last table's commit
    except Exception as exc:  # the read itself failed: no table committed in this attempt
        for attempt, staging in attempts:
            if attempt.attempt_id not in outcomes:
                staging.record_error(attempt.attempt_id, error_line(exc))
        raise
    if errors:
        raise errors[0]
    return outcomes[first.attempt_id]


def attempts_of(first: Attempt, storage_options=None) -> list[tuple[Attempt, StagingArea]]:
    """``first`` and its companions, each with its table's staging area (their markers hold them)."""
    storage = dict(storage_options) if storage_options else None
    attempts = [(first, StagingArea(TableLocation.of(first.table_uri, storage)))]
    for companion in first.companions:
        staging = StagingArea(TableLocation.of(companion.table_uri, storage))
        attempts.append((staging.read_attempt(companion.attempt_id), staging))
    return attempts


def needs_spark(attempts: Sequence[Attempt], features: Callable[[Attempt], TableFeatures | None] = lambda a: None) -> bool:
    """Whether an attempt's one read needs a Spark session: not when each read group is small and every
    table's rows are written by the read tasks (then this process reads them itself). ``features``:
    each table's, as its batch writes by them (constraints and column mapping take the Spark path)."""
    for _, members in _read_groups(list(attempts)):
        group = [a for a in attempts if a.attempt_id in members]
        if not _in_driver(group, {a.attempt_id: DirectStage.of(a, features(a)) for a in group}):
            return True
    return False


def _in_driver(attempts: list[Attempt], direct: dict) -> bool:
    """Whether this process reads the group itself: every table direct, the union within the first's limit."""
    limit = attempts[0].spark.driver_read_max_offsets
    offsets = sum(r.size for r in union_ranges([r for a in attempts for r in a.plan.data_ranges]))
    return all(direct.get(a.attempt_id) is not None for a in attempts) and limit > 0 and offsets <= limit


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
               outcomes: dict[str, CommitOutcome], errors: list[Exception], commits: _Commits) -> None:
    # imported here: the registry client it imports is ~0.2 s of every warm command that needs none
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
    through_spark = [(a, s) for a, s in attempts if a.attempt_id not in direct]
    in_driver = _in_driver([a for a, _ in attempts], direct)
    offsets = sum(r.size for r in ranges)
    if spark is None and not in_driver:
        raise ValueError(f"batch {first.plan.batch} needs Spark ({offsets} offsets; the driver reads a direct batch "
                         f"of at most {first.spark.driver_read_max_offsets} itself) but was given no session")
    feed = feed_for([a for a, _ in through_spark], ranges, destinations, through_spark[0][1] if through_spark else None,
                    decoder is None)
    copy = feed if feed not in destinations else None  # a copy of the read's own: removed at the end
    if copy is not None:
        destinations = [*destinations, copy]
    started = time.monotonic()
    failpoint("before_read")
    if in_driver:
        log.info("batch %s: %d offsets (driver_read_max_offsets %d): the driver reads and stages them itself, no "
                 "Spark job", first.plan.batch, offsets, first.spark.driver_read_max_offsets)
    reports: list[list[dict]] = []
    source = held = None  # the records for the Spark steps; a cached frame they come from, unpersisted at the end
    if destinations:
        with Progress(None if in_driver else spark, first.plan.batch, offsets):
            reports = read_for_tables(None if in_driver else spark, ranges, dict(secrets.kafka_config),
                                      first.spark.max_offsets_per_task, storage, destinations)
    elif through_spark:
        source = read_plan(spark, ranges, dict(secrets.kafka_config), first.spark.max_offsets_per_task, decoder=decoder)
        if len(through_spark) > 1:  # decoded records, for more than one table: computed once
            from pyspark import StorageLevel  # here: a batch the driver reads itself imports no pyspark

            source = held = source.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        if len(attempts) > 1 or destinations:
            log.info("read %s once for %d table(s) in %.2fs (%d written by the read tasks%s)",
                     ", ".join(str(r) for r in ranges) or "offsets only", len(attempts), time.monotonic() - started,
                     len(direct), "; the others read their staged copy" if feed is not None else "")
        staged = {d.target: staged_from_reports(TableLocation.of(d.table_uri, storage), d.target, r)
                  for d, r in zip(destinations, reports)}
        if feed is not None:
            source = feed_frame(spark, feed, staged[feed.target][0], storage)
        shares = {}
        for attempt, staging in attempts:
            own = tuple(attempt.plan.data_ranges)
            if attempt.attempt_id in direct:
                shares[attempt.attempt_id] = SharedRead(reader_schemas=pinned, staged=staged[staging.attempt_path(
                    attempt.plan)], direct=direct[attempt.attempt_id], started=started)
            else:
                assert source is not None  # the read's records, for the tables through Spark
                shares[attempt.attempt_id] = SharedRead(source if own == ranges else source.where(ranges_condition(own)),
                                                        pinned, started=started)

        def run_one(attempt: Attempt, staging: StagingArea) -> None:
            with about_table(attempt.table_uri):
                try:
                    outcomes[attempt.attempt_id] = run_staged_attempt(spark, attempt, secrets, staging,
                                                                      shares[attempt.attempt_id])
                except Exception as exc:  # this table stays behind; the others go on
                    staging.record_error(attempt.attempt_id, error_line(exc))
                    log.error("batch %s failed, the other tables go on: %s", attempt.plan.batch, error_line(exc))
                    errors.append(exc)
                    return
            commits.done()

        # their files are staged, only their commits are left: the first alone (a kill after it always leaves a
        # table committed and the others not, the between_sink_commits failpoint), then the rest side by side
        staged_tables = [(a, s) for a, s in attempts if a.attempt_id in direct]
        for attempt, staging in staged_tables[:1]:
            run_one(attempt, staging)
        if len(staged_tables) > 1:
            _at_once(run_one, staged_tables[1:], COMMITS_AT_ONCE, "airflow-eo-commit")
        if len(through_spark) > 1:  # side by side: concurrent Spark jobs over the one read (its staged copy, or cached)
            _at_once(run_one, through_spark, len(through_spark), "airflow-eo-sink")
        else:
            for attempt, staging in through_spark:
                run_one(attempt, staging)
    finally:
        if held is not None:  # a warm server keeps nothing of a batch once its tables are done
            held.unpersist()
        if copy is not None:
            remove_feed(copy, storage)


def _at_once(run: Callable[[Attempt, StagingArea], None], attempts: list[tuple[Attempt, StagingArea]],
             workers: int, name: str) -> None:
    """``run`` for each of ``attempts``, up to ``workers`` at once (each records its own table's error)."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) as pool:
        for future in [pool.submit(run, a, s) for a, s in attempts]:
            future.result()
