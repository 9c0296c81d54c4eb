"""Polling in a trigger: each measurement taken off the event loop, transient failures retried with backoff.

A trigger measures something outside (Kafka's offsets, the table's ledger) until a condition
holds. :func:`measurements` yields each successful measurement; a retryable airflow-eo error
(the broker away) is retried with exponential backoff up to ``max_failures`` in a row, and a
permanent one (another ingest's table, a bad config), or one failure too many, ends the
stream with an error event, ``{"status": "error", "error": "<ErrorClass>: ...", "retryable": ...}``,
which the operator turns back into the typed error (:func:`error_of_event`).

Example::

    >>> async def poll():                                                       # doctest: +SKIP
    ...     async for found in measurements(measure, poll_interval=30, max_failures=5, log=log, what="x"):
    ...         if isinstance(found, TriggerEvent):
    ...             yield found  # the error event
    ...             return
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable

from airflow.triggers.base import TriggerEvent

from airflow_eo.errors import AirflowEoError, error_from_line, error_line

MAX_BACKOFF_SECONDS = 300.0


async def measurements(measure: Callable[[], Awaitable[Any]], *, poll_interval: float, max_failures: int,
                       log: Any, what: str) -> AsyncIterator[Any]:
    """Each value ``measure()`` returns, as often as the caller asks for the next (it sleeps
    between asks); an error :class:`TriggerEvent` ends the stream."""
    failures = 0
    while True:
        try:
            value = await measure()
        except AirflowEoError as exc:
            if not exc.retryable or failures >= max_failures:
                yield TriggerEvent({"status": "error", "error": error_line(exc), "retryable": exc.retryable})
                return
            failures += 1
            delay = min(poll_interval * 2 ** (failures - 1), MAX_BACKOFF_SECONDS)
            log.warning("%s not measured (%s); retry %d/%d in %.0fs", what, error_line(exc), failures,
                        max_failures, delay)
            await asyncio.sleep(delay)
            continue
        failures = 0
        yield value


def error_of_event(event: dict) -> AirflowEoError | None:
    """The typed error an error event carries (None: the event is not an error)."""
    if event.get("status") != "error":
        return None
    error = error_from_line(str(event.get("error", "")))
    if error is None:  # not one of ours by name: keep the line and whether a retry can help
        error = AirflowEoError(str(event.get("error", "")))
        error.retryable = bool(event.get("retryable"))
    return error
