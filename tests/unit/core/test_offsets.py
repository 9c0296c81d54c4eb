"""Kafka positions as values, and the plan's JSON: what a plan log holds, read back by every version."""

from __future__ import annotations

import json

from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import Interval, OffsetRange, RunIdentity, SkippedRange, TopicPartition

PLAN = BatchPlan("orders_raw", 4, (OffsetRange("orders", 0, 10, 25), OffsetRange("orders", 1, 7, 7)),
                 RunIdentity("dag/run/ingest/-1", dag_id="dag", run_id="run", task_id="ingest", try_number=2),
                 new_partitions=(TopicPartition("orders", 1),),
                 skipped=(SkippedRange("orders", 0, 2, 10, "retention"),),
                 planned_at="2026-11-24T00:00:00+00:00", attempt_id="3f2a9c0d1e6b4a52")


def test_ranges_are_half_open_and_ordered_by_topic_partition_then_offsets():
    r = OffsetRange("orders", 0, 10, 25)
    assert (r.size, r.tp, str(r)) == (15, TopicPartition("orders", 0), "orders[0] 10..25")
    assert sorted([OffsetRange("b", 0, 0, 1), OffsetRange("a", 1, 5, 6), OffsetRange("a", 1, 0, 9)]) == [
        OffsetRange("a", 1, 0, 9), OffsetRange("a", 1, 5, 6), OffsetRange("b", 0, 0, 1)]
    assert str(TopicPartition("orders", 3)) == "orders[3]"


def test_an_interval_prints_as_utc_times():
    assert str(Interval(1_772_582_400_000, 1_772_586_000_000)) == "[2026-03-04T00:00:00Z, 2026-03-04T01:00:00Z)"
    assert Interval(0, 1) < Interval(0, 2) < Interval(1, 2)


def test_a_plan_round_trips_through_json_with_every_field():
    assert BatchPlan.from_json(PLAN.to_json()) == PLAN
    interval = BatchPlan("i", 1, (), RunIdentity("r"), interval=Interval(0, 3_600_000),
                         closed_idle=(TopicPartition("orders", 2),), attempt_id="a")
    assert BatchPlan.from_json(interval.to_json()) == interval
    assert json.loads(PLAN.to_json())["ranges"][0] == {"topic": "orders", "partition": 0, "start": 10, "end": 25}


def test_a_plan_logged_by_an_older_version_reads_with_defaults():
    old = {"ingest_id": "orders_raw", "batch": 4, "ranges": [{"topic": "orders", "partition": 0, "start": 0, "end": 5}],
           "run": {"run_key": "r", "dag_id": None, "run_id": None, "task_id": None, "try_number": None},
           "new_partitions": [], "skipped": []}
    plan = BatchPlan.from_json(json.dumps(old))
    assert (plan.planned_at, plan.attempt_id, plan.interval, plan.closed_idle) == ("", "", None, ())
    assert plan.data_ranges == (OffsetRange("orders", 0, 0, 5),)


def test_what_a_plan_expects_to_find_committed_and_leaves_committed():
    a, b = TopicPartition("orders", 0), TopicPartition("orders", 1)
    assert PLAN.starts == {a: 10, b: 7} and PLAN.ends == {a: 25, b: 7}
    # the table is where the skipped gap starts; a new partition has no committed offset yet
    assert PLAN.expected_committed == {a: 2, b: None}
    assert PLAN.data_ranges == (OffsetRange("orders", 0, 10, 25),) and not PLAN.is_empty
