"""The ingest loop: one source and its sinks — one plan, one read, a commit per table. A single
table is this loop with one sink (:meth:`FanOut.of`); there is no other loop.

This is the one code path behind ``airflow-eo ingest``, the Airflow operator and the standalone
Spark job; only *how Spark is started* differs (a :class:`Submitter`). An ingest
(:class:`airflow_eo.spec.fanout.FanOutSpec`: the flat options of one table, or ``sinks``, a
``topic_pattern``, ``{topic}`` in a table URI) runs each table's steps (:class:`Ingestion`) for every
table at once:

1. **turns**: the run holds every table's lease, taken in table_uri order (two ingests sharing
   tables never wait for each other in a circle): runs of one table take turns *before* they plan
   (:mod:`airflow_eo.table.lease`), waiting up to ``table_wait_timeout`` (:meth:`Ingestion.turn`);
2. **plan**: Kafka's metadata and bounds are asked once, after the turns are held
   (:class:`airflow_eo.kafka.PinnedKafka`; what a run saw before it waited is asked anew), so
   every table's batch ends at the same offsets; each table plans from its own committed offsets
   (a table new to the ingest from its ``starting_offsets``), or replays its logged plan, or holds
   the run's batch already; each new plan is **logged** in its table's plan log before anything
   is read;
3. **read once, commit per table**: one Spark attempt (the first table's, naming the others:
   :mod:`airflow_eo.driver.tables`) reads the union of the planned ranges once and commits each
   table's rows with *its whole planned range's* offsets in the table's own compare-and-set commit;
4. **verify** each table in its log.

Replays are decided from each table, never from the caller's memory
(:meth:`airflow_eo.table.ledger.Ledger.state_of`):

* the run's logged plan is committed → report that batch, start nothing;
* the table is still at the logged plan's starts → replay exactly that plan;
* the table moved elsewhere (another run committed first) → the logged plan never
  became visible, so planning anew is safe.

A reprocess (:func:`airflow_eo.loop.reprocess.reprocess`) takes the same steps for one past run's batch.

Delta has no commit across two tables: between two tables' commits a reader sees the batch in one
and not yet in the other; each table alone is always exactly-once. A table whose batch fails stays
behind (the others commit), ``run`` then raises its error, and a later run catches it up from its
own offsets while the others read on.

Example::

    >>> config = IngestConfig(table_uri="/data/orders", ingest_id="orders_raw",
    ...                       topics=["orders"], kafka_config={"bootstrap.servers": "…"})
    >>> FanOut.of(config, LocalSparkSubmit()).run(RunIdentity("manual-1")).only  # doctest: +SKIP
    IngestResult(status='committed', batch=1, version=0, ...)
    >>> spec = FanOutSpec.of(ingest_id="events", topics="events", sinks=[
    ...     {"table_uri": "/lake/events_raw"},
    ...     {"table_uri": "/lake/events_latest", "write_mode": "merge", "merge_key": "key"}])
    >>> FanOut(spec, Secrets({"bootstrap.servers": "…"}), LocalSparkSubmit()).run(RunIdentity("r1"))  # doctest: +SKIP
    FanOutResult(tables=(IngestResult(status='committed', table_uri='/lake/events_latest', ...), ...))
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from airflow_eo.attempt import Attempt, Companion, PinnedFeatures, Secrets
from airflow_eo.loop.config import IngestConfig
from airflow_eo.decoding.reader_schemas import pin
from airflow_eo.core.errors import AirflowEoError, ConfigError
from airflow_eo.faults import failpoint
from airflow_eo.kafka import KafkaOffsets, PinnedKafka
from airflow_eo.logs import about_table
from airflow_eo.core.intervals import CommittedInterval
from airflow_eo.loop.planner import INTERVAL, IntervalPlanner, OffsetPlanner
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.core.offsets import Interval, RunIdentity
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.loop.result import IngestResult, build_result
from airflow_eo.loop.runner import AttemptRunner, Submitter, failure_of, names_its_cause, recorded_error, verdict
from airflow_eo.status import lag_of
from airflow_eo.sinks import Sink, recorded_sink, sink_of
from airflow_eo.sinks.dead_letters import DeadLetterSink, commit_dead_letters_of, pending_dead_letters
from airflow_eo.spec import normalize_table_uri
from airflow_eo.spec.fanout import FanOutSpec, matching_topics
from airflow_eo.table.app_ids import dlq_app_id
from airflow_eo.table.commit import StagedBatch, commit
from airflow_eo.table.features import TableUse
from airflow_eo.table.lease import Claim, HeldLease, LeasePurpose, TableLease, turn
from airflow_eo.table.ledger import BatchRecord, Ledger
from airflow_eo.table.metadata import CommitKind
from airflow_eo.table.plan_log import PlanLog
from airflow_eo.table.staging import StagingArea, collect_orphans, new_attempt_id
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

SIDE_BY_SIDE = 8  # tables whose per-run steps (plan, plan log, commit check, verify) run at once



class NextAction(str, enum.Enum):
    """What a run does next (:meth:`Ingestion.next_step`)."""

    PLAN = "plan"  # a new batch: planned now, logged, read, committed
    REPLAY = "replay"  # the run's logged plan again (a retry or clear of a run that did not commit)
    ALREADY_COMMITTED = "already_committed"  # the run's batch (or interval) is in the table: nothing starts
    NOTHING_NEW = "nothing_new"  # nothing to read: nothing is committed


@dataclass(frozen=True)
class NextStep:
    """The decision of step 1: ``plan`` is the batch a run reads (PLAN, REPLAY) or reported
    (ALREADY_COMMITTED, NOTHING_NEW: ``result`` is then the run's result, nothing starts)."""

    action: NextAction
    plan: BatchPlan
    result: IngestResult | None = None


class Ingestion:
    """One ingest (table + ingest id + topics) and the steps of a batch."""

    def __init__(self, config: IngestConfig, submitter: Submitter, kafka: KafkaOffsets | None = None):
        self.config = config
        self.submitter = submitter
        self._kafka = kafka  # None: a client of config.kafka_config per use
        # deltalake's storage options, as the dict its calls take (the spec keeps a read-only mapping)
        self.storage_options = dict(config.storage_options) if config.storage_options else None
        self.location = TableLocation.of(config.table_uri, self.storage_options)
        self.plans = PlanLog(self.location)
        self.staging = StagingArea(self.location)
        self.runner = AttemptRunner(self.staging, submitter, config.secrets, config.spec.table.staging_grace_seconds)

    def kafka(self) -> KafkaOffsets:
        return self._kafka if self._kafka is not None else KafkaOffsets(self.config.kafka_config)

    @property
    def given_kafka(self) -> KafkaOffsets | None:
        """The Kafka client this ingestion was given (None: one of its config per use)."""
        return self._kafka

    def ledger(self, use: TableUse | None = None) -> Ledger:
        """The table's snapshot, checked for this ingest (:meth:`Ledger.check_writable`): its owner, its
        Delta features for ``use`` (default: what this ingest's batches do) and, by the sink, its
        write mode (:meth:`airflow_eo.sinks.base.Sink.check_table`)."""
        ledger = Ledger.open(self.config.table_uri, self.storage_options)
        ledger.check_writable(self.config.ingest_id, self.config.spec.table.partition_by, use or self.use,
                              self.config.spec.table.adopt_table)
        self.sink.check_table(ledger, self.config.ingest_id)
        return ledger

    @property
    def sink(self) -> Sink:
        """The table's sink: what its write mode does to a batch (:mod:`airflow_eo.sinks`)."""
        return sink_of(self.config.spec.sink)

    @property
    def use(self) -> TableUse:
        """What this ingest's batches do to the table (what its features are checked for)."""
        return self.sink.use

    def check_dead_letter_table(self) -> None:
        """The dead-letter table, if there is one yet, takes appends (its features allow them)."""
        if self.config.spec.dead_letters.table_uri:
            DeadLetterSink(self.config.spec.sink).check_table(
                Ledger.open(self.config.spec.dead_letters.table_uri, self.storage_options))

    # -- step 1: plan -------------------------------------------------------------
    def plan(self, run: RunIdentity, ledger: Ledger | None = None,
             interval: Interval | None = None) -> "BatchPlan | CommittedInterval":
        """Plan the next batch (offset mode) or ``interval``'s batch (interval mode) from the
        table and Kafka's last stable offsets (:mod:`airflow_eo.loop.planner`)."""
        if (self.config.spec.planning.mode == INTERVAL) != (interval is not None):
            raise ConfigError(f"mode={self.config.spec.planning.mode!r} " + (
                "needs the run's data interval (interval_start and interval_end)" if interval is None else
                "plans by offsets: an interval is given only with mode='interval'") + "; nothing was committed")
        planner = IntervalPlanner(self.config, interval) if interval is not None else OffsetPlanner(self.config)
        plan = planner.plan(run, ledger or self.ledger(), self.kafka())
        if isinstance(plan, BatchPlan) and not plan.is_empty:  # to be logged and run (even an empty batch has columns)
            plan = self.pin_reader_schemas(plan)
        return plan

    def pin_reader_schemas(self, plan: BatchPlan) -> BatchPlan:
        """``plan`` with the registry reader schema versions its batch decodes with, resolved now
        (a choice like its end offsets: logged with it, so every replay decodes alike)."""
        pinned = pin(self.config.spec.decode.columns, self.config.schema_registry)
        for schema in pinned:
            log.info("batch %s: the %s reader schema is %s (asked for: %s)", plan.batch, schema.column, schema,
                     schema.requested)
        return replace(plan, reader_schemas=pinned)

    def lease(self) -> TableLease:
        """The table's lease (:mod:`airflow_eo.table.lease`); a path that is not this ingest's table is
        refused before its first lease is written there (the ledger's checks)."""
        return TableLease(self.location, self.storage_options, self.config.spec.table.staging_grace_seconds,
                          check_first=self.ledger)

    @contextmanager
    def turn(self, run_key: str, purpose: LeasePurpose = LeasePurpose.INGEST,
             poll: float = 1.0) -> Iterator[HeldLease | None]:
        """Hold the table's lease for the block: runs of one table take turns before they plan.
        Waits (in all up to ``table_wait_timeout``) while another run holds it, then while an attempt
        of a run that holds no lease is running (:meth:`wait_for_turn`: one of an earlier version, or
        one that stopped waiting). Yields None when the wait timed out: the run goes on without the
        lease, its compare-and-set commit still guards the table."""
        timeout, started = self.config.spec.table.table_wait_timeout, time.monotonic()
        with turn(self.lease(), Claim(purpose, run_key, self.config.ingest_id), timeout, poll) as held:
            self.wait_for_turn(max(0.0, timeout - (time.monotonic() - started)), run_key, poll=min(poll * 2, 2.0))
            yield held

    def wait_for_turn(self, timeout: float, run_key: str | None = None, poll: float = 2.0) -> float:
        """Wait (up to ``timeout`` s) while another attempt on this table is running (the attempt
        markers: runs that hold no lease). Not a lock: a run that still races loses cleanly at the
        compare-and-set commit. A run never waits for its own run key's earlier attempts, for a dead
        attempt, or for an ingest attempt whose batch is committed
        (:meth:`StagingArea.blocking_attempts`). Returns the wait."""
        started, next_log = time.monotonic(), 0.0
        while True:
            waited = time.monotonic() - started
            running = self.staging.blocking_attempts(run_key, self._last_batches(), self.config.spec.table.staging_grace_seconds)
            if not running or waited >= timeout:
                return waited
            if waited >= next_log:
                log.info("waiting for %d running attempt(s) on %s (batch %s) before planning",
                         len(running), self.config.table_uri, ", ".join(str(m.batch) for m in running))
                next_log += 30
            time.sleep(poll)

    def _last_batches(self) -> Callable[[str], int | None]:
        """An ingest id's last committed batch, the table read once and only when asked."""
        @functools.cache
        def ledger() -> Ledger:
            return Ledger.open(self.config.table_uri, self.storage_options)

        return lambda ingest_id: ledger().last_batch(ingest_id) if ledger().exists else None

    # -- the loop -----------------------------------------------------------------
    def run(self, run: RunIdentity, interval: Interval | None = None) -> IngestResult:
        """A run of this one table: the ingest loop with one sink (:meth:`FanOut.of`)."""
        return FanOut.of(self.config, self.submitter, self._kafka).run(run, interval).only

    def peek(self, run: RunIdentity, interval: Interval | None = None) -> NextStep | None:
        """The run's next step if it writes nothing — nothing new, or its batch (interval) already in the
        table — decided without the lease, as the preview decides (a read of the table and Kafka); None when
        the run has work (a plan to log, a replay, dead letters to roll forward): it then takes its turn and
        decides again under the lease. A run with nothing to do waits for no one and writes nothing: there is
        nothing beyond the table's offsets for a holder of the lease to be committing."""
        try:
            ledger = self.ledger()
            if interval is None and self._has_new(ledger):  # work (the common case of a run): no need to plan twice
                return None
            if self.config.spec.dead_letters.table_uri and pending_dead_letters(
                    ledger, self.config.ingest_id, lambda: Ledger.open(
                        self.config.spec.dead_letters.table_uri or "", self.storage_options).transaction(
                        dlq_app_id(self.config.ingest_id))):
                return None
            step = self.next_step(run, ledger, interval)
        except AirflowEoError:  # whatever it is, the run under the lease meets it and says so
            return None
        return step if step.result is not None else None

    def _has_new(self, ledger: Ledger) -> bool:
        """Whether Kafka holds anything beyond the table's offsets, or a partition the table never read."""
        kafka = self.kafka()
        partitions = kafka.partitions(self.config.topics)
        bounds = kafka.bounds(partitions)
        committed = ledger.committed_offsets(self.config.ingest_id, partitions)
        return any(committed[tp] is None or bounds[tp].end > (committed[tp] or 0) for tp in partitions)

    def prepare(self, run: RunIdentity, interval: Interval | None = None) -> tuple[NextStep, Ledger]:
        """Steps 1-2 under the table's lease: the table checked and tidied, the run's next step
        decided (:meth:`next_step`) and a new plan logged before any of it is read."""
        ledger = self.ledger()
        self.check_dead_letter_table()
        self.complete_dead_letters(ledger)  # before orphans are collected: its files are staged
        self.collect_orphans()
        step = self.next_step(run, ledger, interval)
        if step.action is NextAction.PLAN:
            # under the lease (a preview's next_step never reaches it): a kill here leaves only the lease behind
            failpoint("while_planning")
            self.plans.record(step.plan)  # step 2: log the plan before any of it is read
        return step, ledger

    def next_step(self, run: RunIdentity, ledger: Ledger | None = None,
                  interval: Interval | None = None) -> NextStep:
        """What this run does next, decided from the table, the plan log and Kafka, writing nothing:
        report its committed batch, replay its logged plan, or plan a new batch (or find nothing new).
        The loop acts on it (holding the table's lease, :meth:`turn`); the plan preview
        (:mod:`airflow_eo.loop.preview`) only shows it, and takes no lease."""
        ledger = ledger or self.ledger()
        replay = self._replayable_plan(run, ledger, interval)
        if replay is not None:
            return replay
        planned = self.plan(run, ledger, interval)
        if isinstance(planned, CommittedInterval):
            log.info("interval %s is already in the table (batch %s); starting nothing", interval, planned.batch)
            plan = BatchPlan(self.config.ingest_id, planned.batch, (), run, interval=interval)
            return self._already_committed(plan, ledger)
        if planned.is_empty:
            log.info("nothing new in %s for %s: committing nothing", self.config.topics, self.config.ingest_id)
            return NextStep(NextAction.NOTHING_NEW, planned, self.result(RunStatus.NOTHING_NEW, planned, None, ledger))
        self.sink.check_plan(ledger, planned)
        return NextStep(NextAction.PLAN, planned)

    def _already_committed(self, plan: BatchPlan, ledger: Ledger) -> NextStep:
        """The step of a run whose batch the table holds: its plan as committed (an interval's batch
        may have been rebased to another number) and its result."""
        return NextStep(NextAction.ALREADY_COMMITTED, ledger.committed_plan(plan),
                        self.committed_result(plan, ledger))

    def mirror(self, result: IngestResult) -> IngestResult:
        """Copy the table's offsets to the configured consumer group (best effort; after
        every successful run, so a mirror that missed one run is corrected by the next)."""
        if self.config.spec.source.mirror_consumer_group:
            from airflow_eo.loop.mirror import mirror_table

            mirror_table(self.config.kafka_config, self.config.spec.source.mirror_consumer_group, self.ledger(),
                         self.config.ingest_id, self.config.topics)
        return result

    def _replayable_plan(self, run: RunIdentity, ledger: Ledger,
                         interval: Interval | None = None) -> "NextStep | None":
        logged = self.plans.load(run.run_key)
        if logged is None or logged.interval != interval:  # a run's interval is fixed; else plan anew
            return None
        state = ledger.state_of(logged)
        if state is CommitCheck.ALREADY_COMMITTED:
            log.info("run %s: its batch %s is already in the table; starting nothing", run.run_key, logged.batch)
            return self._already_committed(logged, ledger)
        if state is CommitCheck.READY:
            log.info("run %s: its logged plan of batch %s is replayed", run.run_key, logged.batch)
            return NextStep(NextAction.REPLAY, replace(logged, run=run))
        log.info("run %s: its logged plan of batch %s never committed and the table moved on; "
                 "planning anew", run.run_key, logged.batch)
        return None

    def execute(self, plan: BatchPlan, held: HeldLease | None = None,
                features: PinnedFeatures | None = None) -> IngestResult:
        """Run one attempt of a logged plan on Spark and verify the outcome in the log (an
        interval without records in an existing table commits its boundaries without Spark).
        ``features``: the table's as planned, carried by the attempt (else its driver reads them)."""
        attempt = self.attempt_of(plan, held, features)
        if plan.interval is not None and not plan.data_ranges and self.ledger().table is not None:
            return self.verify(attempt, self.commit_boundaries(attempt), spark_started=False)
        return self.verify(attempt, self.runner.submit(attempt))

    def attempt_of(self, plan: BatchPlan, held: HeldLease | None = None,
                   features: PinnedFeatures | None = None) -> Attempt:
        """A new attempt of ``plan`` (named in the lease ``held``: status and the UI show who holds the
        table), and its log line: what it reads."""
        attempt = self.config.attempt(plan.with_attempt(new_attempt_id()), features=features)
        if held is not None:
            held.attempt(attempt.attempt_id)
        log.info("batch %s attempt %s: plan %s (%d offsets)%s", plan.batch, attempt.attempt_id,
                 ", ".join(str(r) for r in plan.data_ranges) or "offsets only",
                 sum(r.end - r.start for r in plan.data_ranges),
                 f" for interval {plan.interval}" + (f", idle partitions closed: {', '.join(map(str, plan.closed_idle))}"
                                                     if plan.closed_idle else "") if plan.interval else "")
        return attempt

    def commit_boundaries(self, attempt: Attempt) -> BaseException | None:
        """Steps 3-5 of an interval with no records: nothing to read or stage, so the driver's
        compare-and-set commit of its boundaries is made here (a cold Spark job costs seconds per
        run; a backfill of quiet hours would pay it for each). Returns the error, as a job does."""
        log.info("interval %s holds no records: committing its boundaries without Spark", attempt.plan.interval)
        staged = StagedBatch(attempt.plan, (), partition_by=attempt.partition_by)
        try:  # what an empty Spark batch records, from the builder the driver uses
            commit(self.sink.boundaries_rule(staged, attempt), self.config.table_uri, self.storage_options)
        except AirflowEoError as exc:
            return exc
        return None

    # -- step 6: verify -------------------------------------------------------------
    def verify(self, attempt: Attempt, error: BaseException | None = None,
               spark_started: bool = True) -> IngestResult:
        """What the attempt did, from the log (:func:`airflow_eo.loop.runner.verdict`); raises when its
        batch did not land."""
        ledger = self.ledger()
        found = verdict(attempt, ledger, error)
        if error is not None:  # a job that exited cleanly has committed its dead letters itself
            self.complete_dead_letters(ledger)
        return self.result(found.status, attempt.plan, found.record, ledger, spark_started=spark_started)

    def committed_result(self, plan: BatchPlan, ledger: Ledger) -> IngestResult:
        """The result of a run whose batch the table already holds: an offset batch's commit by the
        run's own key; an interval's commit whoever made it, under its committed number (a rebase
        renumbers a batch; the loser of a race of two runs of one interval reports the winner's)."""
        committed = ledger.committed_plan(plan)
        by_interval = plan.interval is not None
        record = ledger.find_batch(plan.ingest_id, run_key=None if by_interval else plan.run.run_key,
                                   batch=committed.batch, operation=CommitKind.BATCH if by_interval else None)
        return self.result(RunStatus.ALREADY_COMMITTED, committed, record, ledger)

    def result(self, status: RunStatus, plan: BatchPlan, record: BatchRecord | None, ledger: Ledger,
               spark_started: bool = False) -> IngestResult:
        """The result of any kind of run on this table (:func:`airflow_eo.loop.result.build_result`)."""
        return build_result(status, plan, record, table_uri=self.config.table_uri, lag=self.lag(ledger),
                            spark_started=spark_started,
                            version=ledger.version if status is RunStatus.COMMITTED else None)

    def lag(self, ledger: Ledger) -> dict[str, int]:
        """Offsets Kafka holds beyond the table's committed offsets, per partition."""
        try:
            kafka = self.kafka().current()  # what Kafka holds after the run, not when it planned
            bounds = kafka.bounds(kafka.partitions(self.config.topics))
            lag = lag_of(kafka, bounds, ledger, self.config.ingest_id, self.config.spec.source.starting_offsets)
            return {str(tp): n for tp, n in lag.items()}
        except AirflowEoError as exc:
            log.warning("could not measure lag: %s", exc)
            return {}

    def complete_dead_letters(self, ledger: Ledger, upto: int | None = None) -> None:
        """Finish the dead-letter commits a driver left behind its main commit (killed between the two,
        or overtaken by another run's commit), every batch of them, in order (``upto``: only those up
        to that batch)."""
        if self.config.spec.dead_letters.table_uri:
            commit_dead_letters_of(ledger, self.config.ingest_id, self.config.spec.dead_letters.table_uri,
                                   self.storage_options, upto)

    def collect_orphans(self) -> list[str]:
        """Remove staged files of attempts that ended without committing (never a running one)."""
        removed = collect_orphans(self.config.table_uri, self.storage_options,
                                  self.config.spec.table.staging_grace_seconds)
        self.staging.collect_scratch(self.config.spec.table.staging_grace_seconds)
        if self.config.spec.dead_letters.table_uri:
            removed += collect_orphans(self.config.spec.dead_letters.table_uri, self.storage_options,
                                       self.config.spec.table.staging_grace_seconds)
        return removed


@dataclass(frozen=True)
class FanOutResult:
    """Each table's result of one run, in table_uri order (``one_table``: the ingest is the single-table
    form, whose summary is that table's, as it always was)."""

    tables: tuple[IngestResult, ...]
    one_table: bool = False

    @property
    def status(self) -> RunStatus:
        """What the run did, over its tables: a commit when any table got one (committed, reprocessed); else the
        tables' common status, or what an earlier attempt did (nothing new without tables)."""
        statuses = {RunStatus(t.status) for t in self.tables}
        for status in (RunStatus.COMMITTED, RunStatus.REPROCESSED, RunStatus.ALREADY_REPROCESSED,
                       RunStatus.ALREADY_COMMITTED):
            if status in statuses:
                return status
        return RunStatus.NOTHING_NEW

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def only(self) -> IngestResult:
        """The result of the run's one table."""
        (table,) = self.tables
        return table

    def to_dict(self) -> dict:
        """The run's summary (XCom, the CLI's JSON): its status, rows and each table's result; of the
        single-table form, that table's result."""
        if self.one_table:
            return self.only.to_dict()
        return {"status": self.status.value, "rows": self.rows, "table_uris": [t.table_uri for t in self.tables],
                "tables": [t.to_dict() for t in self.tables]}


@dataclass
class _Table:
    """One table's part in a run (``error``: what stopped it; it stays behind, the others go on)."""

    ingestion: Ingestion
    held: HeldLease | None = None
    step: NextStep | None = None
    ledger: Ledger | None = None
    attempt: Attempt | None = None
    error: AirflowEoError | None = None
    request: Any = None  # a reprocess: the logged request its attempt replays (airflow_eo.loop.reprocess)

    @property
    def uri(self) -> str:
        return self.ingestion.config.table_uri

    def started(self) -> Attempt:
        """The attempt this table's read started (every table that reads has one)."""
        assert self.attempt is not None
        return self.attempt

    @contextmanager
    def step_of(self, what: str) -> Iterator[None]:
        """One step of this table: its log lines name it; an error of ours stops this table only."""
        with about_table(self.uri):
            try:
                yield
            except AirflowEoError as exc:
                log.error("the table stays behind (%s failed; the other tables go on): %s", what, exc)
                self.error = exc


class FanOut:
    """One source and its tables (a :class:`FanOutSpec`), and the steps of a run over all of them.
    ``configs``: the tables themselves instead of the spec's (:meth:`of`: one table's config)."""

    def __init__(self, spec: FanOutSpec | None, credentials: Secrets, submitter: Submitter,
                 kafka: KafkaOffsets | None = None, configs: tuple[IngestConfig, ...] | None = None):
        self.spec, self.credentials, self.submitter = spec, credentials, submitter
        self._kafka = kafka  # None: a pinned client of the credentials per run
        self._configs = configs
        self.one_table = configs is not None and len(configs) == 1 or spec is not None and spec.one_table

    @classmethod
    def of(cls, config: IngestConfig, submitter: Submitter, kafka: KafkaOffsets | None = None) -> "FanOut":
        """The ingest of one table's config (the single-table form)."""
        return cls(None, config.credentials, submitter, kafka, configs=(config,))

    def configs(self, kafka: KafkaOffsets | None = None) -> tuple[IngestConfig, ...]:
        """The tables now: a topic pattern (and ``{topic}``) resolved against Kafka's topics."""
        if self._configs is not None:
            return self._configs
        assert self.spec is not None
        topics = self.spec.topics
        if self.spec.topic_pattern:
            kafka = kafka or self._kafka or KafkaOffsets(self.credentials.kafka_config)
            topics = matching_topics(self.spec.topic_pattern, kafka.topics())
        return tuple(IngestConfig(spec, self.credentials) for spec in self.spec.tables(topics))

    def kafka(self) -> KafkaOffsets:
        """The run's Kafka client: one answer per question for every table (:class:`PinnedKafka`)."""
        return self._kafka or PinnedKafka(self.credentials.kafka_config)

    def tables_of(self, kafka: KafkaOffsets, only: str | None = None) -> list["_Table"]:
        """Each table's part in a run (``only``: just that table), in table_uri order."""
        configs = self.configs(kafka)
        if only is not None:
            uri = normalize_table_uri(only)
            configs = tuple(c for c in configs if c.table_uri == uri)
            if not configs:
                raise ConfigError(f"the ingest writes no table {only} (its tables: "
                                  f"{', '.join(c.table_uri for c in self.configs(kafka)) or 'none yet'}): name one of "
                                  "them, or leave --table out for every table; nothing was changed")
        return [_Table(Ingestion(c, self.submitter, kafka)) for c in configs]

    def run(self, run: RunIdentity, interval: Interval | None = None) -> FanOutResult:
        """Plan (or replay each table's logged plan), log, read once, commit each table, verify.
        Idempotent per run key, per table."""
        started = time.monotonic()
        kafka = self.kafka()
        tables = self.tables_of(kafka)
        if not tables:
            log.info("no topic matches %r yet: no table to write", self.spec.topic_pattern if self.spec else None)
            return FanOutResult((), self.one_table)
        if len(tables) > 1:
            log.info("run %s: %d table(s): %s", run.run_key, len(tables), ", ".join(t.uri for t in tables))
        if isinstance(kafka, PinnedKafka):  # one question for every table's partitions, not one per table
            kafka.expect([topic for t in tables for topic in t.ingestion.config.topics])

        def peek(table: _Table) -> None:  # a table with nothing to do (nothing new, its batch committed) takes no turn
            with about_table(table.uri):
                table.step = table.ingestion.peek(run, interval)

        side_by_side(tables, peek)
        with taking_turns([t for t in tables if t.step is None], lambda t: t.ingestion.turn(run.run_key)):
            kafka.ask_anew()  # planned against Kafka now, not as it was before the wait for the turns
            results = self._run(run, interval, tables)
        return self.done(FanOutResult(tuple(r.timed(started) for r in results), self.one_table))

    @staticmethod
    def done(out: FanOutResult) -> FanOutResult:
        """``out``, each table's result logged (rows, files, seconds and rows/s when Spark ran)."""
        for result in out.tables:
            with about_table(result.table_uri):
                if result.spark_started:
                    counts = recorded_sink(result.write_mode).counts_text(result.to_dict())
                    log.info("batch %s %s: %d rows in %d file(s), %.1f s (%.0f rows/s), table version %s%s",
                             result.batch, result.status, result.rows, result.files, result.seconds,
                             result.rows / result.seconds if result.seconds else 0, result.version,
                             f"; {counts}" if counts else "")
                else:
                    log.info("batch %s %s, %d rows, table version %s", result.batch, result.status, result.rows,
                             result.version)
        return out

    def _run(self, run: RunIdentity, interval: Interval | None, tables: list[_Table]) -> list[IngestResult]:
        """Each table's steps; a table whose step fails (planning, its dead letters' roll-forward, a commit,
        its verification) stays behind with its own error while the others commit; then the first error
        is raised, of its own type (what a retry may fix stays retried)."""
        results: dict[str, IngestResult] = {}
        for table in tables:
            if table.step is not None and table.step.result is not None:  # nothing to do: found without the lease
                results[table.uri] = table.step.result

        def prepare(table: _Table) -> None:
            with table.step_of("planning"):
                table.step, table.ledger = table.ingestion.prepare(run, interval)

        # every table's plan is logged before anything is read
        side_by_side([t for t in tables if t.uri not in results and t.error is None], prepare)

        def start(table: _Table) -> None:
            assert table.step is not None and table.ledger is not None
            ingestion, step, ledger = table.ingestion, table.step, table.ledger
            with table.step_of("its batch"):
                if step.result is not None:
                    results[table.uri] = step.result
                elif step.plan.interval is not None and not step.plan.data_ranges and ledger.table is not None:
                    results[table.uri] = ingestion.execute(step.plan, table.held, ledger.features.pinned())
                else:
                    table.attempt = ingestion.attempt_of(step.plan, table.held, ledger.features.pinned())

        starting = [t for t in tables if t.error is None and t.step is not None and t.ledger is not None
                    and t.uri not in results]
        side_by_side(starting, start)
        reading = [t for t in starting if t.attempt is not None and t.error is None]
        self.read_once(reading, results, lambda t, error: t.ingestion.verify(t.started(), error))

        def mirror(table: _Table) -> None:
            with table.step_of("mirroring its offsets"):
                table.ingestion.mirror(results[table.uri])

        side_by_side([t for t in tables if t.uri in results], mirror)
        return self.results_of(tables, results)

    def results_of(self, tables: list["_Table"], results: dict[str, IngestResult]) -> list[IngestResult]:
        """Each table's result in order; the first table's error when one stayed behind (naming its table,
        unless the ingest is the single-table form: then the error is the table's own, as it always was)."""
        failed = [t for t in tables if t.error is not None]
        if failed:
            error = failed[0].error
            assert error is not None
            raise error if self.one_table else _naming_table(failed[0].uri, error)
        return [results[t.uri] for t in tables]

    def read_once(self, tables: list[_Table], results: dict[str, IngestResult],
                   verify: Callable[[_Table, BaseException | None], IngestResult]) -> None:
        """One Spark attempt for every table that reads: the first table's names the others; each
        table's outcome from its own log (and its attempt's marker, when the job failed) into ``results``,
        or its error into the table."""
        if not tables:
            return
        attempts = [t.attempt for t in tables if t.attempt is not None]
        assert len(attempts) == len(tables)  # every table that reads has its attempt
        first = replace(attempts[0], companions=tuple(Companion(a.table_uri, a.attempt_id) for a in attempts[1:]))
        companions = tables[1:]
        side_by_side(companions, lambda t: t.ingestion.staging.begin_attempt(t.started()))  # read beside their tables
        try:
            error = tables[0].ingestion.runner.submit(
                first, also=tuple((t.ingestion.staging, a.attempt_id) for t, a in zip(tables[1:], attempts[1:])))
        finally:
            side_by_side(companions, lambda t: t.ingestion.staging.end_attempt(t.started().attempt_id))
        recorded = {} if error is None else {
            t.uri: recorded_error(t.ingestion.staging, a.attempt_id) for t, a in zip(tables, attempts)}
        typed_elsewhere = any(names_its_cause(e) for e in recorded.values())

        def verified(table: _Table) -> None:
            own = None if error is None else _own_error(error, recorded[table.uri], typed_elsewhere)
            with table.step_of("its commit"):
                results[table.uri] = verify(table, own)

        side_by_side(tables, verified)


@contextmanager
def taking_turns(tables: list[_Table], take: Callable[[_Table], AbstractContextManager[HeldLease | None]]
                 ) -> Iterator[None]:
    """Each table's turn (its lease, ``take``) for the block: taken one after another in the order of ``tables``
    (``table_uri`` order: the one order that keeps two runs sharing tables from deadlocking), given back
    side by side at the end (a release waits for nobody, so its order binds nothing). A table whose turn
    fails stays behind with its error (:meth:`_Table.step_of`)."""
    entered: dict[str, AbstractContextManager[HeldLease | None]] = {}
    try:
        for table in tables:
            with table.step_of("taking its turn"):
                held = take(table)
                table.held = held.__enter__()
                entered[table.uri] = held
        yield
    finally:
        side_by_side([t for t in tables if t.uri in entered], lambda t: entered[t.uri].__exit__(None, None, None))


def side_by_side(tables: list[_Table], step: Callable[[_Table], object]) -> None:
    """``step`` for each table, up to :data:`SIDE_BY_SIDE` at once. A table's steps touch only its own
    table and the run's pinned Kafka answers, and wait on storage and the broker; the lease order
    (:meth:`FanOut.run`'s turns) is the one thing that binds tables, and it stays one after another.
    An error that is not a table's own (those :meth:`_Table.step_of` keeps) is raised once every
    table's step has ended."""
    if len(tables) < 2:
        for table in tables:
            step(table)
        return
    with ThreadPoolExecutor(max_workers=min(SIDE_BY_SIDE, len(tables)), thread_name_prefix="airflow-eo-table") as pool:
        futures = [pool.submit(step, t) for t in tables]
    for future in futures:
        future.result()


def _own_error(error: BaseException, recorded: BaseException | None, typed_elsewhere: bool) -> BaseException | None:
    """What failed a table when the job failed: the error its marker ``recorded``, unless the job's own
    error says more (a Connect server that died mid-batch: its marker holds the lost RPC); none when
    the job's typed error is another table's (the driver records each table's error in its own
    marker); the job's own when no table recorded it (a server that cannot be reached or refuses
    the client fails every table; so do a kill and a crash)."""
    if recorded is not None and (names_its_cause(recorded) or not names_its_cause(error)):
        return recorded
    if names_its_cause(error):
        return None if typed_elsewhere else error
    return failure_of(error, None)


def _naming_table(table_uri: str, error: AirflowEoError) -> AirflowEoError:
    """``error`` with its table named (of the same type: what a retry may fix stays retried)."""
    try:
        named = type(error)(f"{table_uri}: {error}")
    except TypeError:
        return error
    named.__cause__ = error
    return named
