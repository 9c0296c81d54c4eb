"""The interval core (airflow_eo.core.intervals): parsing, boundaries, closing, tiling — pure, no I/O."""

from __future__ import annotations

import random

import pytest

from airflow_eo.core.errors import ConfigError, DataLossError, IntervalNotClosedError
from airflow_eo.core.intervals import (
    CommittedInterval, PartitionFacts, Recorded, fits, gaps, interval_of, interval_state, neighbour_times, overlapping,
    parse_duration, parse_time, plan_interval,
)
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.core.offsets import Interval, OffsetRange, PartitionBounds, RunIdentity, SkippedRange, TopicPartition

TP = TopicPartition("t", 0)
H = 3_600_000


def test_parse_time_accepts_zoned_iso_and_epoch_ms():
    assert parse_time("2026-03-04T00:00:00Z") == 1772582400000
    assert parse_time("2026-03-04T02:00:00+02:00") == 1772582400000
    assert parse_time("1772582400000") == parse_time(1772582400000) == 1772582400000


@pytest.mark.parametrize("value", ["2026-03-04T00:00:00", "yesterday", "2026-13-01T00:00Z"])
def test_parse_time_refuses_naive_or_malformed_in_one_line(value):
    with pytest.raises(ConfigError) as err:
        parse_time(value)
    assert "\n" not in str(err.value) and repr(value) in str(err.value)


def test_interval_end_must_follow_start():
    with pytest.raises(ConfigError, match="not after its start"):
        interval_of("2026-03-04T01:00:00Z", "2026-03-04T01:00:00Z")
    with pytest.raises(ConfigError, match="not after its start"):
        interval_of(2000, 1000)
    assert interval_of(0, 10) == Interval(0, 10)


def test_parse_duration():
    assert parse_duration("15m") == 900 and parse_duration("2h") == 7200 and parse_duration(None) == 900
    assert parse_duration("0") == 0 and parse_duration("500ms") == 0.5
    with pytest.raises(ConfigError):
        parse_duration("soon")


def first_at_or_after(timestamps: list[int], t: int) -> int:
    """Kafka's ListOffsets by timestamp over a log: the first offset whose timestamp >= t, -1 if none."""
    return next((o for o, ts in enumerate(timestamps) if ts >= t), -1)


def facts_for(timestamps, interval, recorded=None, now_end=None, floor=None, ceiling=None):
    recorded = recorded or {}
    end = len(timestamps) if now_end is None else now_end
    visible = timestamps[:end]
    return {TP: PartitionFacts(PartitionBounds(TP, 0, end), recorded_start=recorded.get(interval.start_ms),
                               recorded_end=recorded.get(interval.end_ms),
                               found_start=first_at_or_after(visible, interval.start_ms),
                               found_end=first_at_or_after(visible, interval.end_ms), floor=floor, ceiling=ceiling)}


def plan_in_order(timestamps: list[int], intervals: list[Interval], order: list[int]) -> dict[Interval, tuple[int, int]]:
    """Plan the intervals in ``order`` against one log, recording boundaries as commits would."""
    recorded: dict[int, int] = {}
    committed: list[CommittedInterval] = []
    owned = {}
    for batch, i in enumerate(order, start=1):
        iv = intervals[i]
        before, after = neighbour_times(iv, committed)
        facts = facts_for(timestamps, iv, recorded, floor=recorded.get(before), ceiling=recorded.get(after))
        plan = plan_interval(ingest_id="i", batch=batch, interval=iv, facts=facts, now_ms=10**15, close_after_ms=0)
        r = plan.ranges[0]
        recorded[iv.start_ms], recorded[iv.end_ms] = r.start, r.end
        committed.append(CommittedInterval(batch, iv))
        owned[iv] = (r.start, r.end)
    return owned


def test_intervals_tile_the_log_in_any_order_with_out_of_order_timestamps():
    rng = random.Random(7)
    # six hourly intervals; timestamps mostly rising, some out of order, some late by hours
    timestamps = sorted(rng.randrange(0, 6 * H) for _ in range(300))
    for i in rng.sample(range(300), 40):
        timestamps[i] = max(0, timestamps[i] - rng.randrange(0, 2 * H))
    timestamps.append(7 * H)  # a record after the last interval closes them all
    intervals = [Interval(k * H, (k + 1) * H) for k in range(6)]
    orders = [list(range(6)), list(range(5, -1, -1))] + [rng.sample(range(6), 6) for _ in range(5)]
    results = [plan_in_order(timestamps, intervals, order) for order in orders]
    assert all(r == results[0] for r in results)  # same table whatever the order
    spans = [results[0][iv] for iv in intervals]
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous: no gap, no overlap
    assert spans[-1][1] == first_at_or_after(timestamps, 6 * H)
    for iv, (start, end) in results[0].items():  # every record is in the interval its offset falls in
        assert all(timestamps[o] < iv.end_ms for o in range(start, end))


