"""DeltaMaintenanceOperator: compaction, vacuum, checkpoint and log cleanup of an airflow-eo
table (and its dead-letter table), keeping its offsets and its batches' reprocess.

Thin, like the ingest operator: it builds a :class:`~airflow_eo.table.maintenance.MaintenancePlan`
from its (templated) arguments and runs :func:`~airflow_eo.table.maintenance.maintain` with
the same storage connection the ingest uses. Safe beside running ingests (see that
function); the summary (files compacted and deleted, checkpoint version, layout after) is the
XCom, with no credentials in it.

Example::

    DeltaMaintenanceOperator(
        task_id="maintain", table_uri="/data/orders", dead_letter_table_uri="/data/orders_dlq",
        retain_hours=168, z_order=["partition", "offset"],
    )
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.common.compat.sdk import BaseOperator

from airflow_eo.core.errors import AirflowEoError
from airflow_eo.hooks.storage import storage_options_of
from airflow_eo.operators.failures import raise_for_airflow
from airflow_eo.operators.task_end import released_at_end
from airflow_eo.operators.kafka_to_delta import run_key_of
from airflow_eo.spec import DEFAULT_TABLE_WAIT_SECONDS
from airflow_eo.table.maintenance import DEFAULT_KEEP_DAYS, DEFAULT_RETAIN_HOURS, MaintenancePlan, maintain


class DeltaMaintenanceOperator(BaseOperator):
    """Maintain a Delta table written by :class:`~airflow_eo.operators.kafka_to_delta.KafkaToDeltaOperator`.

    :param table_uri: the table (local path or ``s3://…``), templated.
    :param dead_letter_table_uri: its dead-letter table, maintained the same way (optional).
    :param compact: bin-pack small files; ``z_order`` (columns) compacts with Z-ordering instead.
    :param target_file_bytes: size of compacted files (deltalake's default, 100 MB, when None).
    :param vacuum: delete files that commits removed more than ``retain_hours`` ago (never a
        staged file of a running attempt: no commit names it).
    :param checkpoint: write a checkpoint of the log; ``cleanup_log``: delete expired log files
        a checkpoint covers (``delta.logRetentionDuration``).
    :param prune: delete staged files of attempts that ended without committing, and plan logs
        and attempt records older than ``keep_days`` (default 30) that nothing needs.
    :param storage_conn_id: the ``aws`` connection of the ingest, for object storage;
        ``storage_options`` override it.
    :param table_wait_timeout: seconds to wait for the table's lease while a run of the table holds it
        (maintenance queues behind a running batch; then it goes on: every action is safe beside one).
    """

    template_fields: Sequence[str] = ("table_uri", "dead_letter_table_uri", "z_order", "retain_hours",
                                      "target_file_bytes", "keep_days")
    ui_color = "#c6e6f5"

    def __init__(self, *, table_uri: str, dead_letter_table_uri: str | None = None, compact: bool = True,
                 z_order: Sequence[str] = (), target_file_bytes: int | None = None, vacuum: bool = True,
                 retain_hours: int = DEFAULT_RETAIN_HOURS, checkpoint: bool = True, cleanup_log: bool = True,
                 prune: bool = True, keep_days: float = DEFAULT_KEEP_DAYS, storage_conn_id: str | None = None,
                 storage_options: dict[str, str] | None = None,
                 table_wait_timeout: float = DEFAULT_TABLE_WAIT_SECONDS, **kwargs: Any):
        super().__init__(**kwargs)
        self.table_uri, self.dead_letter_table_uri = table_uri, dead_letter_table_uri
        self.compact, self.z_order, self.target_file_bytes = compact, z_order, target_file_bytes
        self.vacuum, self.retain_hours = vacuum, retain_hours
        self.checkpoint, self.cleanup_log, self.prune, self.keep_days = checkpoint, cleanup_log, prune, keep_days
        self.storage_conn_id, self.storage_options = storage_conn_id, storage_options
        self.table_wait_timeout = table_wait_timeout

    def plan(self) -> MaintenancePlan:
        return MaintenancePlan(
            compact=self.compact, z_order=tuple(self.z_order or ()),
            target_file_bytes=int(self.target_file_bytes) if self.target_file_bytes else None,
            vacuum=self.vacuum, retain_hours=int(self.retain_hours), checkpoint=self.checkpoint,
            cleanup_log=self.cleanup_log, prune_orphans=self.prune, prune_records=self.prune,
            keep_days=float(self.keep_days), table_wait_timeout=float(self.table_wait_timeout),
        )

    def execute(self, context) -> dict:
        options = storage_options_of(self.storage_conn_id, self.storage_options)
        plan, done = self.plan(), {}
        ti = context.get("ti")  # the lease holder status shows while it runs
        run_key = run_key_of(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1)) if ti else ""
        try:
            with released_at_end():  # before the listeners fork this process (see task_end)
                for name, uri in (("table", self.table_uri), ("dead_letter_table", self.dead_letter_table_uri)):
                    if uri:
                        done[name] = maintain(uri, options, plan, run_key)
                        self.log.info("maintained %s: %s", uri, {k: v for k, v in done[name].items() if k != "layout"})
        except AirflowEoError as exc:  # a lost race is a retryable CommitConflictError
            raise_for_airflow(self.log, exc)
        return done
