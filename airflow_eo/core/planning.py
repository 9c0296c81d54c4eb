"""The planning core: offset arithmetic as pure functions over small value objects.

Nothing here touches Kafka, Spark or Delta. The I/O layers gather *facts* (what the
table has committed, what Kafka holds) and this module decides what the next batch
reads, and whether a finished batch may be committed.

Offsets follow Kafka: a range ``[start, end)`` holds the offsets ``start .. end-1``; a
committed offset is the *next* offset to read. Offsets have gaps (transaction markers,
aborted records), so ``end - start`` is an upper bound on the records in a range.

Example::

    >>> tp = TopicPartition("orders", 0)
    >>> plan = plan_batch(
    ...     ingest_id="orders_raw", batch=1, committed={tp: 10},
    ...     bounds={tp: PartitionBounds(tp, log_start=0, end=25)}, new_starts={})
    >>> plan.ranges
    (OffsetRange(topic='orders', partition=0, start=10, end=25),)
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Mapping

from airflow_eo.core.errors import ConfigError, DataLossError, OffsetsAheadError, TopicRecreatedError
from airflow_eo.core.identity import OnTopicRecreated, Recreation
from airflow_eo.core.offsets import (
    EARLIEST, Interval, OffsetRange, PartitionBounds, RecordStamp, RunIdentity, SkippedRange, TopicPartition,
    TopicReset,
)


@dataclass(frozen=True)
class ReaderSchema:
    """A reader schema resolved when a batch was planned: the Schema Registry subject version the
    batch's ``column`` (``value`` or ``key``) is decoded with, and the version the spec asked for
    (``latest`` or a number). Logged with the plan, so every replay decodes with the same one.

        >>> str(ReaderSchema("value", "orders-value", 3, 17))
        'orders-value version 3 (schema id 17)'
    """

    column: str
    subject: str
    version: int
    schema_id: int
    requested: str = "latest"

    def __str__(self) -> str:
        return f"{self.subject} version {self.version} (schema id {self.schema_id})"

    @classmethod
    def from_dict(cls, raw: Mapping) -> "ReaderSchema":
        return cls(str(raw["column"]), str(raw["subject"]), int(raw["version"]), int(raw["schema_id"]),
                   str(raw.get("requested", "latest")))


def reader_schemas_of(raw: "Iterable[Mapping] | None") -> "tuple[ReaderSchema, ...] | None":
    """Reader schemas as JSON wrote them (a list of objects), or None where none were recorded."""
    return None if raw is None else tuple(ReaderSchema.from_dict(r) for r in raw)


class OnDataLoss(str, enum.Enum):
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class BatchPlan:
    """The offsets one batch reads, decided before any data is read.

    ``ranges`` lists every partition of the batch, empty ones included, so that the
    compare-and-set commit checks the whole table position, not only what moved.
    """

    ingest_id: str
    batch: int
    ranges: tuple[OffsetRange, ...]
    run: RunIdentity
    new_partitions: tuple[TopicPartition, ...] = ()
    skipped: tuple[SkippedRange, ...] = ()
    planned_at: str = ""
    attempt_id: str = ""
    # interval mode (airflow_eo.core.intervals): the data interval the batch owns, and the partitions
    # whose end boundary was fixed at their end offset because they stayed idle past the grace
    interval: Interval | None = None
    closed_idle: tuple[TopicPartition, ...] = ()
    # the registry reader schemas the batch decodes with, resolved when it was planned; None: not
    # recorded (a plan an earlier version logged, or one that reads nothing)
    reader_schemas: tuple[ReaderSchema, ...] | None = None
    # what identifies the topics read (airflow_eo.core.identity), committed with the offsets: each
    # topic's id where Kafka reports one, else the fingerprint of each partition's last record below
    # the plan's end (None: no record found there, the partition's fingerprint is cleared)
    topic_ids: tuple[tuple[str, str], ...] = ()
    stamps: tuple[tuple[TopicPartition, RecordStamp | None], ...] = ()
    # partitions of recreated topics read from the new topic's start (on_topic_recreated="reset")
    resets: tuple[TopicReset, ...] = ()

    @property
    def starts(self) -> dict[TopicPartition, int]:
        return {r.tp: r.start for r in self.ranges}

    @property
    def ends(self) -> dict[TopicPartition, int]:
        return {r.tp: r.end for r in self.ranges}

    @property
    def expected_committed(self) -> dict[TopicPartition, int | None]:
        """The table offsets this plan was made from: ``None`` for new partitions, the start
        of the skipped gap for partitions that skip retention loss, else the range start."""
        expected: dict[TopicPartition, int | None] = {
            r.tp: (None if r.tp in self.new_partitions else r.start) for r in self.ranges
        }
        for gap in self.skipped:
            expected[TopicPartition(gap.topic, gap.partition)] = gap.start
        for reset in self.resets:
            if reset.tp in expected:
                expected[reset.tp] = reset.committed
        return expected

    @property
    def data_ranges(self) -> tuple[OffsetRange, ...]:
        return tuple(r for r in self.ranges if r.size > 0)

    @property
    def is_empty(self) -> bool:
        """True when committing would change nothing in the ledger (an interval is recorded
        even when it holds no records: its boundaries are fixed by its commit)."""
        return not self.data_ranges and not self.new_partitions and not self.skipped and not self.resets \
            and self.interval is None

    def with_attempt(self, attempt_id: str) -> "BatchPlan":
        return replace(self, attempt_id=attempt_id)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BatchPlan":
        raw = json.loads(text)
        return cls(
            ingest_id=raw["ingest_id"],
            batch=raw["batch"],
            ranges=tuple(OffsetRange(**r) for r in raw["ranges"]),
            run=RunIdentity(**raw["run"]),
            new_partitions=tuple(TopicPartition(**t) for t in raw["new_partitions"]),
            skipped=tuple(SkippedRange(**s) for s in raw["skipped"]),
            planned_at=raw.get("planned_at", ""),
            attempt_id=raw.get("attempt_id", ""),
            interval=Interval(**raw["interval"]) if raw.get("interval") else None,
            closed_idle=tuple(TopicPartition(**t) for t in raw.get("closed_idle", ())),
            reader_schemas=reader_schemas_of(raw.get("reader_schemas")),
            topic_ids=tuple((str(t), str(i)) for t, i in raw.get("topic_ids", ())),
            stamps=tuple((TopicPartition(**tp), RecordStamp(**st) if st else None) for tp, st in raw.get("stamps", ())),
            resets=tuple(TopicReset(**r) for r in raw.get("resets", ())),
        )


@dataclass(frozen=True)
class StartingPosition:
    """Where a partition the table has never read starts.

    Parsed from ``"earliest"``, ``"latest"``, ``{"timestamp": epoch_ms}`` or explicit
    offsets ``{"topic": {"0": 42, "1": -2}}`` (``-2`` earliest, ``-1`` latest; partitions
    not listed start at earliest), the conventions of Spark's Kafka source.
    """

    kind: str  # "earliest" | "latest" | "timestamp" | "offsets"
    timestamp_ms: int | None = None
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: "str | Mapping | StartingPosition | None") -> "StartingPosition":
        if value is None:
            return cls("earliest")
        if isinstance(value, StartingPosition):
            return value
        if isinstance(value, str):
            text = value.strip()
            if text in ("earliest", "latest"):
                return cls(text)
            try:
                value = json.loads(text)
            except ValueError:
                raise ConfigError(
                    f"starting_offsets={value!r} is not understood: use 'earliest', 'latest', "
                    '{"timestamp": <epoch ms>} or {"<topic>": {"<partition>": <offset>}}'
                ) from None
        if not isinstance(value, Mapping):
            raise ConfigError(f"starting_offsets must be a string or a mapping, got {value!r}")
        if set(value) == {"timestamp"}:
            return cls("timestamp", timestamp_ms=int(value["timestamp"]))
        offsets: dict[TopicPartition, int] = {}
        for topic, per_partition in value.items():
            if not isinstance(per_partition, Mapping):
                raise ConfigError(
                    f"starting_offsets for topic {topic!r} must map partition to offset, "
                    f"got {per_partition!r}"
                )
            for partition, offset in per_partition.items():
                offsets[TopicPartition(topic, int(partition))] = int(offset)
        return cls("offsets", offsets=offsets)

    def explicit_offset(self, tp: TopicPartition) -> int:
        """Offset for ``tp`` under an ``offsets`` position: an offset, EARLIEST or LATEST."""
        return self.offsets.get(tp, EARLIEST)

    def after_first_batch(self) -> "StartingPosition":
        """Where a partition starts that appears after the table's first batch: at its log start (as
        Spark's Kafka source starts partitions it discovers later), unless the user named that very
        partition (explicit offsets). ``latest`` or a timestamp for a partition added later would skip
        the records written to it before the next run.

        >>> StartingPosition.parse("latest").after_first_batch().kind
        'earliest'
        """
        return self if self.kind == "offsets" else StartingPosition("earliest")


def partitions_without_offsets(
    committed: Mapping[TopicPartition, int | None], bounds: Mapping[TopicPartition, PartitionBounds]
) -> list[TopicPartition]:
    """Partitions Kafka has and the table has never committed: they need a start."""
    return sorted(tp for tp in bounds if committed.get(tp) is None)


def check_start(tp: TopicPartition, start: int, bounds: PartitionBounds) -> int:
    """Validate a resolved starting offset against what Kafka holds."""
    if not bounds.log_start <= start <= bounds.end:
        raise ConfigError(
            f"starting offset {start} for {tp} is outside what Kafka holds "
            f"[{bounds.log_start}, {bounds.end}): pick an offset in that range, or 'earliest'"
        )
    return start


def fair_caps(backlogs: Mapping[TopicPartition, int], cap: int | None) -> dict[TopicPartition, int]:
    """Split a per-run cap over partitions by max-min fairness (water filling).

    Each partition gets an equal share; shares a partition cannot use go to the others.
    Leftover units after integer division go to partitions in sorted order, so the
    split is deterministic.

        >>> a, b = TopicPartition("t", 0), TopicPartition("t", 1)
        >>> fair_caps({a: 5, b: 100}, 50)
        {TopicPartition(topic='t', partition=0): 5, TopicPartition(topic='t', partition=1): 45}
    """
    if cap is None:
        return dict(backlogs)
    if cap <= 0:
        raise ConfigError(f"max_records_per_run must be positive, got {cap}")
    grant = {tp: 0 for tp in backlogs}
    hungry = sorted(tp for tp, n in backlogs.items() if n > 0)
    left = cap
    while hungry and left > 0:
        share, extra = divmod(left, len(hungry))
        still_hungry = []
        for i, tp in enumerate(hungry):
            want = backlogs[tp] - grant[tp]
            give = min(want, share + (1 if i < extra else 0))
            grant[tp] += give
            left -= give
            if grant[tp] < backlogs[tp]:
                still_hungry.append(tp)
        if len(still_hungry) == len(hungry) and share == 0 and extra == 0:
            break
        hungry = still_hungry
    return grant


def plan_batch(
    *,
    ingest_id: str,
    batch: int,
    committed: Mapping[TopicPartition, int | None],
    bounds: Mapping[TopicPartition, PartitionBounds],
    new_starts: Mapping[TopicPartition, int],
    max_records: int | None = None,
    on_data_loss: OnDataLoss | str = OnDataLoss.FAIL,
    run: RunIdentity | None = None,
    planned_at: str = "",
    recreated: "Iterable[Recreation]" = (),
    on_topic_recreated: OnTopicRecreated | str = OnTopicRecreated.FAIL,
) -> BatchPlan:
    """Plan the next batch: ``[committed, end)`` per partition, capped fairly.

    ``committed`` holds the table's offsets (``None`` or missing: never read);
    ``bounds`` what Kafka holds now (end = last stable offset); ``new_starts`` the
    resolved start of each partition the table has never read; ``recreated`` the topics whose
    identity changed (:func:`airflow_eo.core.identity.recreations`): refused, or with
    ``on_topic_recreated="reset"`` read from the new topic's start.
    """
    on_data_loss = OnDataLoss(on_data_loss)
    resets = _resets(committed, bounds, tuple(recreated), OnTopicRecreated(on_topic_recreated))
    reset = {r.tp: r for r in resets}
    for tp, offset in committed.items():
        if offset and tp not in bounds and tp not in reset:  # offset 0: nothing of it was read
            raise OffsetsAheadError(
                f"{tp} has committed offset {offset} in the table but no longer exists in "
                "Kafka (topic deleted or recreated with fewer partitions): ingest into a new "
                "table or with a new ingest_id; the table is unchanged"
            )
    starts: dict[TopicPartition, int] = {}
    skipped: list[SkippedRange] = []
    new: list[TopicPartition] = []
    for tp in sorted(bounds):
        b = bounds[tp]
        offset = committed.get(tp)
        if tp in reset:  # the new topic's partition, from its start
            starts[tp] = b.log_start
            continue
        if offset is None:
            starts[tp] = check_start(tp, new_starts[tp], b)
            new.append(tp)
            continue
        if offset > b.end:
            raise OffsetsAheadError(
                f"{tp}: the table committed offset {offset} but Kafka's end offset is {b.end} "
                "(topic recreated or truncated): ingest into a new table or with a new "
                "ingest_id; the table is unchanged"
            )
        if offset < b.log_start:
            if on_data_loss is OnDataLoss.FAIL:
                raise DataLossError(
                    f"{tp}: the table's next offset is {offset} but Kafka now starts at "
                    f"{b.log_start}: offsets {offset}..{b.log_start} were deleted by retention "
                    "before they were ingested. Re-run with on_data_loss='skip' to skip them "
                    "(the gap is recorded in the commit); the table is unchanged"
                )
            skipped.append(SkippedRange(tp.topic, tp.partition, offset, b.log_start, "retention"))
            offset = b.log_start
        starts[tp] = offset
    backlog = {tp: bounds[tp].end - starts[tp] for tp in starts}
    caps = fair_caps(backlog, max_records)
    ranges = tuple(
        OffsetRange(tp.topic, tp.partition, starts[tp], starts[tp] + caps[tp]) for tp in sorted(starts)
    )
    return BatchPlan(
        ingest_id=ingest_id,
        batch=batch,
        ranges=ranges,
        run=run or RunIdentity(run_key=""),
        new_partitions=tuple(new),
        skipped=tuple(skipped),
        planned_at=planned_at,
        resets=resets,
    )


def _resets(committed: Mapping[TopicPartition, int | None], bounds: Mapping[TopicPartition, PartitionBounds],
            recreated: tuple[Recreation, ...], rule: OnTopicRecreated) -> tuple[TopicReset, ...]:
    """The partitions read again from a recreated topic's start (or the refusal of the first one)."""
    if not recreated:
        return ()
    if rule is OnTopicRecreated.FAIL:
        raise TopicRecreatedError(
            f"{recreated[0]}: reading on from the old offsets would skip the new topic's first records. Run with "
            "on_topic_recreated='reset' (CLI --on-topic-recreated reset) to read the new topic from its start (the "
            "reset is recorded in the commit); the table is unchanged")
    reasons = {r.topic: f"{r.recorded} before, {r.found} now" for r in recreated}
    return tuple(
        TopicReset(tp.topic, tp.partition, committed.get(tp), bounds[tp].log_start if tp in bounds else None,
                   reasons[tp.topic])
        for tp in sorted(set(committed) | set(bounds))
        if tp.topic in reasons and committed.get(tp) is not None)


