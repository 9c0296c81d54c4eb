"""The Spark job's entry point, up to where it would start Spark: its flags and their errors."""

from __future__ import annotations

import pytest

from airflow_eo.driver import main as driver_main


def test_without_an_attempt_or_a_standalone_ingest_the_job_stops_before_spark(capsys, monkeypatch):
    monkeypatch.setattr(driver_main, "build_session", lambda *a, **k: pytest.fail("Spark was started"))
    with pytest.raises(SystemExit) as stop:
        driver_main.main(["--table-uri", "/data/orders"])
    assert stop.value.code == 2
    assert "give --attempt-id, or --ingest-id and --topics for a standalone run" in capsys.readouterr().err


def test_the_table_is_required(capsys):
    with pytest.raises(SystemExit) as stop:
        driver_main.main(["--attempt-id", "3f2a9c0d1e6b4a52"])
    assert stop.value.code == 2 and "--table-uri" in capsys.readouterr().err
