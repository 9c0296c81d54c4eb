"""Interval mode: a batch owns the records of a data interval, chosen by Kafka timestamp (pure).

For each topic-partition, the interval ``[T0, T1)`` owns the offsets ``[B(T0), B(T1))``,
where ``B(t)`` is the first offset whose record timestamp is ``>= t`` (Kafka's ListOffsets by
timestamp, read_committed). ``B`` is monotone in ``t``, so intervals that touch tile the log:
every record belongs to exactly one interval, whatever the order of its timestamps. A record
whose timestamp is before its interval arrived late; it is read once, in the interval where it
arrived, and counted as late.

A boundary, once a committed interval used it, is read from the table (a ``txn`` per
partition and time: :mod:`airflow_eo.table.intervals`), never recomputed: the neighbour of a
committed interval starts or ends at the same offset whatever order the runs take. A boundary
not recorded yet is clamped between the recorded ones before and after it, so a plan never
overlaps a committed interval.

An interval is *closed* (may be planned) when each partition holds a record with a timestamp
``>= T1`` below its last stable offset, or a later committed interval bounds it, or the
partition stayed idle ``close_after`` past ``T1``: then its boundary is the end offset at
planning, recorded by the commit; records arriving later with older timestamps are late
records of the next interval.

Example::

    >>> tp = TopicPartition("t", 0)
    >>> facts = {tp: PartitionFacts(PartitionBounds(tp, 0, 50), found_start=10, found_end=30)}
    >>> plan = plan_interval(ingest_id="i", batch=1, interval=Interval(0, 3_600_000), facts=facts,
    ...                      now_ms=4_000_000, close_after_ms=0)
    >>> plan.ranges
    (OffsetRange(topic='t', partition=0, start=10, end=30),)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping

from airflow_eo.core.errors import ConfigError, DataLossError, IntervalNotClosedError, OffsetsAheadError
from airflow_eo.core.planning import BatchPlan, CommitCheck, OnDataLoss
from airflow_eo.core.offsets import Interval, OffsetRange, PartitionBounds, RunIdentity, SkippedRange, TopicPartition

DEFAULT_CLOSE_AFTER_SECONDS = 15 * 60
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(value: "str | int | float | datetime", name: str = "interval time") -> int:
    """Epoch milliseconds from ISO-8601 *with a zone*, a ``datetime`` with a zone, or epoch ms.

        >>> parse_time("2026-03-04T00:00:00Z"), parse_time("1772582400000")
        (1772582400000, 1772582400000)
    """
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    else:
        try:
            moment = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{name} {value!r} is not a time: use ISO-8601 with a zone "
                              "(2026-03-04T00:00:00Z) or epoch milliseconds; nothing was committed") from None
    if moment.tzinfo is None:
        raise ConfigError(f"{name} {value!r} has no time zone: add one (e.g. 2026-03-04T00:00:00Z or "
                          "+02:00), Kafka timestamps are UTC; nothing was committed")
    return int(moment.timestamp() * 1000)


def parse_duration(value: "str | int | float | None", default: float = DEFAULT_CLOSE_AFTER_SECONDS) -> float:
    """Seconds from ``900``, ``"90s"``, ``"15m"``, ``"1h"``, ``"1d"`` (``None``: the default).

        >>> parse_duration("15m"), parse_duration(30)
        (900.0, 30.0)
    """
    if value is None:
        return float(default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(f"duration {value!r} is not understood: use seconds or <n>s, <n>m, <n>h, <n>d")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ConfigError(f"duration {value!r} must not be negative")
    return seconds


def interval_of(start, end) -> Interval:
    """The interval ``[start, end)``; refuses an empty or reversed one."""
    interval = Interval(parse_time(start, "interval start"), parse_time(end, "interval end"))
    if interval.end_ms <= interval.start_ms:
        raise ConfigError(f"interval end {end!r} is not after its start {start!r}: give start < end; "
                          "nothing was committed")
    return interval


@dataclass(frozen=True)
class CommittedInterval:
    """An interval the table holds, and the batch that committed it."""

    batch: int
    interval: Interval


@dataclass(frozen=True)
class PartitionFacts:
    """What the I/O layers gathered for one partition before an interval is planned.

    ``recorded_*``: the boundary at T0 / T1 a committed interval fixed (None: not recorded);
    ``found_*``: Kafka's first offset with a timestamp at or after T0 / T1 (-1: none below the
    last stable offset); ``floor`` / ``ceiling``: the nearest recorded boundary before T0 /
    after T1 (None: none); ``newest_ms``: the newest record timestamp, for the error message.
    """

    bounds: PartitionBounds
    recorded_start: int | None = None
    recorded_end: int | None = None
    found_start: int = -1
    found_end: int = -1
    floor: int | None = None
    ceiling: int | None = None
    newest_ms: int | None = None


def overlapping(interval: Interval, committed: list[CommittedInterval]) -> CommittedInterval | None:
    """A committed interval that overlaps ``interval`` without being it (None: none)."""
    for c in committed:
        if c.interval != interval and c.interval.start_ms < interval.end_ms and interval.start_ms < c.interval.end_ms:
            return c
    return None


def neighbour_times(interval: Interval, committed: list[CommittedInterval]) -> tuple[int | None, int | None]:
    """The nearest recorded boundary times at or before T0 and at or after T1. Recorded
    boundaries are monotone in time, so the nearest is the tightest bound."""
    times = {t for c in committed for t in (c.interval.start_ms, c.interval.end_ms)}
    before = [t for t in times if t <= interval.start_ms]
    after = [t for t in times if t >= interval.end_ms]
    return (max(before) if before else None), (min(after) if after else None)


def _clamp(offset: int, floor: int | None, ceiling: int | None) -> int:
    if floor is not None:
        offset = max(offset, floor)
    if ceiling is not None:
        offset = min(offset, ceiling)
    return offset


def _below(found: int, bounds: PartitionBounds) -> int | None:
    """An offset found by timestamp, if it is below the last stable offset (decided)."""
    return found if 0 <= found < bounds.end else None


def _iso(ms: int | None) -> str:
    if ms is None:
        return "none"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def waiting(f: PartitionFacts, interval: Interval, now_ms: int, close_after_ms: int) -> bool:
    """Whether the partition may still receive records of ``interval``: no recorded end, no
    later record below its last stable offset, no later committed interval, within the grace."""
    return (f.recorded_end is None and _below(f.found_end, f.bounds) is None and f.ceiling is None
            and now_ms < interval.end_ms + close_after_ms)


def plan_interval(
    *, ingest_id: str, batch: int, interval: Interval, facts: Mapping[TopicPartition, PartitionFacts],
    now_ms: int, close_after_ms: int, on_data_loss: OnDataLoss | str = OnDataLoss.FAIL,
    run: RunIdentity | None = None, planned_at: str = "",
) -> BatchPlan:
    """The offsets ``interval`` owns in each partition (see the module doc), or
    :class:`IntervalNotClosedError` (retryable) naming a partition that may still receive
    records of it."""
    on_data_loss = OnDataLoss(on_data_loss)
    ranges, skipped, idle, open_ = [], [], [], []
    for tp in sorted(facts):
        f, b = facts[tp], facts[tp].bounds
        if f.recorded_start is not None:
            start = f.recorded_start
        else:
            found = _below(f.found_start, b)
            start = _clamp(b.end if found is None else found, f.floor, f.ceiling)
        if waiting(f, interval, now_ms, close_after_ms):
            open_.append((tp, f))
            continue
        if f.recorded_end is not None:
            end = f.recorded_end
        elif _below(f.found_end, b) is not None:
            end = _clamp(f.found_end, f.floor, f.ceiling)
        elif f.ceiling is not None:  # a later committed interval already bounds this one
            end = _clamp(b.end, f.floor, f.ceiling)
        else:  # idle past the grace: fix it at the end
            end = _clamp(b.end, f.floor, None)
            idle.append(tp)
        if max(start, end) > b.end:
            raise OffsetsAheadError(
                f"{tp}: interval {interval} recorded offsets up to {max(start, end)} but Kafka's end offset is "
                f"{b.end} (topic recreated or truncated): ingest into a new table or with a new ingest_id; "
                "the table is unchanged")
        end = max(end, start)
        if start < b.log_start:
            if on_data_loss is OnDataLoss.FAIL:
                raise DataLossError(
                    f"{tp}: interval {interval} starts at offset {start} but Kafka now starts at {b.log_start}: "
                    "its records were deleted by retention before they were ingested. Re-run with "
                    "on_data_loss='skip' to skip them (the gap is recorded); the table is unchanged")
            skipped.append(SkippedRange(tp.topic, tp.partition, start, min(b.log_start, end), "retention"))
            start = min(b.log_start, end)
        ranges.append(OffsetRange(tp.topic, tp.partition, start, end))
    if open_:
        tp, f = open_[0]
        raise IntervalNotClosedError(
            f"interval {interval} is not closed yet: {tp} has no record with a timestamp at or after "
            f"{_iso(interval.end_ms)} below its last stable offset {f.bounds.end} (newest record "
            f"{_iso(f.newest_ms)}){f' and {len(open_) - 1} more partition(s)' if len(open_) > 1 else ''}; "
            "it closes when one arrives, or close_after past the interval end if the partition stays "
            "idle. Nothing was committed; retry later")
    return BatchPlan(ingest_id=ingest_id, batch=batch, ranges=tuple(ranges), run=run or RunIdentity(""),
                     skipped=tuple(skipped), planned_at=planned_at, interval=interval, closed_idle=tuple(idle))


def start_boundaries(plan: BatchPlan) -> dict[TopicPartition, int]:
    """The offset each partition's interval starts at, as recorded for T0 (before any skip)."""
    starts = {r.tp: r.start for r in plan.ranges}
    for gap in plan.skipped:
        starts[TopicPartition(gap.topic, gap.partition)] = gap.start
    return starts