def split_range(r: OffsetRange, max_size: int) -> list[OffsetRange]:
    """Cut a range into pieces of at most ``max_size`` offsets (Spark input partitions)."""
    if max_size <= 0:
        raise ConfigError(f"max offsets per Spark task must be positive, got {max_size}")
    return [
        OffsetRange(r.topic, r.partition, lo, min(lo + max_size, r.end))
        for lo in range(r.start, r.end, max_size)
    ]


def read_slices(ranges: Iterable[OffsetRange], max_size: int) -> list[OffsetRange]:
    """The Spark read tasks of ``ranges``: each range cut by :func:`split_range`, in order."""
    return [piece for r in ranges for piece in split_range(r, max_size)]


class CommitCheck(str, enum.Enum):
    READY = "ready"
    ALREADY_COMMITTED = "already_committed"
    CONFLICT = "conflict"


def compare_offsets(plan: BatchPlan, committed: Mapping[TopicPartition, int | None]) -> CommitCheck:
    """The compare half of compare-and-set: may ``plan`` be committed on this table state?

    READY when the table is exactly at the plan's starts; ALREADY_COMMITTED when it is
    exactly at the plan's ends (an earlier attempt committed it); anything else means
    another batch moved the table and this one must not land.
    """
    current = {tp: committed.get(tp) for tp in plan.starts}
    if current == plan.expected_committed:
        return CommitCheck.READY
    if current == plan.ends:
        return CommitCheck.ALREADY_COMMITTED
    return CommitCheck.CONFLICT


