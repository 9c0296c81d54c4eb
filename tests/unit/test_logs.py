"""Our log lines name their table: a record of airflow-eo's loggers made within ``about_table``."""

from __future__ import annotations

import logging

from airflow_eo.logs import about_table


def test_our_records_within_a_table_name_it_and_a_copy_of_a_record_is_made_as_it_was(caplog):
    caplog.set_level(logging.INFO)
    with about_table("/t/orders"):
        logging.getLogger("airflow_eo.loop").info("batch %s committed", 3)
        logging.getLogger("elsewhere").info("not ours")
        ours = caplog.records[0]
        # structlog's formatter (Airflow 3's task logs) copies a record: logging.makeLogRecord starts nameless
        copy = logging.makeLogRecord(ours.__dict__)
    assert [r.getMessage() for r in caplog.records] == ["/t/orders: batch 3 committed", "not ours"]
    assert copy.getMessage() == "/t/orders: batch 3 committed" and copy.name == "airflow_eo.loop"
