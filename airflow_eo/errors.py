"""Errors raised by airflow-eo.

Every error names the cause and the fix in one message. None of them is raised after
a partial commit: when one of these surfaces, the table and its offsets are exactly as
they were before the run.
"""

from __future__ import annotations


class AirflowEoError(Exception):
    """Base class of every error airflow-eo raises on purpose."""


class ConfigError(AirflowEoError):
    """A parameter, connection or starting position is malformed."""


class DataLossError(AirflowEoError):
    """Kafka no longer holds offsets the table has not read yet (retention deleted them)."""


class OffsetsAheadError(AirflowEoError):
    """The table has committed offsets beyond what Kafka holds (topic recreated or truncated)."""


class CommitConflictError(AirflowEoError):
    """The table's committed offsets moved while this batch was running (a racing run)."""


class TableError(AirflowEoError):
    """The table path is not usable for this ingest (not Delta, other owner, bad schema)."""


class KafkaUnavailableError(AirflowEoError):
    """The broker could not be reached or a topic does not exist."""


class ReadIncompleteError(AirflowEoError):
    """A Spark task could not read its whole planned range; nothing is committed."""


class DeadLetterThresholdError(AirflowEoError):
    """More records could not be decoded than the dead-letter threshold allows."""


class SparkJobError(AirflowEoError):
    """spark-submit ended without committing the batch."""


class SparkUnavailableError(AirflowEoError):
    """The Spark Connect server could not be reached, or went away mid-batch (retryable)."""