def batch_state(
    plan: BatchPlan, committed: Mapping[TopicPartition, int | None], last_batch: int,
    recorded_ranges: "tuple[OffsetRange, ...] | None" = None, recorded_run_key: str | None = None,
) -> CommitCheck:
    """Is ``plan`` committable, committed, or overtaken? The one answer every step uses.

    READY: the table is at the plan's starts and its last batch is the one before;
    ALREADY_COMMITTED: the table is at or past the plan's ends, its batch counter reached
    the plan's batch, and the commit recorded for that batch (when the log still holds
    it: ``recorded_ranges``) read the plan's ranges for the plan's own run
    (``recorded_run_key``); CONFLICT: anything else, e.g. another run's plan took this batch
    number, or another run committed the same ranges first (the race loser must not claim
    the winner's batch).

        >>> tp = TopicPartition("t", 0)
        >>> plan = BatchPlan("i", 2, (OffsetRange("t", 0, 10, 20),), RunIdentity("r"))
        >>> batch_state(plan, {tp: 10}, last_batch=1).value, batch_state(plan, {tp: 25}, last_batch=3).value
        ('ready', 'already_committed')
    """
    check = compare_offsets(plan, committed)
    if check is CommitCheck.READY:
        return CommitCheck.READY if last_batch == plan.batch - 1 else CommitCheck.CONFLICT
    covered = last_batch >= plan.batch and all(
        (found := committed.get(tp)) is not None and found >= end for tp, end in plan.ends.items())
    if not covered or not recorded_as(plan, recorded_ranges, recorded_run_key):
        return CommitCheck.CONFLICT
    return CommitCheck.ALREADY_COMMITTED


