"""One attempt on Spark: record it, submit it, read a failure back typed, end it; then the verdict from the log.

Ingest and reprocess both run an attempt this way (:class:`AttemptRunner`) and decide what
it did the same way (:func:`verdict`): only the Delta log says whether a batch landed, since
a job may die after its commit or report success for another attempt's commit.

Example::

    >>> runner = AttemptRunner(StagingArea(location), submitter, config.secrets)    # doctest: +SKIP
    >>> error = runner.submit(attempt)                                               # doctest: +SKIP
    >>> verdict(attempt, Ledger.open(table_uri), error).status                       # doctest: +SKIP
    <RunStatus.COMMITTED: 'committed'>
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol, TypeGuard

from airflow_eo.attempt import Attempt, AttemptKind, Secrets
from airflow_eo.core.errors import AirflowEoError, SparkJobError, error_from_line
from airflow_eo.faults import failpoint
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.planning import CommitCheck
from airflow_eo.loop.result import short_cause
from airflow_eo.table.ledger import BatchRecord, Ledger
from airflow_eo.spec import DEFAULT_GRACE_SECONDS
from airflow_eo.table.staging import Heartbeat, StagingArea

log = logging.getLogger(__name__)


class Submitter(Protocol):
    """Starts the Spark job of one recorded attempt and waits for it."""

    def submit(self, attempt: Attempt, secrets: Secrets) -> None: ...


class AttemptRunner:
    """Runs recorded attempts on Spark through a :class:`Submitter`."""

    def __init__(self, staging: StagingArea, submitter: Submitter, secrets: Callable[[], Secrets],
                 grace_seconds: float = DEFAULT_GRACE_SECONDS):
        self.staging, self.submitter, self.secrets = staging, submitter, secrets
        self.grace_seconds = grace_seconds

    def submit(self, attempt: Attempt, also: tuple[tuple[StagingArea, str], ...] = ()) -> BaseException | None:
        """Record the attempt, run its Spark job, mark it ended; return the job's error if any.
        While the job runs, the attempt's heartbeat is renewed (and those of ``also``: a fan-out's
        other tables' attempts), so no other host's run collects its staged files.

        The error is returned, not raised: the job may have committed before it died, and
        only the Delta log can say (:func:`verdict`).
        """
        self.staging.begin_attempt(attempt)
        failpoint("before_submit")
        started = time.monotonic()
        try:
            with Heartbeat(((self.staging, attempt.attempt_id), *also), self.grace_seconds):
                self.submitter.submit(attempt, self.secrets())
        except BaseException as exc:
            return self.typed_failure(attempt, exc)
        finally:
            self.staging.end_attempt(attempt.attempt_id)
            log.info("spark job for batch %s ended after %.1fs", attempt.plan.batch, time.monotonic() - started)
        return None

    def typed_failure(self, attempt: Attempt, error: BaseException) -> BaseException:
        """The driver's own error for a job that failed, read from its attempt marker when the
        submitter only saw an exit code; one line, never a command line."""
        if _as_raised(error):
            return error
        return failure_of(error, recorded_error(self.staging, attempt.attempt_id))


def names_its_cause(error: BaseException | None) -> TypeGuard[AirflowEoError]:
    """Whether ``error`` is one of ours that says its cause (any but the catch-all of a failed job)."""
    return isinstance(error, AirflowEoError) and not isinstance(error, SparkJobError)


def _as_raised(error: BaseException) -> bool:
    """An interrupt, or an error that says its cause: reported as it was raised."""
    return not isinstance(error, Exception) or names_its_cause(error)


def recorded_error(staging: StagingArea, attempt_id: str) -> BaseException | None:
    """The error the driver recorded in the attempt's marker, when it recorded one."""
    marker = staging.read_marker(attempt_id)
    if marker is None or not marker.error:
        return None
    return error_from_line(marker.error) or SparkJobError(f"the Spark job failed: {marker.error}")


def failure_of(error: BaseException, recorded: BaseException | None) -> BaseException:
    """What a failed job reports, given the error its driver ``recorded`` (None: it recorded none)."""
    if _as_raised(error):
        return error
    if recorded is not None:
        typed = recorded
    elif isinstance(error, SparkJobError):
        return error
    else:  # the driver never got to say (it did not start, or was killed)
        typed = SparkJobError(f"the Spark job failed before reporting an error: {short_cause(error)}")
    typed.__cause__ = error
    return typed


@dataclass(frozen=True)
class Verdict:
    """What an attempt did, read from the log: its status and the commit holding its batch."""

    status: RunStatus
    record: BatchRecord | None  # None only when the log no longer holds the commit's details


# per kind: (this attempt landed it, another attempt had), and what "not landed" leaves unchanged
_STATUSES = {AttemptKind.INGEST: (RunStatus.COMMITTED, RunStatus.ALREADY_COMMITTED),
             AttemptKind.REPROCESS: (RunStatus.REPROCESSED, RunStatus.ALREADY_REPROCESSED)}


def landed(attempt: Attempt, ledger: Ledger) -> bool:
    """Whether ``attempt``'s commit (or an earlier attempt's of the same request) is in ``ledger``."""
    plan = attempt.plan
    if attempt.kind is AttemptKind.REPROCESS:  # the batch's reprocess counter moved on from the request's
        return ledger.reprocess_count(plan.ingest_id, plan.batch) == (attempt.reprocess_from or 0) + 1
    return ledger.state_of(plan) is CommitCheck.ALREADY_COMMITTED


def verdict(attempt: Attempt, ledger: Ledger, error: BaseException | None) -> Verdict:
    """Verify an attempt in the log (the one verification of ingest and reprocess alike).

    Raises the job's typed error, or a :class:`SparkJobError`, when its batch did not land."""
    plan = attempt.plan
    if landed(attempt, ledger):
        # the newest commit of the batch, under the number it was committed with (an interval may be rebased)
        record = ledger.find_batch(plan.ingest_id, batch=ledger.committed_plan(plan).batch)
        mine, theirs = _STATUSES[attempt.kind]
        if record is None or record.meta.attempt_id == plan.attempt_id:
            if error is not None:
                log.warning("the Spark job failed (%s) after its commit landed: batch %s is %s", error, plan.batch,
                            mine.value)
            return Verdict(mine, record)
        return Verdict(theirs, record)
    if names_its_cause(error):
        raise error
    cause = short_cause(error) if error else "no commit found"
    if attempt.kind is AttemptKind.REPROCESS:
        raise SparkJobError(
            f"the reprocess of batch {plan.batch} ended without committing ({cause}); "
            "the batch's rows are unchanged. Retry the task: it replays the same request"
        ) from error
    raise SparkJobError(
        f"the Spark job for batch {plan.batch} of {plan.ingest_id} ended without committing ({cause}); the "
        "table and its offsets are unchanged. Retry the task: it replays the same offsets"
    ) from error
