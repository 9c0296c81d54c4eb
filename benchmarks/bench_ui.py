"""The UI page's table list: one view of 50 tables of 10,000 commits each kept by ``maintain``, through
Airflow's own API app (``create_app``, the plugin from its entry point) and its test client.

Tables: one table of ``commits`` batch commits is built with deltalake's own commits, no data
files (each the moving partition's ``txn``, the batch counter and the batch metadata an ingest
writes; 10,000 take minutes, so it is cached under ``--cache-dir``), then ``maintain`` checkpoints
it (no compaction: no files); its log keeps every JSON commit, as ``maintain`` keeps 30 days of
them. ``tables`` copies of it are the tables of the list. Every commit is recent, so the 24-hour
counts read back the most a row ever reads (``LIST_COMMITS``): the worst case for a first view.

Airflow: a fresh SQLite metadata DB (``airflow db migrate``) holding, for each table, a DAG, the
ingest task's Asset alias, the table's Asset and one Asset event carrying a run summary, as the
operator leaves them; the user is an admin of the simple auth manager (Airflow's own JWT).

Measured, in a child process (its own ``AIRFLOW_HOME``): the first view after the API app starts
(every version read from the logs) and then ``repetitions`` views (the commit cache warm: each
table's log opened and checked for new commits once per view), plus a table's page cold and warm::

    .venv/bin/python benchmarks/benchmark.py --only ui                       # 50 tables x 10,000 commits
    .venv/bin/python benchmarks/bench_ui.py CACHE_DIR 10000                  # prebuild the table
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

INGEST_ID = "bench_ui"


def build_table(path: str, commits: int, partitions: int = 4, say=print) -> dict:
    """``commits`` batch commits of ``INGEST_ID`` (each one record on one partition), then checkpointed."""
    from deltalake import DeltaTable, Transaction
    from deltalake.transaction import CommitProperties

    from airflow_eo.driver.reader import KAFKA_SCHEMA
    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.core.offsets import OffsetRange, RunIdentity
    from airflow_eo.table.metadata import METADATA_KEY
    from airflow_eo.table.app_ids import batch_app_id, partition_app_id
    from airflow_eo.table.maintenance import MaintenancePlan, maintain
    from airflow_eo.table.metadata import BatchMetadata, CommitKind
    from airflow_eo.table.schema import delta_schema_of

    started = time.monotonic()
    schema = delta_schema_of(KAFKA_SCHEMA)
    table = DeltaTable.create(path, schema)
    for batch in range(1, commits + 1):
        moving = (batch - 1) % partitions
        start = (batch - 1) // partitions
        ranges = [OffsetRange("bench-ui", p, start + (p < moving), start + (p < moving) + (p == moving))
                  for p in (range(partitions) if batch == 1 else [moving])]
        plan = BatchPlan(INGEST_ID, batch, tuple(ranges), RunIdentity(f"bench_ui/run-{batch}/ingest/-1", "bench_ui",
                                                                      f"run-{batch}", "ingest", 1),
                         planned_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), attempt_id=f"{batch:016x}")
        meta = BatchMetadata.of(CommitKind.BATCH, plan, rows_per_partition={f"bench-ui[{moving}]": 1})
        txns = [Transaction(partition_app_id(INGEST_ID, r.tp), r.end) for r in ranges]
        table.create_write_transaction([], mode="append", schema=schema, commit_properties=CommitProperties(
            custom_metadata={METADATA_KEY: meta.to_json()},
            app_transactions=[*txns, Transaction(batch_app_id(INGEST_ID), batch)]))
        table.update_incremental()
        if batch % 1000 == 0:
            say(f"  ui table: {batch:,}/{commits:,} commits ({time.monotonic() - started:.0f}s)")
    maintain(path, plan=MaintenancePlan(compact=False, vacuum=False, prune_orphans=False, prune_records=False))
    return {"commits": commits, "build_seconds": time.monotonic() - started,
            "log_files": len(os.listdir(os.path.join(path, "_delta_log")))}


def cached_table(cache_dir: str, commits: int, say=print) -> tuple[str, dict]:
    path = os.path.join(cache_dir, f"ui-{commits}")
    marker = path + ".json"
    if os.path.exists(marker):
        with open(marker) as f:
            return path, {**json.load(f), "cached": True}
    shutil.rmtree(path, ignore_errors=True)  # an interrupted build
    os.makedirs(cache_dir, exist_ok=True)
    info = build_table(path, commits, say=say)
    with open(marker, "w") as f:
        json.dump(info, f)
    return path, {**info, "cached": False}


def populate(paths: list[str]) -> None:
    """What the ingest operator's runs leave in Airflow's DB for each table: its DAG, the Asset
    alias, the table's Asset and an Asset event with the run's summary."""
    from airflow.models.asset import AssetAliasModel, AssetEvent, AssetModel
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.utils.session import create_session

    with create_session() as session:
        session.add(DagBundleModel(name="dags-folder"))
        session.flush()
        for i, path in enumerate(paths):
            dag_id = f"bench_ui_{i:03d}"
            session.add(DagModel(dag_id=dag_id, bundle_name="dags-folder", fileloc=f"/dags/{dag_id}.py",
                                 max_active_tasks=16, max_active_runs=1, max_consecutive_failed_dag_runs=0,
                                 has_task_concurrency_limits=False, is_stale=False))
            alias = AssetAliasModel(name=f"airflow-eo:{dag_id}.ingest", group="asset")
            asset = AssetModel(uri=f"file://{path}", name=f"file://{path}", group="asset")
            asset.aliases.append(alias)
            session.add_all([alias, asset])
            session.flush()
            summary = {"status": "committed", "ingest_id": INGEST_ID, "table_uri": path, "batch": 1, "version": 1,
                       "rows": 1, "lag": {"bench-ui[0]": 0}, "ranges": [], "run_key": f"{dag_id}/run/ingest/-1"}
            event = AssetEvent(asset_id=asset.id, extra=summary, source_dag_id=dag_id, source_task_id="ingest",
                               source_run_id="manual__bench", source_map_index=-1)
            event.source_aliases.append(alias)
            session.add(event)


def child(tables_dir: str, repetitions: int) -> dict:
    """In a fresh AIRFLOW_HOME: migrate, populate, then view the list and a table's page."""
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "airflow"), "db", "migrate"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    paths = sorted(os.path.join(tables_dir, name) for name in os.listdir(tables_dir))
    populate(paths)
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    client = TestClient(create_app())
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="ADMIN"))
    headers = {"Authorization": f"Bearer {token}"}

    def view(path: str, expect: list[str]) -> float:
        started = time.perf_counter()
        response = client.get(f"/airflow-eo/{path}", headers=headers)
        seconds = time.perf_counter() - started
        text = re.sub(r"<[^>]+>", "", response.text)  # a path is set in segments that wrap after its slashes
        if response.status_code != 200 or any(p not in text for p in expect) or "cannot read" in text:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text[-2000:]}")
        return seconds

    cold = view("", paths)
    warm = [view("", paths) for _ in range(repetitions)]
    page = f"table?asset=1&ingest={INGEST_ID}"
    # the list read 64 commits of each table back for its batches; the page reads 500: partly cold
    page_first = view(page, ["Recent batches"])
    page_warm = [view(page, ["Recent batches"]) for _ in range(repetitions)]
    return {"list_first_view_seconds": cold, "list_seconds": warm, "table_page_first_view_seconds": page_first,
            "table_page_seconds": page_warm}