def recorded_as(plan: BatchPlan, recorded_ranges: "tuple[OffsetRange, ...] | None",
                recorded_run_key: str | None) -> bool:
    """Whether the commit recorded for the plan's batch (where the log still holds it) read the
    plan's ranges for the plan's own run: the race loser must not claim the winner's batch."""
    if recorded_ranges is not None and sorted(recorded_ranges) != sorted(plan.ranges):
        return False
    return recorded_run_key is None or not plan.run.run_key or recorded_run_key == plan.run.run_key


def backlog(
    bounds: Mapping[TopicPartition, PartitionBounds], committed: Mapping[TopicPartition, int | None],
    new_starts: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """Offsets Kafka holds beyond what the table committed: the lag, and the sensor's backlog.

    A partition the table never read counts from where it would start (``new_starts``,
    default its first retained offset); offsets deleted by retention are not counted.
    Offsets have gaps, so this is an upper bound on the records waiting.

        >>> tp = TopicPartition("t", 0)
        >>> backlog({tp: PartitionBounds(tp, log_start=5, end=20)}, {tp: 12})
        {TopicPartition(topic='t', partition=0): 8}
    """
    lag = {}
    for tp, b in bounds.items():
        start = committed.get(tp)
        if start is None:
            start = (new_starts or {}).get(tp, b.log_start)
        lag[tp] = max(0, b.end - max(b.log_start, start))
    return lag


def describe_mismatch(plan: BatchPlan, committed: Mapping[TopicPartition, int | None]) -> str:
    """Human-readable list of partitions whose table offset differs from the plan."""
    parts = []
    expected = plan.expected_committed
    for r in plan.ranges:
        now = committed.get(r.tp)
        if now != expected[r.tp]:
            parts.append(f"{r.tp}: planned {r.start}..{r.end}, table at {now}")
    return "; ".join(parts) or "offsets differ from both the plan's starts and its ends"
