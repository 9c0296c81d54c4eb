"""The fan-out loop: one source, one plan, one read, a commit per table.

An ingest with several sinks (:class:`airflow_eo.spec.fanout.FanOutSpec`) runs the steps of a
single table's loop (:class:`airflow_eo.loop.ingest.Ingestion`) for every table at once:

1. **turns**: the run holds every table's lease, taken in table_uri order (two fan-outs sharing
   tables never wait for each other in a circle);
2. **plan**: Kafka's metadata and bounds are asked once (:class:`airflow_eo.kafka.PinnedKafka`), so
   every table's batch ends at the same offsets; each table plans from its own committed offsets
   (a table new to the ingest from its ``starting_offsets``), or replays its logged plan, or holds
   the run's batch already; each new plan is **logged** in its table's plan log before anything
   is read;
3. **read once, commit per table**: one Spark attempt (the first table's, naming the others:
   :mod:`airflow_eo.driver.fanout`) reads the union of the planned ranges once and commits each
   table's rows with *its whole planned range's* offsets in the table's own compare-and-set commit;
4. **verify** each table in its log.

Delta has no commit across two tables: between two tables' commits a reader sees the batch in one
and not yet in the other; each table alone is always exactly-once. A table whose batch fails stays
behind (the others commit), ``run`` then raises its error, and a later run catches it up from its
own offsets while the others read on.

Example::

    >>> spec = FanOutSpec.of(ingest_id="events", topics="events", sinks=[
    ...     {"table_uri": "/lake/events_raw"},
    ...     {"table_uri": "/lake/events_latest", "write_mode": "merge", "merge_key": "key"}])
    >>> FanOut(spec, Secrets({"bootstrap.servers": "…"}), LocalSparkSubmit()).run(RunIdentity("r1"))  # doctest: +SKIP
    FanOutResult(tables=(IngestResult(status='committed', table_uri='/lake/events_latest', ...), ...))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

from airflow_eo.attempt import Attempt, Companion, Secrets
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.errors import AirflowEoError, SparkJobError, error_from_line
from airflow_eo.loop.ingest import Ingestion, NextStep
from airflow_eo.kafka import KafkaOffsets, PinnedKafka
from airflow_eo.logs import about_table
from airflow_eo.core.offsets import Interval, RunIdentity
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.loop.result import IngestResult
from airflow_eo.loop.runner import Submitter
from airflow_eo.spec.fanout import FanOutSpec, matching_topics
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.lease import HeldLease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FanOutResult:
    """Each table's result of one run, in table_uri order."""

    tables: tuple[IngestResult, ...]

    @property
    def status(self) -> RunStatus:
        """Committed when any table committed; else the tables' common status (nothing new without tables)."""
        statuses = {RunStatus(t.status) for t in self.tables}
        if RunStatus.COMMITTED in statuses:
            return RunStatus.COMMITTED
        if len(statuses) == 1:
            return statuses.pop()
        return RunStatus.ALREADY_COMMITTED if RunStatus.ALREADY_COMMITTED in statuses else RunStatus.NOTHING_NEW

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    def to_dict(self) -> dict:
        """The run's summary (XCom, the CLI's JSON): its status, rows and each table's result."""
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

    @property
    def uri(self) -> str:
        return self.ingestion.config.table_uri

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
    """One source and its tables (a :class:`FanOutSpec`), and the steps of a run over all of them."""

    def __init__(self, spec: FanOutSpec, credentials: Secrets, submitter: Submitter,
                 kafka: KafkaOffsets | None = None):
        self.spec, self.credentials, self.submitter = spec, credentials, submitter
        self._kafka = kafka  # None: a pinned client of the credentials per run

    def configs(self, kafka: KafkaOffsets | None = None) -> tuple[IngestConfig, ...]:
        """The tables now: a topic pattern (and ``{topic}``) resolved against Kafka's topics."""
        topics = self.spec.topics
        if self.spec.topic_pattern:
            kafka = kafka or self._kafka or KafkaOffsets(self.credentials.kafka_config)
            topics = matching_topics(self.spec.topic_pattern, kafka.topics())
        return tuple(IngestConfig(spec, self.credentials) for spec in self.spec.tables(topics))

    def run(self, run: RunIdentity, interval: Interval | None = None) -> FanOutResult:
        """Plan (or replay each table's logged plan), log, read once, commit each table, verify.
        Idempotent per run key, per table."""
        started = time.monotonic()
        kafka = self._kafka or PinnedKafka(self.credentials.kafka_config)
        configs = self.configs(kafka)
        if not configs:
            log.info("no topic matches %r yet: no table to write", self.spec.topic_pattern)
            return FanOutResult(())
        tables = [_Table(Ingestion(c, self.submitter, kafka)) for c in configs]
        log.info("run %s: %d table(s): %s", run.run_key, len(tables), ", ".join(c.table_uri for c in configs))
        with ExitStack() as turns:
            for table in tables:  # in table_uri order
                with table.step_of("taking its turn"):
                    table.held = turns.enter_context(table.ingestion.turn(run.run_key))
            results = self._run(run, interval, tables)
        out = FanOutResult(tuple(r.timed(started) for r in results))
        for result in out.tables:
            log.info("%s: batch %s %s, %d rows, table version %s", result.table_uri, result.batch, result.status,
                     result.rows, result.version)
        return out

    def _run(self, run: RunIdentity, interval: Interval | None, tables: list[_Table]) -> list[IngestResult]:
        """Each table's steps; a table whose step fails (planning, its dead letters' roll-forward, a commit,
        its verification) stays behind with its own error while the others commit; then the first error
        is raised, of its own type (what a retry may fix stays retried)."""
        for table in tables:  # every table's plan is logged before anything is read
            if table.error is None:
                with table.step_of("planning"):
                    table.step, table.ledger = table.ingestion.prepare(run, interval)
        results: dict[str, IngestResult] = {}
        reading: list[_Table] = []
        for table in tables:
            if table.error is not None or table.step is None or table.ledger is None:
                continue
            ingestion, step, ledger = table.ingestion, table.step, table.ledger
            with table.step_of("its batch"):
                if step.result is not None:
                    results[table.uri] = step.result
                elif step.plan.interval is not None and not step.plan.data_ranges and ledger.table is not None:
                    results[table.uri] = ingestion.execute(step.plan, table.held, ledger.features.pinned())
                else:
                    table.attempt = ingestion.attempt_of(step.plan, table.held, ledger.features.pinned())
                    reading.append(table)
        if reading:
            for table, outcome in zip(reading, self._read_once(reading)):
                if isinstance(outcome, IngestResult):
                    results[table.uri] = outcome
                else:
                    with table.step_of("its commit"):
                        raise outcome
        for table in tables:
            if table.uri in results:
                with table.step_of("mirroring its offsets"):
                    table.ingestion.mirror(results[table.uri])
        failed = [t for t in tables if t.error is not None]
        if failed:
            raise _naming_table(failed[0].uri, failed[0].error)  # type: ignore[arg-type]
        return [results[t.uri] for t in tables]

    def _read_once(self, tables: list[_Table]) -> list[IngestResult | AirflowEoError]:
        """One Spark attempt for every table that reads: the first table's names the others; each
        table's outcome from its own log (and its attempt's marker, when the job failed)."""
        attempts = [t.attempt for t in tables if t.attempt is not None]
        assert len(attempts) == len(tables)  # every table that reads has its attempt
        first = replace(attempts[0], companions=tuple(Companion(a.table_uri, a.attempt_id) for a in attempts[1:]))
        for table, attempt in zip(tables[1:], attempts[1:]):  # the driver reads them beside their tables
            table.ingestion.staging.begin_attempt(attempt)
        try:
            error = tables[0].ingestion.runner.submit(
                first, also=tuple((t.ingestion.staging, a.attempt_id) for t, a in zip(tables[1:], attempts[1:])))
        finally:
            for table, attempt in zip(tables[1:], attempts[1:]):
                table.ingestion.staging.end_attempt(attempt.attempt_id)
        outcomes: list[IngestResult | AirflowEoError] = []
        for table, attempt in zip(tables, attempts):
            own = None if error is None else _own_error(table.ingestion, attempt, error)
            with about_table(attempt.table_uri):
                try:
                    outcomes.append(table.ingestion.verify(attempt, own))
                except AirflowEoError as exc:
                    outcomes.append(exc)
        return outcomes


def _own_error(ingestion: Ingestion, attempt: Attempt, error: BaseException) -> BaseException | None:
    """What failed ``attempt``'s table when the job failed: the error its marker recorded; none when
    the job's error is another table's (the driver records each table's error in its own marker);
    the job's own (a kill, a crash) when no table could say."""
    marker = ingestion.staging.read_marker(attempt.attempt_id)
    if marker is not None and marker.error:
        return error_from_line(marker.error) or SparkJobError(f"the Spark job failed: {marker.error}")
    if isinstance(error, AirflowEoError) and not isinstance(error, SparkJobError):
        return None
    return ingestion.runner.typed_failure(attempt, error)


def _naming_table(table_uri: str, error: AirflowEoError) -> AirflowEoError:
    """``error`` with its table named (of the same type: what a retry may fix stays retried)."""
    try:
        named = type(error)(f"{table_uri}: {error}")
    except TypeError:
        return error
    named.__cause__ = error
    return named