@dataclass(frozen=True)
class Recorded:
    """What the table records of one partition around an interval being committed: the offsets
    ``B(T0)`` / ``B(T1)`` a committed neighbour fixed (None: not recorded), and the nearest
    recorded boundary before T0 (``floor``) and after T1 (``ceiling``)."""

    start: int | None = None
    end: int | None = None
    floor: int | None = None
    ceiling: int | None = None


def fits(plan: BatchPlan, recorded: Mapping[TopicPartition, Recorded]) -> bool:
    """Whether the plan's boundaries agree with what the table records now: every boundary a
    neighbour committed since the plan was made is the plan's own, and the recorded boundaries
    around it still bound it (``B`` grows with time). Then the plan reads exactly the offsets it
    would read if it were planned now, and may commit on this table state under the next batch
    number (a rebase), whatever intervals landed meanwhile.

        >>> tp = TopicPartition("t", 0)
        >>> plan = BatchPlan("i", 3, (OffsetRange("t", 0, 10, 20),), RunIdentity("r"), interval=Interval(0, 10))
        >>> fits(plan, {tp: Recorded(end=20, floor=4)}), fits(plan, {tp: Recorded(start=12)})
        (True, False)
    """
    starts = start_boundaries(plan)
    for r in plan.ranges:
        f, start = recorded.get(r.tp) or Recorded(), starts[r.tp]
        if (f.start is not None and f.start != start) or (f.end is not None and f.end != r.end) or \
                (f.floor is not None and f.floor > start) or (f.ceiling is not None and f.ceiling < r.end):
            return False
    return True


