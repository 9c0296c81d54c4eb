"""How an airflow-eo error reaches Airflow: retried, or failed without spending a retry."""

from __future__ import annotations

from typing import NoReturn

from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_eo.core.errors import AirflowEoError, error_line


def raise_for_airflow(log, exc: AirflowEoError) -> NoReturn:
    """Log the error's one line and raise it: as is when a retry can help (an unreachable
    broker, registry or Spark server, a commit conflict), as ``AirflowFailException`` when a
    retry would fail the same way (configuration, data loss, a recreated topic, an
    incompatible table).

    >>> try:                                                            # doctest: +SKIP
    ...     run()
    ... except AirflowEoError as exc:
    ...     raise_for_airflow(self.log, exc)
    """
    log.error("airflow-eo: %s", error_line(exc))
    if exc.retryable:
        raise exc
    raise AirflowFailException(str(exc)) from exc
