"""The planning core, without Kafka, Spark or Delta."""

import pytest

from airflow_eo.core.errors import ConfigError, DataLossError, OffsetsAheadError
from airflow_eo.core.planning import (
    BatchPlan, CommitCheck, StartingPosition, compare_offsets, fair_caps, plan_batch, split_range,
)
from airflow_eo.core.offsets import OffsetRange, PartitionBounds, RunIdentity, TopicPartition

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


def bounds(**ends):
    return {tp: PartitionBounds(tp, lo, hi) for tp, (lo, hi) in ends.items()}


def test_plan_reads_from_committed_to_end():
    plan = plan_batch(ingest_id="i", batch=3, committed={A: 10, B: 4},
                      bounds={A: PartitionBounds(A, 0, 25), B: PartitionBounds(B, 0, 4)}, new_starts={})
    assert plan.ranges == (OffsetRange("t", 0, 10, 25), OffsetRange("t", 1, 4, 4))
    assert plan.data_ranges == (OffsetRange("t", 0, 10, 25),)
    assert plan.batch == 3 and not plan.is_empty


def test_nothing_new_is_empty():
    plan = plan_batch(ingest_id="i", batch=2, committed={A: 5}, bounds={A: PartitionBounds(A, 0, 5)}, new_starts={})
    assert plan.is_empty


def test_new_partition_starts_at_resolved_start_and_is_not_empty_even_without_data():
    plan = plan_batch(ingest_id="i", batch=1, committed={}, bounds={A: PartitionBounds(A, 3, 3)}, new_starts={A: 3})
    assert plan.new_partitions == (A,)
    assert not plan.is_empty, "the start of a new partition must be committed, or 'latest' would drift"


def test_retention_loss_fails_by_default_naming_partition_and_offsets():
    with pytest.raises(DataLossError, match=r"t\[0\].*next offset is 2.*starts at 7.*on_data_loss='skip'"):
        plan_batch(ingest_id="i", batch=2, committed={A: 2}, bounds={A: PartitionBounds(A, 7, 9)}, new_starts={})


def test_retention_loss_skip_records_gap():
    plan = plan_batch(ingest_id="i", batch=2, committed={A: 2}, bounds={A: PartitionBounds(A, 7, 9)},
                      new_starts={}, on_data_loss="skip")
    assert plan.ranges == (OffsetRange("t", 0, 7, 9),)
    assert [(s.start, s.end, s.reason) for s in plan.skipped] == [(2, 7, "retention")]


def test_committed_beyond_end_is_refused():
    with pytest.raises(OffsetsAheadError, match=r"t\[0\].*committed offset 50.*end offset is 3"):
        plan_batch(ingest_id="i", batch=2, committed={A: 50}, bounds={A: PartitionBounds(A, 0, 3)}, new_starts={})


def test_committed_partition_missing_from_kafka_is_refused():
    with pytest.raises(OffsetsAheadError, match=r"t\[1\].*no longer exists"):
        plan_batch(ingest_id="i", batch=2, committed={A: 1, B: 4}, bounds={A: PartitionBounds(A, 0, 3)}, new_starts={})


def test_fair_caps_water_filling():
    assert fair_caps({A: 10, B: 500, C: 500}, 100) == {A: 10, B: 45, C: 45}
    assert fair_caps({A: 0, B: 7}, 100) == {A: 0, B: 7}
    assert fair_caps({A: 5, B: 5, C: 5}, 10) == {A: 4, B: 3, C: 3}
    assert sum(fair_caps({A: 1000, B: 1000, C: 3}, 1001).values()) == 1001


def test_fair_caps_rejects_non_positive_cap():
    with pytest.raises(ConfigError):
        fair_caps({A: 1}, 0)


def test_cap_applies_to_plan():
    plan = plan_batch(ingest_id="i", batch=1, committed={A: 0, B: 0},
                      bounds={A: PartitionBounds(A, 0, 1000), B: PartitionBounds(B, 0, 20)},
                      new_starts={}, max_records=100)
    assert plan.ends == {A: 80, B: 20}


def test_split_range_covers_without_overlap():
    pieces = split_range(OffsetRange("t", 0, 5, 27), 10)
    assert [(p.start, p.end) for p in pieces] == [(5, 15), (15, 25), (25, 27)]


