"""When maintenance is due, read from a table's layout (a table written with deltalake, no Spark)."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake
from deltalake.transaction import PostCommitHookProperties

from airflow_eo.table.ledger import Ledger
from airflow_eo.table.maintenance import MaintenancePlan, layout, maintain


def test_layout_says_when_maintenance_is_due(tmp_path):
    uri = str(tmp_path / "t")
    no_checkpoints = PostCommitHookProperties(create_checkpoint=False)  # a writer that never checkpoints
    for i in range(102):  # more files than SMALL_FILES_DUE, more commits than the checkpoint interval (100)
        write_deltalake(uri, pa.table({"a": [i]}), mode="append", post_commithook_properties=no_checkpoints)
    due = layout(Ledger.open(uri)).due
    assert [d.split(":")[0] for d in due] == ["compaction", "checkpoint"], due
    maintain(uri, plan=MaintenancePlan(retain_hours=0))
    assert layout(Ledger.open(uri)).due == []


def test_maintenance_queues_behind_the_run_holding_the_tables_lease(tmp_path, caplog):
    import logging
    import threading
    import time

    from airflow_eo.table.lease import Claim, LeasePurpose, TableLease
    from airflow_eo.table.storage import TableLocation

    uri = str(tmp_path / "t")
    for i in range(3):
        write_deltalake(uri, pa.table({"a": [i]}), mode="append")
    lease = TableLease(TableLocation.of(uri))
    held = lease.try_take(Claim(LeasePurpose.INGEST, "dag/run/ingest/-1", "orders"))
    threading.Timer(1.5, held.release).start()  # the run's batch is committed and verified
    caplog.set_level(logging.INFO, logger="airflow_eo")
    started = time.monotonic()
    done = maintain(uri, plan=MaintenancePlan(vacuum=False, cleanup_log=False), run_key="dag/maintain/t/-1")
    assert time.monotonic() - started >= 1.4 and done["compaction"]["numFilesRemoved"] == 3
    assert any("held by ingest run dag/run/ingest/-1" in r.getMessage() for r in caplog.records)
    _, last = lease.newest()  # maintenance held it after the run, and gave it back
    assert (last.purpose, last.run_key, last.released_at is not None) == (LeasePurpose.MAINTAIN, "dag/maintain/t/-1",
                                                                          True)
    # bounded: a holder that never lets go delays maintenance by table_wait_timeout, no more
    stuck = lease.try_take(Claim(LeasePurpose.INGEST, "dag/stuck/ingest/-1", "orders"))
    try:
        started = time.monotonic()
        maintain(uri, plan=MaintenancePlan(compact=False, vacuum=False, cleanup_log=False, table_wait_timeout=0.5))
        assert time.monotonic() - started < 5
    finally:
        stuck.release()
