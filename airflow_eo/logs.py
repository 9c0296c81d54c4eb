"""Log lines about one of several tables name it.

A fan-out's tables go through the same steps one after another (plan, log the plan, stage, commit,
verify), and each step logs as it does for a single table ("batch 3: ..."). While a step works on
one table (:func:`about_table`), airflow-eo's log records start with that table's URI, so eight
routed tables do not print eight identical lines. Records of other libraries are left alone.

Example::

    >>> import logging
    >>> with about_table("/lake/orders"):
    ...     logging.getLogger("airflow_eo.example").makeRecord(
    ...         "airflow_eo.example", logging.INFO, __file__, 1, "batch %s committed", (3,), None).getMessage()
    '/lake/orders: batch 3 committed'
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_TABLE: ContextVar[str | None] = ContextVar("airflow_eo_table", default=None)
_installed: list[bool] = []


@contextmanager
def about_table(table_uri: str) -> Iterator[None]:
    """Within the block, airflow-eo's log records name ``table_uri`` first."""
    _install()
    token = _TABLE.set(table_uri.replace("%", "%%"))  # the record's message is %-formatted with its args
    try:
        yield
    finally:
        _TABLE.reset(token)


def _install() -> None:
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def naming_the_table(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        table = _TABLE.get()
        # a record made from another's fields (logging.makeLogRecord, as structlog's formatter does) starts nameless
        if table is not None and isinstance(record.name, str) and record.name.startswith("airflow_eo"):
            record.msg = f"{table}: {record.msg}"
        return record

    logging.setLogRecordFactory(naming_the_table)
    _installed.append(True)