@pytest.mark.parametrize("text,kind", [("earliest", "earliest"), ("latest", "latest"),
                                       ('{"timestamp": 1700000000000}', "timestamp"),
                                       ('{"t": {"0": 5, "1": -1}}', "offsets")])
def test_starting_position_parse(text, kind):
    assert StartingPosition.parse(text).kind == kind


def test_starting_position_explicit_defaults_to_earliest():
    pos = StartingPosition.parse({"t": {"0": 5}})
    assert pos.explicit_offset(A) == 5 and pos.explicit_offset(B) == -2


def test_starting_position_garbage_is_a_config_error():
    with pytest.raises(ConfigError, match="starting_offsets"):
        StartingPosition.parse("yesterday")


def test_compare_offsets_ready_already_conflict():
    plan = BatchPlan("i", 2, (OffsetRange("t", 0, 10, 20), OffsetRange("t", 1, 5, 5)), RunIdentity("r"))
    assert compare_offsets(plan, {A: 10, B: 5}) is CommitCheck.READY
    assert compare_offsets(plan, {A: 20, B: 5}) is CommitCheck.ALREADY_COMMITTED
    assert compare_offsets(plan, {A: 15, B: 5}) is CommitCheck.CONFLICT
    assert compare_offsets(plan, {A: 30, B: 5}) is CommitCheck.CONFLICT


def test_compare_offsets_new_partition_must_be_uncommitted():
    plan = BatchPlan("i", 1, (OffsetRange("t", 0, 0, 5),), RunIdentity("r"), new_partitions=(A,))
    assert compare_offsets(plan, {A: None}) is CommitCheck.READY
    assert compare_offsets(plan, {A: 0}) is CommitCheck.CONFLICT


def test_plan_json_round_trip():
    plan = plan_batch(ingest_id="i", batch=4, committed={A: 2}, bounds={A: PartitionBounds(A, 7, 9), C: PartitionBounds(C, 0, 3)},
                      new_starts={C: 1}, on_data_loss="skip", run=RunIdentity("k", "d", "r", "t", 2))
    assert BatchPlan.from_json(plan.with_attempt("abc").to_json()) == plan.with_attempt("abc")


def test_compare_offsets_skipped_gap_expects_gap_start():
    plan = plan_batch(ingest_id="i", batch=2, committed={A: 2}, bounds={A: PartitionBounds(A, 7, 9)},
                      new_starts={}, on_data_loss="skip")
    assert compare_offsets(plan, {A: 2}) is CommitCheck.READY
    assert compare_offsets(plan, {A: 9}) is CommitCheck.ALREADY_COMMITTED
    assert compare_offsets(plan, {A: 7}) is CommitCheck.CONFLICT


def test_batch_state_is_the_one_answer_to_is_it_committed():
    from airflow_eo.core.planning import batch_state

    plan = BatchPlan("i", 2, (OffsetRange("t", 0, 10, 20),), RunIdentity("r"))
    assert batch_state(plan, {A: 10}, last_batch=1) is CommitCheck.READY
    assert batch_state(plan, {A: 10}, last_batch=2) is CommitCheck.CONFLICT  # counter moved without offsets
    assert batch_state(plan, {A: 20}, last_batch=2) is CommitCheck.ALREADY_COMMITTED
    assert batch_state(plan, {A: 30}, last_batch=3) is CommitCheck.ALREADY_COMMITTED  # and a later batch
    assert batch_state(plan, {A: 15}, last_batch=2) is CommitCheck.CONFLICT
    # another plan took batch 2 (its recorded ranges differ): this one never landed
    other = (OffsetRange("t", 0, 10, 25),)
    assert batch_state(plan, {A: 25}, last_batch=2, recorded_ranges=other) is CommitCheck.CONFLICT
    assert batch_state(plan, {A: 20}, last_batch=2, recorded_ranges=plan.ranges) is CommitCheck.ALREADY_COMMITTED


def test_backlog_counts_from_the_committed_offset_or_where_a_new_partition_starts():
    from airflow_eo.core.planning import backlog

    bounds = {A: PartitionBounds(A, 5, 50), B: PartitionBounds(B, 0, 30)}
    assert backlog(bounds, {A: 40, B: None}) == {A: 10, B: 30}
    assert backlog(bounds, {A: 2, B: None}, {B: 30}) == {A: 45, B: 0}  # below log start: deleted, not waiting
