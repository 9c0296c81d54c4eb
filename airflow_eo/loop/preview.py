"""The plan preview: what the next run of an ingest would read and write, from the table and Kafka, writing nothing.

``airflow-eo plan`` and the operator's ``dry_run`` show it. It asks the ingest's own step 1,
:meth:`airflow_eo.loop.ingest.Ingestion.next_step` (the planner every run uses, and the run's logged
plan where a run key is given), and stops there: no plan is logged, no attempt is staged, no
orphan is collected, no dead letter is rolled forward, no registry subject is registered, no
lease or turn is taken, and no Spark job starts (the ingestion it is given has no submitter).

What it reads: the table's Delta log (offsets, batch counter, intervals), the plan log, Kafka's
offsets (ListOffsets, read_committed) and, for registry columns, the reader schema versions;
with ``count_records`` the planned ranges' record-batch headers too (the audit's read,
:class:`airflow_eo.audit.coordinates.KafkaCoordinates`), for the exact number of records a
read_committed consumer delivers there (the offsets a range spans are an upper bound: aborted
records and transaction markers take offsets).

Example::

    >>> preview = plan_preview(Ingestion(config, NO_SPARK), RunIdentity("preview"))   # doctest: +SKIP
    >>> preview.action, preview.batch, preview.records                                 # doctest: +SKIP
    (<NextAction.PLAN: 'plan'>, 4, 1200)
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from airflow_eo.core.errors import IntervalNotClosedError
from airflow_eo.loop.ingest import FanOut, Ingestion, NextAction, NextStep
from airflow_eo.core.planning import BatchPlan, ReaderSchema
from airflow_eo.core.offsets import Interval, OffsetRange, RunIdentity
from airflow_eo.sinks import recorded_sink
from airflow_eo.table.ledger import Ledger

log = logging.getLogger(__name__)


class _NoSpark:
    """The submitter of a preview: it never submits (a preview starts no Spark job)."""

    def submit(self, attempt, secrets):  # pragma: no cover - a preview never reaches step 3
        raise RuntimeError("a plan preview starts no Spark job")

    def kill(self) -> None:
        pass


NO_SPARK = _NoSpark()


@dataclass(frozen=True)
class RangePreview:
    """One partition's range of the batch: ``offsets`` it spans; ``records`` a read_committed
    consumer delivers there (None: not counted)."""

    topic: str
    partition: int
    start: int
    end: int
    offsets: int
    records: int | None = None

    def __str__(self) -> str:
        counted = "" if self.records is None else f", {self.records} records"
        return f"{self.topic}[{self.partition}] {self.start}..{self.end} ({self.offsets} offsets{counted})"


@dataclass(frozen=True)
class SinkPreview:
    """A table the run would write: ``role`` is ``table`` (the batch's rows and offsets) or
    ``dead_letters``; ``version`` its current version (None: the run would create it)."""

    role: str
    uri: str
    version: int | None
    write_mode: str = "append"
    merge_key: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()

    def __str__(self) -> str:
        at = "new table" if self.version is None else f"version {self.version}"
        how = recorded_sink(self.write_mode).describe_mode(self.merge_key)
        parts = f", partitioned by {', '.join(self.partition_by)}" if self.partition_by else ""
        return f"{self.role}: {self.uri} ({at}; {how}{parts})"


@dataclass(frozen=True)
class PlanPreview:
    """What the next run would do. ``action``: ``plan`` (a new batch), ``replay`` (the run key's
    logged plan), ``already_committed``, ``nothing_new`` or ``waiting`` (interval mode: the
    interval is not closed yet; ``waiting`` says why). ``sinks`` is a list: every table the run
    would write, the main table first."""

    action: str
    ingest_id: str
    run_key: str
    mode: str
    batch: int | None
    ranges: tuple[RangePreview, ...]
    offsets: int
    records: int | None
    interval: dict | None
    reader_schemas: tuple[ReaderSchema, ...]
    sinks: tuple[SinkPreview, ...]
    new_partitions: tuple[str, ...] = ()
    new_partition_starts: tuple[str, ...] = ()  # where each new partition starts, and why
    skipped: tuple[str, ...] = ()
    resets: tuple[str, ...] = ()
    dedup_key: str | None = None
    starts_spark: bool = False
    waiting: str | None = None
    lag: dict[str, int] | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The preview for a person: one fact a line."""
        head = {"plan": f"batch {self.batch} would read {self.offsets} offsets" +
                ("" if self.records is None else f", {self.records} records"),
                "replay": f"batch {self.batch} (the run's logged plan) would be read again: {self.offsets} offsets" +
                ("" if self.records is None else f", {self.records} records"),
                "already_committed": f"batch {self.batch} of this run is already in the table: nothing would be read",
                "nothing_new": "nothing new: the run would commit nothing",
                "waiting": f"the run would wait: {self.waiting}"}[self.action]
        out = [f"{self.ingest_id} ({self.mode} mode), run {self.run_key or '(one-off)'}: {head}"]
        if self.interval:
            out.append(f"interval: {Interval(**self.interval)}")
        out += [f"  {r}" for r in self.ranges]
        out += [f"new partition: {p}" for p in self.new_partition_starts or self.new_partitions]
        out += [f"skipped (data loss): {s}" for s in self.skipped]
        out += [f"topic recreated, reset: {r}" for r in self.resets]
        out += [f"reader schema: {s.column} {s}" for s in self.reader_schemas]
        if self.dedup_key:
            out.append(f"dedup by: {self.dedup_key}")
        out += [f"writes {s}" for s in self.sinks]
        if self.action in ("plan", "replay"):
            out.append("Spark: " + ("a Spark job would read the batch" if self.starts_spark else
                                    "none (the driver would read this batch itself)"))
        out.append("nothing was written: a preview logs no plan, stages nothing and starts no Spark job")
        return out


@dataclass(frozen=True)
class PlanPreviews:
    """The previews of every table of an ingest (``one_table``: the single-table form, shown as that
    table's preview as it always was)."""

    tables: tuple[PlanPreview, ...]
    one_table: bool = False

    def to_dict(self) -> dict:
        if self.one_table and len(self.tables) == 1:
            return self.tables[0].to_dict()
        return {"tables": [p.to_dict() for p in self.tables]}

    def lines(self) -> list[str]:
        out: list[str] = []
        for i, preview in enumerate(self.tables):
            out += ([""] if i else []) + preview.lines()
        return out


def plan_previews(ingest: FanOut, run: RunIdentity, interval: Interval | None = None,
                  count_records: bool = True) -> PlanPreviews:
    """The next run of ``run``'s key on each table of ``ingest`` (its tables now: a pattern resolved)."""
    return PlanPreviews(tuple(plan_preview(Ingestion(c, NO_SPARK), run, interval, count_records=count_records)
                              for c in ingest.configs()), ingest.one_table)


def plan_preview(ingestion: Ingestion, run: RunIdentity, interval: Interval | None = None,
                 count_records: bool = True) -> PlanPreview:
    """The next run of ``run``'s key on ``ingestion``'s table, decided as the run would decide it
    (:meth:`~airflow_eo.loop.ingest.Ingestion.next_step`), without any of its writes."""
    ledger = ingestion.ledger()  # the ingest's read-only checks first: its table, its write mode
    try:
        step = ingestion.next_step(run, ledger, interval)
    except IntervalNotClosedError as exc:
        return _preview(ingestion, ledger, run, None, interval, waiting=str(exc).split("; Nothing was committed")[0])
    return _preview(ingestion, ledger, run, step, interval, count_records=count_records)


def _preview(ingestion: Ingestion, ledger: Ledger, run: RunIdentity, step: NextStep | None,
             interval: Interval | None, waiting: str | None = None, count_records: bool = False) -> PlanPreview:
    config = ingestion.config
    reads = step is not None and step.action in (NextAction.PLAN, NextAction.REPLAY)
    plan: BatchPlan | None = step.plan if step is not None else None
    data = plan.data_ranges if reads and plan is not None else ()
    counts = _record_counts(config.kafka_config, data) if count_records and data else {}
    ranges = tuple(RangePreview(r.topic, r.partition, r.start, r.end, r.size, counts.get(r)) for r in data)
    lag = step.result.lag if step is not None and step.result is not None else ingestion.lag(ledger)
    return PlanPreview(
        action="waiting" if step is None else step.action.value,
        ingest_id=config.ingest_id, run_key=run.run_key, mode=str(config.spec.planning.mode.value),
        batch=None if step is None or plan is None or step.action is NextAction.NOTHING_NEW else plan.batch,
        ranges=ranges, offsets=sum(r.offsets for r in ranges),
        records=sum(counts.values()) if counts else (0 if reads and not data else None),
        interval=asdict(interval) if interval is not None else None,
        reader_schemas=tuple(plan.reader_schemas or ()) if reads and plan is not None else (),
        sinks=sinks_of(ingestion, ledger),
        new_partitions=tuple(str(tp) for tp in plan.new_partitions) if reads and plan is not None else (),
        new_partition_starts=_new_partitions(config, ledger, plan) if reads and plan is not None else (),
        skipped=tuple(f"{s.topic}[{s.partition}] {s.start}..{s.end}: {s.reason}" for s in plan.skipped)
        if reads and plan is not None else (),
        resets=tuple(f"{r.topic}[{r.partition}] from {r.committed} to "
                     + ("its start, offset " + str(r.start) if r.start is not None else "none (the new topic has no such "
                        "partition)") + f": {r.reason}" for r in plan.resets) if reads and plan is not None else (),
        dedup_key=config.spec.dedup.key, starts_spark=reads and _starts_spark(ingestion, ledger, plan),
        waiting=waiting, lag=lag,
    )


def _new_partitions(config, ledger: Ledger, plan: BatchPlan) -> tuple[str, ...]:
    """Each partition the batch reads first, and where it starts: ``starting_offsets`` in the table's
    first batch (or where the user named the partition); later, its log start."""
    first = ledger.last_batch(config.ingest_id) == 0
    position = config.spec.source.starting_offsets
    starts = plan.starts

    def how(tp) -> str:
        if first:
            return f"from starting_offsets ({position.kind}), offset {starts[tp]}"
        if position.kind == "offsets" and tp in position.offsets:
            return f"from its starting_offsets entry, offset {starts[tp]}"
        return f"new partition, from its start (offset {starts[tp]})"

    return tuple(f"{tp}, {how(tp)}" for tp in plan.new_partitions)


def sinks_of(ingestion: Ingestion, ledger: Ledger) -> tuple[SinkPreview, ...]:
    """Every table a run of this ingest writes, the main table first (then its dead-letter table)."""
    spec = ingestion.config.spec
    merge = spec.merge
    sinks = [SinkPreview("table", ledger.table_uri, ledger.version, merge.write_mode.value, tuple(merge.key),
                         tuple(ledger.partition_columns) if ledger.exists else tuple(spec.table.partition_by))]
    if spec.dead_letters.table_uri:
        dead = Ledger.open(spec.dead_letters.table_uri, ingestion.storage_options)
        sinks.append(SinkPreview("dead_letters", dead.table_uri, dead.version))
    return tuple(sinks)


def _starts_spark(ingestion: Ingestion, ledger: Ledger, plan: BatchPlan | None) -> bool:
    """Whether the attempt of ``plan`` would run a Spark job (not when the driver reads it itself; a
    table with rules for new rows or column mapping takes the Spark path)."""
    from airflow_eo.driver.tables import needs_spark

    return plan is not None and needs_spark([ingestion.config.attempt(plan.with_attempt("preview"))],
                                            lambda _: ledger.features)


def _record_counts(kafka_config, ranges: tuple[OffsetRange, ...]) -> dict[OffsetRange, int]:
    """The records a read_committed consumer delivers in each range (offsets from record-batch headers)."""
    from airflow_eo.audit.coordinates import KafkaCoordinates

    with KafkaCoordinates(kafka_config) as kafka:
        return {r: int(kafka.offsets(r.tp, r.start, r.end).size) for r in ranges}
