"""Example: daily maintenance of the table ``kafka_to_delta_scheduled`` feeds (airflow-eo).

Compacts the small files of a day of batches, vacuums files that commits removed more than
a week ago, checkpoints the log and cleans its expired files, and removes staged files of
attempts that died — beside the hourly ingest, which may keep running: every step is safe
against a batch committing at the same time, and the table's offsets and its batches'
``reprocess`` survive all of them (docs/how-to/maintenance.md).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

# common-compat's names: the example runs unchanged on Airflow 2.11 and 3.x (on 3.x alone: airflow.sdk)
from airflow.providers.common.compat.sdk import DAG

from airflow_eo.attempt import Env
from airflow_eo.operators.delta_maintenance import DeltaMaintenanceOperator

TABLE_URI = os.environ.get(Env.EXAMPLE_TABLE_URI, "/tmp/airflow-eo-demo/orders")

# retries: a maintenance step that loses a race with a commit is retried
with DAG(dag_id="delta_maintenance_daily", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False,
         max_active_runs=1, default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
         tags=["airflow-eo", "example"]) as dag:
    DeltaMaintenanceOperator(
        task_id="maintain", table_uri=TABLE_URI,
        retain_hours=168,  # keep removed files a week: readers and time travel within it are safe
    )
