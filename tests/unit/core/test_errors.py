"""Errors keep their type across the Spark boundary (pure: no Spark needed to check the text)."""

from __future__ import annotations

import pytest

from airflow_eo.core.errors import (
    CommitConflictError, ConfigError, DataLossError, KafkaUnavailableError, OffsetsAheadError, ReadIncompleteError,
    SparkJobError, SparkUnavailableError, TableError, error_from_line, error_line,
)

WRAPPED = ("An error occurred while calling o412.parquet.\n: org.apache.spark.SparkException: Job aborted due to "
           "stage failure: Task 0 in stage 3.0 failed 1 times\nTraceback (most recent call last):\n"
           '  File "/x/airflow_eo/driver/reader.py", line 98, in read_range\n'
           "airflow_eo.core.errors.DataLossError: offsets 0..9 of orders[0] were deleted by retention: set on_data_loss\n"
           "\tat org.apache.spark.api.python.BasePythonRunner")


@pytest.mark.parametrize("error", [DataLossError("gone"), ConfigError("bad"), CommitConflictError("raced"),
                                   ReadIncompleteError("short")])
def test_each_error_round_trips_with_its_type_and_retry_class(error):
    back = error_from_line(error_line(error))
    assert type(back) is type(error) and str(back) == str(error) and back.retryable == error.retryable


def test_an_error_raised_in_a_spark_task_keeps_its_type_through_the_wrapper():
    line = error_line(RuntimeError(WRAPPED))
    assert line == "DataLossError: offsets 0..9 of orders[0] were deleted by retention: set on_data_loss"
    assert isinstance(error_from_line(line), DataLossError) and not error_from_line(line).retryable


def test_other_errors_are_one_line_and_not_ours():
    line = error_line(RuntimeError("java.lang.OutOfMemoryError: Java heap space\n\tat ..."))
    assert line == "RuntimeError: java.lang.OutOfMemoryError: Java heap space"
    assert error_from_line(line) is None
    assert error_from_line(error_line(SparkJobError("exit 1"))).retryable


@pytest.mark.parametrize("error, retryable", [
    (ConfigError, False), (DataLossError, False), (OffsetsAheadError, False), (TableError, False),
    (CommitConflictError, True), (KafkaUnavailableError, True), (SparkJobError, True), (SparkUnavailableError, True),
])
def test_each_error_says_whether_a_retry_can_help_and_survives_the_trip_as_one_line(error, retryable):
    back = error_from_line(error_line(error("cause of it\nsecond line")))
    assert type(back) is error and back.retryable is retryable and str(back) == "cause of it"
    assert error_from_line("ValueError: not ours") is None
