"""Progress lines of a running batch from Spark's status tracker (the shared local session)."""

from __future__ import annotations

import logging
import time

from airflow_eo.driver.progress import Progress
from airflow_eo.driver.session import for_session


def slow_tasks(spark, tasks: int, seconds: float) -> int:
    def sleepy(batches):
        for batch in batches:
            time.sleep(seconds)
            yield batch

    with for_session(spark):  # a Connect test earlier in this process must not turn the UDF into Connect's
        return spark.range(0, tasks, 1, tasks).mapInPandas(sleepy, "id long").count()


def test_a_long_batch_logs_tasks_done_and_an_offset_rate(spark, caplog):
    caplog.set_level(logging.INFO, logger="airflow_eo.driver.progress")
    with Progress(spark, batch=7, planned_offsets=4000, interval=0.2):
        assert slow_tasks(spark, 4, 2.0) == 4
    lines = [r.getMessage() for r in caplog.records if r.name == "airflow_eo.driver.progress"]
    assert lines, "no progress line during a 4 s job with a 0.2 s interval"
    assert all(line.startswith("batch 7: ") and " Spark tasks done, ~" in line and " of 4000 offsets, ~" in line
               and "offsets/s after" in line for line in lines), lines
    assert any(" of 4 Spark tasks done" in line for line in lines), lines  # the stage of the 4 slow tasks


def test_a_short_batch_logs_nothing_and_the_thread_ends(spark, caplog):
    caplog.set_level(logging.INFO, logger="airflow_eo.driver.progress")
    with Progress(spark, batch=8, planned_offsets=10) as progress:
        assert spark.range(3).count() == 3
    assert progress._thread is not None and not progress._thread.is_alive()
    assert not [r for r in caplog.records if r.name == "airflow_eo.driver.progress"]
