"""Polling in a trigger: each measurement taken off the event loop, transient failures retried with backoff.

A trigger measures something outside (Kafka's offsets, the table's ledger) until a condition
holds. :func:`poll_until` measures, asks the trigger's ``decide`` what a measurement means (the
event to fire, or how long to wait before the next one) and returns the event. A retryable
airflow-eo error (the broker away) is retried with exponential backoff up to ``max_failures``
in a row; a permanent one (another ingest's table, a bad config), or one failure too many, is
the event instead, ``{"status": "error", "error": "<ErrorClass>: ...", "retryable": ...}``,
which the operator turns back into the typed error (:func:`error_of_event`).

Example::

    >>> async def run(self):                                                    # doctest: +SKIP
    ...     yield await poll_until(self.measure, self.decide, poll_interval=30, max_failures=5, log=log, what="x")
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

from airflow.triggers.base import TriggerEvent

from airflow_eo.core.errors import AirflowEoError, error_from_line, error_line

MAX_BACKOFF_SECONDS = 300.0
T = TypeVar("T")


async def poll_until(measure: Callable[[], Awaitable[T]], decide: Callable[[T], TriggerEvent | float], *,
                     poll_interval: float, max_failures: int, log: Any, what: str) -> TriggerEvent:
    """Measure until ``decide`` returns the event to fire for a measurement (a number it returns
    instead: the seconds to wait before the next); an error that ends the wait is the event."""
    failures = 0
    while True:
        try:
            value = await measure()
        except AirflowEoError as exc:
            if not exc.retryable or failures >= max_failures:
                return TriggerEvent({"status": "error", "error": error_line(exc), "retryable": exc.retryable})
            failures += 1
            delay = min(poll_interval * 2 ** (failures - 1), MAX_BACKOFF_SECONDS)
            log.warning("%s not measured (%s); retry %d/%d in %.0fs", what, error_line(exc), failures,
                        max_failures, delay)
            await asyncio.sleep(delay)
            continue
        failures = 0
        decided = decide(value)
        if isinstance(decided, TriggerEvent):
            return decided
        await asyncio.sleep(max(0.0, decided))


def error_of_event(event: dict) -> AirflowEoError | None:
    """The typed error an error event carries (None: the event is not an error)."""
    if event.get("status") != "error":
        return None
    error = error_from_line(str(event.get("error", "")))
    if error is None:  # not one of ours by name: keep the line and whether a retry can help
        error = AirflowEoError(str(event.get("error", "")))
        error.retryable = bool(event.get("retryable"))
    return error
