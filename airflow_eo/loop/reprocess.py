"""Reprocess a past run: re-read exactly its logged ranges and replace its rows in one commit.

A run's plan is logged before Spark starts (:mod:`airflow_eo.plan_log`), and every attempt
writes into its own directory ``b<batch>-<attempt>/`` that holds only that batch's rows.
So the rows of a past run are exactly the table files under ``b<batch>-*/``, and a
reprocess is one Delta commit that **removes** those files and **adds** the new attempt's
files. The committed offsets and the batch counter do not move; other batches' rows are
not touched; readers see the old rows or the new ones, never both or neither.

Replay safety: each batch has a reprocess counter, a ``txn`` action
``airflow-eo:<ingest_id>:reprocess:<batch>`` that the commit compare-and-sets from *n* to
*n+1*. The request (batch, *n*) is logged per requesting run key before Spark starts, so a
retry of a reprocess replays the same request: if it already committed, the retry reports
that commit and starts nothing; it never replaces the rows twice. Two reprocesses racing
on one batch cannot both land.

The loop side lives here; the commit is :func:`airflow_eo.table.commit.commit` with kind
``REPROCESS``, run by the attempt's driver.

Registry reader schemas are those of the batch's plan (or, for a plan an earlier version logged,
of its commit): the records decode as they did (:mod:`airflow_eo.decoding.reader_schemas`); the
new rows may lack columns schema evolution added since, which read as null there as before.

Refused, with nothing changed: a run whose batch never committed (clear it without
``reprocess`` to replay it), ranges Kafka no longer fully holds, and on a merge table
(``write_mode="merge"``) any batch but the newest: later batches may have changed or deleted
the keys it wrote, so replaying it would put older values over newer ones. The newest batch's
reprocess removes the rows it wrote and merges it again (:class:`~airflow_eo.sinks.merge.MergeReprocessCommit`). After a compaction the
batch's rows are found by its offset ranges, not its original files (the commit rewrites
the files it shares with other batches).

Example::

    >>> Reprocessor(Ingestion(config, submitter)).run(RunIdentity("dag/run/task/-1"))  # doctest: +SKIP
    IngestResult(status='reprocessed', batch=3, version=9, ...)
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from airflow_eo.attempt import Attempt, AttemptKind
from airflow_eo.core.errors import ConfigError, DataLossError
from airflow_eo.loop.ingest import FanOut, FanOutResult, Ingestion, taking_turns
from airflow_eo.loop.result import IngestResult
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.loop.runner import verdict
from airflow_eo.sinks.dead_letters import commit_reprocessed_dead_letters
from airflow_eo.table.features import TableUse
from airflow_eo.table.lease import LeasePurpose
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import CommitKind
from airflow_eo.table.plan_log import ReprocessLog, ReprocessRequest
from airflow_eo.table.staging import new_attempt_id

log = logging.getLogger(__name__)


_RANGE = re.compile(r"^\s*(?P<topic>[^\[\]\s]+)\[(?P<partition>\d+)\]\s*:?\s*(?P<start>\d+)\s*(?:\.\.|-)\s*(?P<end>\d+)\s*$")


def parse_range(text: str) -> OffsetRange:
    """``orders[0] 100..250`` (as ``airflow-eo status`` prints a batch's ranges) or ``orders[0]:100-250``."""
    m = _RANGE.match(text)
    if m is None or int(m["end"]) <= int(m["start"]):
        raise ConfigError(f"offset range {text!r} is not TOPIC[PARTITION] START..END with START < END: "
                          "copy a batch's ranges from `airflow-eo status`, e.g. 'orders[0] 100..250'")
    return OffsetRange(m["topic"], int(m["partition"]), int(m["start"]), int(m["end"]))


@dataclass(frozen=True)
class ReprocessStep:
    """What one table's reprocess does next: report ``result`` (nothing to read), or run ``attempt``
    for its logged ``request``."""

    result: IngestResult | None = None
    attempt: Attempt | None = None
    request: ReprocessRequest | None = None  # marked done once the whole reprocess (every table) has succeeded


def reprocess(ingest: FanOut, requester: RunIdentity, target_run_key: str | None = None,
              table: str | None = None) -> FanOutResult:
    """Replace the batch the run ``target_run_key`` (default: the requester's own) committed, in every
    table of ``ingest`` (or in ``table``): each table's request logged, the batch's ranges read once
    (the union of the tables' ranges), each table's rows replaced in its own commit. Idempotent per
    requester, per table; a table that cannot be reprocessed stays behind with its error."""
    started, target = time.monotonic(), target_run_key or requester.run_key
    kafka = ingest.kafka()
    tables = ingest.tables_of(kafka, table)
    results: dict[str, IngestResult] = {}
    # in table_uri order, as a run's: the reprocess queues with each table's runs
    with taking_turns(tables, lambda t: t.ingestion.turn(requester.run_key, LeasePurpose.REPROCESS)):
        kafka.ask_anew()  # checked against Kafka now, not as it was before the wait for the turns
        reading = []
        for t in tables:  # every table's request is logged before anything is read
            if t.error is not None:
                continue
            with t.step_of("planning its reprocess"):
                step = Reprocessor(t.ingestion).prepare(requester, target)
                t.request = step.request
                if step.result is not None:
                    results[t.uri] = step.result
                else:
                    t.attempt = step.attempt
                    if t.held is not None and step.attempt is not None:
                        t.held.attempt(step.attempt.attempt_id)  # status and the UI show it as the holder
                    reading.append(t)
        ingest.read_once(reading, results,
                         lambda t, error: Reprocessor(t.ingestion).verify(t.started(), t.request, error))
        out = ingest.results_of(tables, results)
        # done only now: a retry after any table failed replays every table's request (a table that
        # committed it reports its commit), and never replaces a batch twice
        for t in tables:
            if t.request is not None:
                Reprocessor(t.ingestion).requests.record(replace(t.request, done=True))
    return ingest.done(FanOutResult(tuple(r.timed(started) for r in out), ingest.one_table))


def run_key_of_ranges(ingest: FanOut, ranges: Iterable[OffsetRange], table: str | None = None) -> str:
    """The run key of the committed batch whose offset ranges are exactly ``ranges``, in ``table`` (default:
    the ingest's tables, the first that has it): the batch a reprocess by ``--range`` replaces."""
    tables = ingest.tables_of(ingest.kafka(), table)
    for t in tables[:-1]:
        try:
            return Reprocessor(t.ingestion).run_key_of_ranges(ranges)
        except ConfigError:
            continue
    if not tables:
        raise ConfigError("the ingest has no table yet: nothing to reprocess; nothing was changed")
    return Reprocessor(tables[-1].ingestion).run_key_of_ranges(ranges)


class Reprocessor:
    """One table's part in a reprocess of the batch a past run committed (see the module docstring).

    Composes the ingestion's parts: its plan log (the target's plan), its attempt runner
    and the one verification and result builder (:func:`airflow_eo.loop.runner.verdict`,
    :meth:`Ingestion.result`), so a reprocess result carries what an ingest result does. The loop
    over the tables is :func:`reprocess`."""

    def __init__(self, ingestion: Ingestion):
        self.ing = ingestion
        self.requests = ReprocessLog(ingestion.location)

    def run(self, requester: RunIdentity, target_run_key: str | None = None) -> IngestResult:
        """Reprocess this one table's batch of ``target_run_key`` (default: the requester's own run)."""
        one = FanOut.of(self.ing.config, self.ing.submitter, self.ing.given_kafka)
        return reprocess(one, requester, target_run_key).only

    def run_key_of_ranges(self, ranges: Iterable[OffsetRange]) -> str:
        """The run key of the committed batch whose offset ranges are exactly ``ranges`` (all its
        non-empty ones): a batch is replaced whole, so part of one, or a span of two, is refused."""
        wanted = frozenset(r for r in ranges if r.size)
        ledger, ingest_id = self.ing.ledger(), self.ing.config.ingest_id
        for record in ledger.batches(ingest_id, limit=None):
            meta = record.meta
            if meta.operation is CommitKind.BATCH and frozenset(r for r in meta.ranges if r.size) == wanted:
                return meta.run_key
        raise ConfigError(
            f"no committed batch of ingest {ingest_id} in {ledger.table_uri} has exactly the ranges "
            f"{', '.join(sorted(map(str, wanted)))} (or its commit left the log after a log cleanup): give all "
            "the ranges of one batch as `airflow-eo status` lists them; nothing was changed"
        )

    def prepare(self, requester: RunIdentity, target: str) -> ReprocessStep:
        """The table checked and tidied, the target's committed batch found, and the request logged before
        any of it is read: the attempt to run, or the result when there is nothing to (an empty batch, a
        request that already committed)."""
        ing, ingest_id = self.ing, self.ing.config.ingest_id
        ledger = ing.ledger(TableUse.REPROCESS)
        ing.check_dead_letter_table()
        ing.collect_orphans()
        plan = self._committed_plan(target, ledger)
        if not plan.data_ranges:
            return ReprocessStep(ing.result(RunStatus.NOTHING_NEW, plan, None, ledger))
        counter = ledger.reprocess_count(ingest_id, plan.batch)
        pending = self.requests.load(requester.run_key)
        if pending and not pending.done and pending.batch == plan.batch and pending.target_run_key == target:
            if counter == pending.from_version + 1:
                log.info("reprocess of batch %s by %s already committed; starting nothing", plan.batch, requester.run_key)
                self.complete_dead_letters(plan, pending.from_version, ledger)
                return ReprocessStep(ing.result(RunStatus.ALREADY_REPROCESSED, plan,
                                                ledger.find_batch(ingest_id, batch=plan.batch), ledger), request=pending)
            if counter == pending.from_version:
                log.info("replaying the pending reprocess of batch %s", plan.batch)
        request = ReprocessRequest(requester.run_key, target, plan.batch, counter)
        self._check_kafka(plan, ledger)
        self.requests.record(request)
        attempt = ing.config.attempt(plan.with_attempt(new_attempt_id()), AttemptKind.REPROCESS,
                                     reprocess_from=request.from_version, requested_by=requester,
                                     features=ledger.features.pinned())
        log.info("reprocessing batch %s (attempt %s): %s", plan.batch, attempt.attempt_id,
                 ", ".join(str(r) for r in plan.data_ranges))
        return ReprocessStep(attempt=attempt, request=request)

    def verify(self, attempt: Attempt, request: ReprocessRequest, error: BaseException | None) -> IngestResult:
        """What the reprocess attempt did, from the log (raises when it did not land)."""
        ledger = self.ing.ledger()
        found = verdict(attempt, ledger, error)  # raises when the reprocess did not land
        if error is not None:  # its driver died after the commit: its dead letters may not have followed
            self.complete_dead_letters(attempt.plan, request.from_version, ledger)
        return self.ing.result(found.status, attempt.plan, found.record, ledger, spark_started=True)

    def complete_dead_letters(self, plan: BatchPlan, from_version: int, ledger: Ledger) -> None:
        """The dead-letter commit of the batch's reprocess from ``from_version``, if its driver died before it
        (each reprocess's dead letters replace the batch's once: :class:`airflow_eo.sinks.dead_letters.ReprocessedDeadLetters`)."""
        record = ledger.find_batch(plan.ingest_id, batch=plan.batch, operation=CommitKind.REPROCESS)
        info, manifest = (record.meta.reprocess, record.meta.findings.dead_letters) if record else (None, None)
        if record is None or info is None or info.from_version != from_version or manifest is None or not manifest.uri:
            return
        commit_reprocessed_dead_letters(ledger, replace(plan, attempt_id=record.meta.attempt_id), from_version,
                                        manifest, self.ing.storage_options)

    def _committed_plan(self, target: str, ledger: Ledger) -> BatchPlan:
        ingest_id = self.ing.config.ingest_id
        plan = self.ing.plans.load(target)
        if plan is None:
            raise ConfigError(
                f"nothing to reprocess: no batch was planned for run {target!r} in {ledger.table_uri} "
                f"(ingest {ingest_id}), or its plan log was pruned (`maintain --prune`, older than keep_days). "
                "Reprocess a run that committed a batch; nothing was changed"
            )
        if ledger.state_of(plan) is not CommitCheck.ALREADY_COMMITTED:
            raise ConfigError(
                f"run {target!r} planned batch {plan.batch} but it never committed: clear the run "
                "without reprocess to replay it; nothing was changed"
            )
        plan = ledger.committed_plan(plan)  # an interval: the batch (and ranges) the table holds it under
        # the table's sink (its mark matches the spec's write mode: the ledger's check) may refuse the batch
        self.ing.sink.check_reprocess(ledger, plan, ledger.last_batch(ingest_id))
        if plan.reader_schemas is None:  # logged by an earlier version: the batch's commit may say what it read with
            record = ledger.find_batch(ingest_id, batch=plan.batch)
            if record is not None and record.meta.findings.reader_schemas:
                plan = replace(plan, reader_schemas=record.meta.findings.reader_schemas)
        return plan

    def _check_kafka(self, plan: BatchPlan, ledger: Ledger) -> None:
        for topic in sorted({r.topic for r in plan.data_ranges}):
            reset = ledger.last_reset(plan.ingest_id, topic)
            if plan.batch < reset:
                raise DataLossError(
                    f"cannot reprocess batch {plan.batch}: it read topic {topic!r} before the topic was deleted and "
                    f"created again (batch {reset} reset its offsets to the new topic's start), so its records are "
                    "gone with the old topic. The batch's rows stay as they are; nothing was changed")
        kafka = self.ing.kafka()
        bounds = kafka.bounds([r.tp for r in plan.data_ranges])
        for r in plan.data_ranges:
            b = bounds[r.tp]
            if b.log_start > r.start or b.end < r.end:
                raise DataLossError(
                    f"cannot reprocess batch {plan.batch}: Kafka no longer holds {r} (it holds "
                    f"{r.tp} {b.log_start}..{b.end}; retention or a recreated topic). The batch's "
                    "rows stay as they are; nothing was changed"
                )
