"""How a batch's ranges become Spark tasks (no Spark): small slices share a task, none is too big."""

from __future__ import annotations

import pytest

from airflow_eo.driver.source import read_tasks
from airflow_eo.core.offsets import OffsetRange


def test_a_small_batch_is_one_task_reading_every_partition():
    ranges = [OffsetRange("t", p, 100, 350) for p in range(4)]
    assert read_tasks(ranges, 1_000_000) == [tuple(ranges)]


def test_large_ranges_keep_a_task_each():
    ranges = [OffsetRange("t", p, 0, 250_000) for p in range(4)]
    assert read_tasks(ranges, 1_000_000) == [(r,) for r in ranges]


@pytest.mark.parametrize("max_per_task", [1, 7, 100, 20_000, 150_000, 1_000_000])
def test_every_offset_is_read_once_and_no_task_exceeds_the_maximum(max_per_task):
    ranges = [OffsetRange("a", 0, 0, 123_457), OffsetRange("a", 1, 40, 41), OffsetRange("b", 0, 7, 250_007)]
    if max_per_task == 1:
        ranges = [OffsetRange("a", p, 0, 3) for p in range(3)]
    tasks = read_tasks(ranges, max_per_task, min_offsets_per_task=100_000)
    assert all(sum(r.size for r in task) <= max_per_task or len(task) == 1 for task in tasks)
    assert all(r.size <= max_per_task for task in tasks for r in task)
    assert all(len({(r.topic, r.partition) for r in task}) == len(task) for task in tasks)  # one range per partition
    for r in ranges:  # the pieces of each range tile it, in order
        pieces = [s for task in tasks for s in task if (s.topic, s.partition) == (r.topic, r.partition)]
        assert [p.start for p in pieces] == [r.start] + [p.end for p in pieces[:-1]] and pieces[-1].end == r.end