def interval_state(plan: BatchPlan, committed: CommittedInterval | None, overlaps: bool = False,
                   recorded: Mapping[TopicPartition, Recorded] | None = None) -> CommitCheck:
    """Is the interval plan committable, committed, or overtaken? An interval is keyed by its
    time, not by the batch number it was planned with: ``committed`` is the interval starting at
    T0 the table holds (None: none), ``overlaps`` whether a committed interval overlaps it.

    ALREADY_COMMITTED: the table holds exactly this interval, committed by this run's batch (a
    retry, possibly under a rebased batch number) or by another run (the loser of a race of two
    runs of one interval reports the winner's batch); CONFLICT: an interval starting at T0 with
    another end, an overlapping one, or boundaries that no longer fit (:func:`fits`); READY:
    the interval is free and the plan fits, whether or not other intervals landed since.

        >>> plan = BatchPlan("i", 3, (), RunIdentity("r"), interval=Interval(0, 10))
        >>> interval_state(plan, None).value, interval_state(plan, CommittedInterval(5, Interval(0, 10))).value
        ('ready', 'already_committed')
        >>> interval_state(plan, CommittedInterval(5, Interval(0, 20))).value, interval_state(plan, None, True).value
        ('conflict', 'conflict')
    """
    if committed is not None:
        return CommitCheck.ALREADY_COMMITTED if committed.interval == plan.interval else CommitCheck.CONFLICT
    if overlaps or not fits(plan, recorded or {}):
        return CommitCheck.CONFLICT
    return CommitCheck.READY


def gaps(committed: list[CommittedInterval]) -> list[Interval]:
    """Spans between committed intervals that no interval covers (intervals never run)."""
    spans = sorted(c.interval for c in committed)
    return [Interval(a.end_ms, b.start_ms) for a, b in zip(spans, spans[1:]) if a.end_ms < b.start_ms]
