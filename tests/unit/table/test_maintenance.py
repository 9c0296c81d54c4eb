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