def run(work: str, cache_dir: str, tables: int, commits: int, repetitions: int, say=print) -> dict:
    """Build (or reuse) the table, copy it ``tables`` times, measure the views in a child process."""
    template, built = cached_table(cache_dir, commits, say)
    say(f"ui table of {commits:,} commits: {'cached' if built['cached'] else 'built'}, "
        f"{built['log_files']:,} files in its log")
    tables_dir = os.path.join(work, "ui-tables")
    for i in range(tables):
        # hard links: the tables are only read, and 50 x 10,000 log files copy (and go) in seconds
        shutil.copytree(template, os.path.join(tables_dir, f"t{i:03d}"), copy_function=os.link)
    home = tempfile.mkdtemp(prefix="airflow-home-", dir=work)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}, "AIRFLOW_HOME": home,
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
           "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING", "PYTHONPATH": os.pathsep.join(sys.path)}
    say(f"viewing the list of {tables} tables through Airflow's API app ({repetitions} warm views)")
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", tables_dir, str(repetitions)],
                          env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"bench_ui child failed:\n{done.stderr[-4000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    say(f"list: first view {out['list_first_view_seconds']:.2f}s, then median "
        f"{statistics.median(out['list_seconds']):.3f}s")
    return {"tables": tables, "commits": commits, "log_files": built["log_files"], **out}


if __name__ == "__main__":
    if sys.argv[1] == "--child":  # python bench_ui.py --child TABLES_DIR REPETITIONS (AIRFLOW_HOME set)
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]))), flush=True)
    else:  # prebuild: python benchmarks/bench_ui.py CACHE_DIR COMMITS
        print(cached_table(sys.argv[1], int(sys.argv[2])))
