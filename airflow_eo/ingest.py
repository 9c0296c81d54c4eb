"""The ingestion loop: plan, log the plan, run the Spark attempt, verify.

This is the one code path behind ``airflow-eo ingest``, the Airflow operator and the
standalone Spark job; only *how Spark is started* differs (a :class:`Submitter`).

Replays are decided from the table, never from the caller's memory
(:meth:`airflow_eo.table.ledger.Ledger.state_of`):

* the run's logged plan is committed → report that batch, start nothing;
* the table is still at the logged plan's starts → replay exactly that plan;
* the table moved elsewhere (another run committed first) → the logged plan never
  became visible, so planning anew is safe.

Example::

    >>> config = IngestConfig(table_uri="/data/orders", ingest_id="orders_raw",
    ...                       topics=["orders"], kafka_config={"bootstrap.servers": "…"})
    >>> Ingestion(config, LocalSparkSubmit()).run(RunIdentity("manual-1"))  # doctest: +SKIP
    IngestResult(status='committed', batch=1, version=0, ...)
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from airflow_eo.attempt import (
    DEFAULT_MAX_OFFSETS_PER_TASK, Attempt, AttemptKind, DeadLetterSpec, DecodeSpec, DedupSpec, Secrets, SparkSettings,
    Transform, check_partition_by,
)
from airflow_eo.errors import AirflowEoError, ConfigError, SparkJobError, error_from_line
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.intervals import CommittedInterval, parse_duration
from airflow_eo.planner import INTERVAL, OFFSETS, IntervalPlanner, OffsetPlanner, check_mode
from airflow_eo.planning import BatchPlan, CommitCheck, Interval, OnDataLoss, RunIdentity, StartingPosition
from airflow_eo.result import IngestResult, short_cause  # noqa: F401 - re-exported: the loop's result
from airflow_eo.status import measure_lag
from airflow_eo.table.commit import (
    ALREADY_COMMITTED, COMMITTED, CommitKind, StagedBatch, commit, commit_dead_letters_of,
)
from airflow_eo.table.ledger import BatchRecord, Ledger, validate_ingest_id
from airflow_eo.table.plan_log import PlanLog
from airflow_eo.table.staging import DEFAULT_GRACE_SECONDS, StagingArea, collect_orphans, new_attempt_id
from airflow_eo.table.storage import TableLocation, normalize_table_uri

log = logging.getLogger(__name__)

NOTHING_NEW = "nothing_new"


@dataclass(frozen=True)
class IngestConfig:
    """Everything that defines one ingest into one table."""

    table_uri: str
    ingest_id: str
    topics: list[str]
    kafka_config: dict = field(repr=False)  # may hold secrets: never logged or stored
    starting_offsets: object = "earliest"
    max_records_per_run: int | None = None
    on_data_loss: str = OnDataLoss.FAIL.value
    transform: Transform = field(default_factory=Transform)
    max_offsets_per_task: int = DEFAULT_MAX_OFFSETS_PER_TASK
    storage_options: dict | None = field(default=None, repr=False)
    staging_grace_seconds: float = DEFAULT_GRACE_SECONDS
    # optional: also commit the table's offsets to this consumer group for lag tools
    # (airflow_eo.mirror); the Delta log stays the only source of truth
    mirror_consumer_group: str | None = None
    # optional decoding (airflow_eo.driver.decode): the value parsed as JSON into column
    # `data`; undecodable records go to dead_letter_table_uri instead of failing the batch
    value_schema: str | None = None  # Spark DDL, e.g. "id INT, name STRING"
    value_format: str = "json"  # json | avro | raw
    max_value_bytes: int | None = None
    # Avro (airflow_eo.driver.avro): a Schema Registry (config with credentials: a secret) and
    # the reader schema's subject/version, or an inline schema; keys alike
    schema_registry: dict | None = field(default=None, repr=False)
    avro_schema: str | None = None
    value_subject: str | None = None  # default "<first topic>-value" (TopicNameStrategy)
    value_schema_version: str = "latest"
    key_format: str = "raw"
    key_schema: str | None = None
    key_avro_schema: str | None = None
    key_subject: str | None = None  # default "<first topic>-key"
    dead_letter_table_uri: str | None = None
    max_dead_letters: int | None = None
    max_dead_letter_fraction: float | None = None
    # opt-in: new columns of the transform's output are added to the table
    schema_evolution: bool = False
    table_properties: dict[str, str] = field(default_factory=dict)  # of the table the first batch creates
    partition_by: tuple[str, ...] = ()  # partition columns of the table the first batch creates
    # planning (airflow_eo.planner): "offsets" = everything new; "interval" = a run's data interval,
    # an idle partition closing close_after (seconds or "15m") past the interval's end
    mode: str = OFFSETS
    close_after: object = None
    # dedup by a producer key (airflow_eo.driver.dedup): a Spark SQL expression over the source,
    # the look-back ("1d" over the Kafka timestamp, "<n> batches"; None: the whole table)
    dedup_key: str | None = None
    dedup_horizon: str | None = None
    duplicates_to_dead_letters: bool = False

    def __post_init__(self):
        validate_ingest_id(self.ingest_id)
        object.__setattr__(self, "table_uri", normalize_table_uri(self.table_uri))
        object.__setattr__(self, "on_data_loss", OnDataLoss(self.on_data_loss).value)
        object.__setattr__(self, "partition_by", check_partition_by(self.partition_by))
        check_mode(self.mode)
        parse_duration(self.close_after)
        StartingPosition.parse(self.starting_offsets)
        if self.dead_letter_table_uri:
            object.__setattr__(self, "dead_letter_table_uri", normalize_table_uri(self.dead_letter_table_uri))
            if self.dead_letter_table_uri == self.table_uri:
                raise ConfigError("dead_letter_table_uri must be another path than table_uri")
        # validate every attempt setting now, not on Spark
        self.attempt(BatchPlan(self.ingest_id, 1, (), RunIdentity(""), attempt_id="0"))

    def attempt(self, plan: BatchPlan, kind: AttemptKind = AttemptKind.INGEST, **reprocess) -> Attempt:
        """The typed value an attempt of ``plan`` runs from (no secrets)."""
        return Attempt(
            plan=plan, table_uri=self.table_uri, kind=kind, transform=self.transform,
            decode=self.decode_spec(),
            dead_letters=DeadLetterSpec(self.dead_letter_table_uri, self.max_dead_letters,
                                        self.max_dead_letter_fraction),
            dedup=DedupSpec(self.dedup_key or None, None if self.dedup_horizon is None else str(self.dedup_horizon),
                            self.duplicates_to_dead_letters),
            spark=SparkSettings(self.max_offsets_per_task), schema_evolution=self.schema_evolution,
            table_properties=dict(self.table_properties), partition_by=tuple(self.partition_by), **reprocess,
        )

    def decode_spec(self) -> DecodeSpec:
        names = ("value_schema", "value_format", "max_value_bytes", "avro_schema", "value_subject",
                 "value_schema_version", "key_format", "key_schema", "key_avro_schema", "key_subject")
        spec = DecodeSpec.of(self.topics, self.schema_registry is not None, **{n: getattr(self, n) for n in names})
        if spec.avro_schema or spec.key_avro_schema:  # an inline schema is checked before any run
            from airflow_eo.avro_schema import check_schema

            for inline in filter(None, (spec.avro_schema, spec.key_avro_schema)):
                check_schema(inline)
        return spec

    def secrets(self) -> Secrets:
        return Secrets(self.kafka_config, self.storage_options, self.schema_registry)


class Submitter(Protocol):
    """Starts the Spark job of one recorded attempt and waits for it."""

    def submit(self, attempt: Attempt, secrets: Secrets) -> None: ...


class Ingestion:
    """One ingest (table + ingest id + topics) and the steps of a batch."""

    def __init__(self, config: IngestConfig, submitter: Submitter):
        self.config = config
        self.submitter = submitter
        self.location = TableLocation.of(config.table_uri, config.storage_options)
        self.plans = PlanLog(self.location)
        self.staging = StagingArea(self.location)

    def kafka(self) -> KafkaOffsets:
        return KafkaOffsets(self.config.kafka_config)

    def ledger(self) -> Ledger:
        ledger = Ledger.open(self.config.table_uri, self.config.storage_options)
        ledger.check_writable(self.config.ingest_id, self.config.partition_by)
        return ledger

    # -- step 1: plan -------------------------------------------------------------
    def plan(self, run: RunIdentity, ledger: Ledger | None = None,
             interval: Interval | None = None) -> "BatchPlan | CommittedInterval":
        """Plan the next batch (offset mode) or ``interval``'s batch (interval mode) from the
        table and Kafka's last stable offsets (:mod:`airflow_eo.planner`)."""
        if (self.config.mode == INTERVAL) != (interval is not None):
            raise ConfigError(f"mode={self.config.mode!r} " + (
                "needs the run's data interval (interval_start and interval_end)" if interval is None else
                "plans by offsets: an interval is given only with mode='interval'") + "; nothing was committed")
        planner = IntervalPlanner(self.config, interval) if interval is not None else OffsetPlanner(self.config)
        return planner.plan(run, ledger or self.ledger(), self.kafka())

    def wait_for_turn(self, timeout: float, poll: float = 2.0) -> float:
        """Wait (up to ``timeout`` s) while another attempt on this table is running: runs of one
        table take turns, runs of different tables do not wait for each other. Not a lock: a
        run that still races loses cleanly at the compare-and-set commit. Returns the wait."""
        started, next_log = time.monotonic(), 0.0
        while True:
            waited = time.monotonic() - started
            running = self.staging.running_attempts(self.config.staging_grace_seconds)
            if not running or waited >= timeout:
                return waited
            if waited >= next_log:
                log.info("waiting for %d running attempt(s) on %s (batch %s) before planning",
                         len(running), self.config.table_uri, ", ".join(str(m.batch) for m in running))
                next_log += 30
            time.sleep(poll)

    # -- the loop -----------------------------------------------------------------
    def run(self, run: RunIdentity, interval: Interval | None = None) -> IngestResult:
        """Plan (or replay the logged plan), log it, run Spark, verify. Idempotent per run key
        (and, in interval mode, per interval: a committed interval is not read again)."""
        started = time.monotonic()
        result = self._run(run, interval)
        result = replace(result, seconds=round(time.monotonic() - started, 3))
        if result.spark_started:
            log.info("batch %s %s: %d rows in %d file(s), %.1f s (%.0f rows/s), table version %s",
                     result.batch, result.status, result.rows, result.files, result.seconds,
                     result.rows / result.seconds if result.seconds else 0, result.version)
        return result

    def _run(self, run: RunIdentity, interval: Interval | None) -> IngestResult:
        ledger = self.ledger()
        self.complete_dead_letters(ledger)  # before orphans are collected: its files are staged
        self.collect_orphans()
        plan = self._replayable_plan(run, ledger, interval)
        if isinstance(plan, IngestResult):
            return self.mirror(plan)
        if plan is None:
            plan = self.plan(run, ledger, interval)
            if isinstance(plan, CommittedInterval):
                log.info("interval %s is already in the table (batch %s); starting nothing", interval, plan.batch)
                return self.committed_result(BatchPlan(self.config.ingest_id, plan.batch, (), run, interval=interval),
                                             ledger, by_batch=True)
            if plan.is_empty:
                log.info("nothing new in %s for %s: committing nothing", self.config.topics, self.config.ingest_id)
                return self.mirror(self._result(NOTHING_NEW, plan, None, ledger))
            # step 2: log the plan before any of it is read
            self.plans.record(plan)
        return self.mirror(self.execute(plan))

    def mirror(self, result: IngestResult) -> IngestResult:
        """Copy the table's offsets to the configured consumer group (best effort; after
        every successful run, so a mirror that missed one run is corrected by the next)."""
        if self.config.mirror_consumer_group:
            from airflow_eo.mirror import mirror_table

            mirror_table(self.config.kafka_config, self.config.mirror_consumer_group, self.ledger(),
                         self.config.ingest_id, self.config.topics)
        return result

    def _replayable_plan(self, run: RunIdentity, ledger: Ledger,
                         interval: Interval | None = None) -> "BatchPlan | IngestResult | None":
        logged = self.plans.load(run.run_key)
        if logged is None or logged.interval != interval:  # a run's interval is fixed; else plan anew
            return None
        state = ledger.state_of(logged)
        if state is CommitCheck.ALREADY_COMMITTED:
            log.info("run %s: its batch %s is already in the table; starting nothing", run.run_key, logged.batch)
            return self.committed_result(logged, ledger)
        if state is CommitCheck.READY:
            log.info("run %s: replaying its logged plan of batch %s", run.run_key, logged.batch)
            return replace(logged, run=run)
        log.info("run %s: its logged plan of batch %s never committed and the table moved on; "
                 "planning anew", run.run_key, logged.batch)
        return None

    def execute(self, plan: BatchPlan) -> IngestResult:
        """Run one attempt of a logged plan on Spark and verify the outcome in the log (an
        interval without records in an existing table commits its boundaries without Spark)."""
        attempt = self.config.attempt(plan.with_attempt(new_attempt_id()))
        log.info("batch %s attempt %s: plan %s (%d offsets)%s", plan.batch, attempt.attempt_id,
                 ", ".join(str(r) for r in plan.data_ranges) or "offsets only",
                 sum(r.end - r.start for r in plan.data_ranges),
                 f" for interval {plan.interval}" + (f", idle partitions closed: {', '.join(map(str, plan.closed_idle))}"
                                                     if plan.closed_idle else "") if plan.interval else "")
        if plan.interval is not None and not plan.data_ranges and self.ledger().table is not None:
            return self.verify(attempt.plan, self.commit_boundaries(attempt), spark_started=False)
        return self.verify(attempt.plan, self.submit_attempt(attempt))

    def commit_boundaries(self, attempt: Attempt) -> BaseException | None:
        """Steps 3-5 of an interval with no records: nothing to read or stage, so the driver's
        compare-and-set commit of its boundaries is made here (a cold Spark job costs seconds per
        run; a backfill of quiet hours would pay it for each). Returns the error, as a job does."""
        log.info("interval %s holds no records: committing its boundaries without Spark", attempt.plan.interval)
        extra = {"late": {"records": 0, "oldest_ms": None}}  # the metadata an empty Spark batch writes
        if attempt.dedup.enabled:
            extra["duplicates"] = {"records": 0, "to_dead_letters": attempt.dedup.to_dead_letters}
        try:
            commit(CommitKind.BATCH, self.config.table_uri, StagedBatch(attempt.plan, (), partition_by=attempt.partition_by),
                   self.config.storage_options, extra_metadata=extra)
        except AirflowEoError as exc:
            return exc
        return None

    def submit_attempt(self, attempt: Attempt) -> BaseException | None:
        """Record the attempt, run its Spark job, mark it ended; return the job's error if any.

        The error is returned, not raised: the job may have committed before it died, and
        only the Delta log can say.
        """
        self.staging.begin_attempt(attempt)
        started = time.monotonic()
        try:
            self.submitter.submit(attempt, self.config.secrets())
        except BaseException as exc:
            return self.typed_failure(attempt, exc)
        finally:
            self.staging.end_attempt(attempt.attempt_id)
            log.info("spark job for batch %s ended after %.1fs", attempt.plan.batch, time.monotonic() - started)
        return None

    def typed_failure(self, attempt: Attempt, error: BaseException) -> BaseException:
        """The driver's own error for a job that failed, read from its attempt marker when the
        submitter only saw an exit code; one line, never a command line."""
        if not isinstance(error, Exception) or \
                isinstance(error, AirflowEoError) and not isinstance(error, SparkJobError):
            return error
        marker = self.staging.read_marker(attempt.attempt_id)
        if marker is not None and marker.error:
            typed = error_from_line(marker.error) or SparkJobError(f"the Spark job failed: {marker.error}")
        elif isinstance(error, SparkJobError):
            return error
        else:  # the driver never got to say (it did not start, or was killed)
            typed = SparkJobError(f"the Spark job failed before reporting an error: {short_cause(error)}")
        typed.__cause__ = error
        return typed

    # -- step 6: verify -------------------------------------------------------------
    def verify(self, attempt: BatchPlan, error: BaseException | None = None,
               spark_started: bool = True) -> IngestResult:
        ledger = self.ledger()
        if ledger.state_of(attempt) is CommitCheck.ALREADY_COMMITTED:
            if error is not None:  # a job that exited cleanly has committed its dead letters itself
                self.complete_dead_letters(ledger)
            record = ledger.find_batch(attempt.ingest_id, batch=attempt.batch)
            if record is None or record.attempt_id == attempt.attempt_id:
                if error is not None:
                    log.warning("the Spark job failed (%s) after its commit landed: batch %s is committed",
                                error, attempt.batch)
                return self._result(COMMITTED, attempt, record, ledger, spark_started=spark_started)
            return self._result(ALREADY_COMMITTED, attempt, record, ledger, spark_started=spark_started)
        if isinstance(error, AirflowEoError) and not isinstance(error, SparkJobError):
            raise error
        raise SparkJobError(
            f"the Spark job for batch {attempt.batch} of {attempt.ingest_id} ended without committing "
            f"({short_cause(error) if error else 'no commit found'}); the "
            "table and its offsets are unchanged. Retry the task: it replays the same offsets"
        ) from error

    def committed_result(self, plan: BatchPlan, ledger: Ledger, by_batch: bool = False) -> IngestResult:
        record = ledger.find_batch(plan.ingest_id, run_key=None if by_batch else plan.run.run_key, batch=plan.batch,
                                   operation="ingest" if by_batch else None)
        if by_batch and record is not None:  # report the interval's recorded ranges
            plan = replace(plan, ranges=record.ranges)
        return self._result(ALREADY_COMMITTED, plan, record, ledger)

    def _result(self, status: str, plan: BatchPlan, record: BatchRecord | None, ledger: Ledger,
                spark_started: bool = False) -> IngestResult:
        return IngestResult(
            status=status, ingest_id=plan.ingest_id, table_uri=self.config.table_uri,
            run_key=plan.run.run_key, batch=plan.batch if status != NOTHING_NEW else None,
            version=record.version if record else (ledger.version if status == COMMITTED else None),
            attempt_id=record.attempt_id if record else (plan.attempt_id or None),
            ranges=[asdict(r) for r in plan.data_ranges],
            rows=record.rows if record else 0,
            rows_per_partition=record.rows_per_partition if record else {},
            lag=self.lag(ledger),  # every kind of result says how far behind the table is
            spark_started=spark_started,
            files=int(record.raw.get("files", 0)) if record else 0,
            bytes=int(record.raw.get("bytes", 0)) if record else 0,
            dead_letters=sum(int(f.get("num_records", 0)) for f in
                             ((record.raw.get("dead_letters") or {}).get("files") or [])) if record else 0,
            interval=asdict(plan.interval) if plan.interval else None,
            late_records=int((record.raw.get("late") or {}).get("records", 0)) if record else 0,
            duplicates=int((record.raw.get("duplicates") or {}).get("records", 0)) if record else 0,
        )

    def lag(self, ledger: Ledger) -> dict[str, int]:
        """Offsets Kafka holds beyond the table's committed offsets, per partition."""
        try:
            return measure_lag(self.config.kafka_config, self.config.topics, ledger, self.config.ingest_id,
                               self.config.starting_offsets)
        except AirflowEoError as exc:
            log.warning("could not measure lag: %s", exc)
            return {}

    def complete_dead_letters(self, ledger: Ledger) -> None:
        """Finish a dead-letter commit a crashed driver left behind its main commit."""
        if self.config.dead_letter_table_uri and \
                commit_dead_letters_of(ledger, self.config.ingest_id, self.config.storage_options) == COMMITTED:
            log.info("rolled forward the dead letters of batch %s", ledger.last_batch(self.config.ingest_id))

    def collect_orphans(self) -> list[str]:
        """Remove staged files of attempts that ended without committing (never a running one)."""
        removed = collect_orphans(self.config.table_uri, self.config.storage_options,
                                  self.config.staging_grace_seconds)
        if self.config.dead_letter_table_uri:
            removed += collect_orphans(self.config.dead_letter_table_uri, self.config.storage_options,
                                       self.config.staging_grace_seconds)
        return removed