def test_a_recorded_boundary_wins_over_kafka():
    iv = Interval(H, 2 * H)
    timestamps = [0, H, H + 5, 2 * H]
    facts = facts_for(timestamps, iv, recorded={H: 0})  # the neighbour closed idle at offset 0
    plan = plan_interval(ingest_id="i", batch=2, interval=iv, facts=facts, now_ms=3 * H, close_after_ms=0)
    assert (plan.ranges[0].start, plan.ranges[0].end) == (0, 3)


def test_a_fresh_boundary_is_clamped_by_committed_neighbours():
    iv = Interval(0, H)
    timestamps = [0, 5, H - 1, H + 1]
    facts = facts_for(timestamps, iv, ceiling=2)  # a later interval already owns offsets from 2
    plan = plan_interval(ingest_id="i", batch=2, interval=iv, facts=facts, now_ms=0, close_after_ms=10**9)
    assert (plan.ranges[0].start, plan.ranges[0].end) == (0, 2)


def test_open_interval_is_retryable_and_names_the_partition():
    iv = Interval(0, H)
    facts = facts_for([0, 5, 10], iv)
    facts[TP] = PartitionFacts(**{**facts[TP].__dict__, "newest_ms": 10})
    with pytest.raises(IntervalNotClosedError) as err:
        plan_interval(ingest_id="i", batch=1, interval=iv, facts=facts, now_ms=H + 1, close_after_ms=H)
    assert err.value.retryable and "t[0]" in str(err.value) and "1970-01-01T00:00:00.010000Z" in str(err.value)


def test_idle_partition_closes_at_its_end_after_the_grace():
    iv = Interval(0, H)
    plan = plan_interval(ingest_id="i", batch=1, interval=iv, facts=facts_for([0, 5, 10], iv), now_ms=2 * H,
                         close_after_ms=H)
    assert (plan.ranges[0].start, plan.ranges[0].end) == (0, 3) and plan.closed_idle == (TP,)


def test_records_deleted_by_retention_fail_or_are_skipped():
    iv = Interval(H, 2 * H)
    facts = {TP: PartitionFacts(PartitionBounds(TP, 5, 10), recorded_start=2, found_end=8)}
    with pytest.raises(DataLossError):
        plan_interval(ingest_id="i", batch=2, interval=iv, facts=facts, now_ms=3 * H, close_after_ms=0)
    plan = plan_interval(ingest_id="i", batch=2, interval=iv, facts=facts, now_ms=3 * H, close_after_ms=0,
                         on_data_loss="skip")
    assert (plan.ranges[0].start, plan.ranges[0].end) == (5, 8) and plan.skipped[0].start == 2


def test_state_is_keyed_by_the_interval_not_the_batch_number():
    plan = BatchPlan("i", 3, (OffsetRange("t", 0, 10, 20),), RunIdentity("r"), interval=Interval(H, 2 * H))
    assert interval_state(plan, None) is CommitCheck.READY
    # committed: by this run's batch, under its planned or a rebased number, or by another run (the race loser)
    assert interval_state(plan, CommittedInterval(3, Interval(H, 2 * H))) is CommitCheck.ALREADY_COMMITTED
    assert interval_state(plan, CommittedInterval(7, Interval(H, 2 * H))) is CommitCheck.ALREADY_COMMITTED
    assert interval_state(plan, CommittedInterval(3, Interval(H, 3 * H))) is CommitCheck.CONFLICT  # another end
    assert interval_state(plan, None, overlaps=True) is CommitCheck.CONFLICT
    # other intervals landed since planning: it still commits (rebased) while the table agrees with its boundaries
    assert interval_state(plan, None, False, {TP: Recorded(end=20, ceiling=25, floor=10)}) is CommitCheck.READY
    assert interval_state(plan, None, False, {TP: Recorded(start=11)}) is CommitCheck.CONFLICT
    assert interval_state(plan, None, False, {TP: Recorded(end=21)}) is CommitCheck.CONFLICT
    assert interval_state(plan, None, False, {TP: Recorded(floor=12)}) is CommitCheck.CONFLICT
    assert interval_state(plan, None, False, {TP: Recorded(ceiling=19)}) is CommitCheck.CONFLICT


def test_a_skipped_start_is_compared_as_the_boundary_it_recorded():
    skipped = BatchPlan("i", 3, (OffsetRange("t", 0, 10, 20),), RunIdentity("r"), interval=Interval(H, 2 * H),
                        skipped=(SkippedRange("t", 0, 4, 10, "retention"),))
    assert fits(skipped, {TP: Recorded(start=4)}) and not fits(skipped, {TP: Recorded(start=10)})


def test_overlap_and_gaps():
    committed = [CommittedInterval(1, Interval(0, H)), CommittedInterval(2, Interval(3 * H, 4 * H))]
    assert overlapping(Interval(0, H), committed) is None
    assert overlapping(Interval(0, 2 * H), committed) == committed[0]
    assert neighbour_times(Interval(H, 2 * H), committed) == (H, 3 * H)
    assert gaps(committed) == [Interval(H, 3 * H)]


def test_plan_round_trips_through_json_with_its_interval():
    plan = plan_interval(ingest_id="i", batch=1, interval=Interval(0, H), facts=facts_for([0, H], Interval(0, H)),
                         now_ms=0, close_after_ms=0)
    assert BatchPlan.from_json(plan.to_json()) == plan
