"""Errors raised by airflow-eo.

Every error names the cause and the fix in one message. None of them is raised after
a partial commit: when one of these surfaces, the table and its offsets are exactly as
they were before the run.

Each error says whether a retry can help (``retryable``): configuration, data loss, a
recreated topic and an incompatible table cannot be fixed by running again, so the
operator fails them without retry (``AirflowFailException``); an unreachable broker or
Spark server, a commit conflict or a failed Spark job can, so Airflow retries them.
Errors cross the Spark boundary as one line, ``<ErrorClass>: <message>``
(:func:`error_line` / :func:`error_from_line`), so the caller re-raises the same type.

    >>> error_from_line(error_line(DataLossError("offsets 0-9 of t[0] are gone"))).retryable
    False
"""

from __future__ import annotations

import re


class AirflowEoError(Exception):
    """Base class of every error airflow-eo raises on purpose."""

    retryable = False


class RetryableError(AirflowEoError):
    """An error that running again can fix (the operator lets Airflow retry it)."""

    retryable = True


class ConfigError(AirflowEoError):
    """A parameter, connection or starting position is malformed."""


class DataLossError(AirflowEoError):
    """Kafka no longer holds offsets the table has not read yet (retention deleted them)."""


class OffsetsAheadError(AirflowEoError):
    """The table has committed offsets beyond what Kafka holds (topic recreated or truncated)."""


class TopicRecreatedError(OffsetsAheadError):
    """A topic the table read was deleted and created again: its committed offsets are of the old topic."""


class CommitConflictError(RetryableError):
    """The table's committed offsets moved while this batch was running (a racing run)."""


class TableError(AirflowEoError):
    """The table path is not usable for this ingest (not Delta, other owner, bad schema)."""


class TableFeatureError(TableError):
    """The table uses a Delta feature airflow-eo cannot honour for this run (or the engine refused it)."""


class ConstraintViolationError(AirflowEoError):
    """A record breaks a constraint of the table (CHECK, invariant, NOT NULL, generated column)."""


class StagedFilesMissingError(RetryableError):
    """Files an attempt staged are gone before its commit (deleted by hand or by another run): nothing is committed."""


class KafkaUnavailableError(RetryableError):
    """The broker could not be reached or a topic does not exist."""


class ReadIncompleteError(RetryableError):
    """A Spark task could not read its whole planned range; nothing is committed."""


class DeadLetterThresholdError(AirflowEoError):
    """More records could not be decoded than the dead-letter threshold allows."""


class SchemaRegistryUnavailableError(RetryableError):
    """The Schema Registry could not be reached or answered with a server error."""


class IncompatibleSchemaError(AirflowEoError):
    """Records were written with a schema that cannot be read as the table's reader schema."""


class SparkJobError(RetryableError):
    """spark-submit ended without committing the batch."""


class MergeKeyError(AirflowEoError):
    """write_mode=merge: a record's merge key is null (the transform or the data must change)."""


class IntervalNotClosedError(RetryableError):
    """A partition may still receive records of the interval (retry later, or wait for it)."""


class SparkUnavailableError(RetryableError):
    """The Spark Connect server could not be reached, or went away mid-batch (retryable)."""


# An error raised in a Spark task reaches the driver wrapped (Py4JJavaError, PythonException)
# with the worker's traceback in its text; its last line names our error.
_TASK_ERROR = re.compile(r"airflow_eo\.core\.errors\.(\w+Error): ([^\n]*)")


def error_line(error: BaseException) -> str:
    """``<ErrorClass>: <first line>``: how an error travels from the Spark driver to its caller.

    An airflow-eo error raised inside a Spark task keeps its own type, not the wrapper's."""
    text = str(error)
    if not isinstance(error, AirflowEoError):
        found = _TASK_ERROR.findall(text)
        if found and isinstance(globals().get(found[-1][0]), type):
            return f"{found[-1][0]}: {found[-1][1].strip()}"
    first = (text.strip().splitlines() or [""])[0]
    return f"{error.__class__.__name__}: {first}"


def error_from_line(line: str) -> AirflowEoError | None:
    """The airflow-eo error a line from :func:`error_line` names, or None for any other error."""
    name, _, message = line.partition(": ")
    cls = globals().get(name)
    if isinstance(cls, type) and issubclass(cls, AirflowEoError):
        return cls(message)
    return None
