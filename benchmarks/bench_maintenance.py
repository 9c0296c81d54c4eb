"""Maintenance: reading a table of many small batch files before and after ``maintain``'s
compaction, and what the compaction costs (wall time, peak memory).

The table is built without Spark or Kafka: ``files`` Parquet files of ``rows / files`` rows
each, laid out as an ingest lays them out (one attempt directory per batch, the key columns'
stats in each add action), committed in a few commits of many files each — building 10k
real batches through Spark would take hours and measure the same files. A read is what a
reader of the table does: deltalake's snapshot of the live files, then all of them into
Arrow. Compaction runs in a child process, so its peak RSS is its own.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

COMMIT_FILES = 1000  # add actions per building commit


def build(table_uri: str, files: int, rows: int) -> None:
    from deltalake.transaction import CommitProperties, create_table_with_add_actions

    from airflow_eo.table.commit import add_actions
    from airflow_eo.table.ledger import Ledger
    from airflow_eo.table.schema import delta_schema_of
    from airflow_eo.table.staging import staged_file
    from airflow_eo.table.storage import TableLocation

    per_file = max(1, rows // files)
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("value", pa.binary())])
    location, staged = TableLocation.of(table_uri), []
    for i in range(files):
        offsets = pa.array(range(i * per_file, (i + 1) * per_file), pa.int64())
        table = pa.table({"topic": pa.array(["bench"] * per_file), "partition": pa.array([i % 4] * per_file, pa.int32()),
                          "offset": offsets, "timestamp": pa.array([i * 1000] * per_file, pa.timestamp("us", tz="UTC")),
                          "value": pa.array([b"x" * 150] * per_file)}, schema=schema)
        relative = f"b{i + 1:08d}-{uuid.uuid4().hex[:16]}/part-00000.parquet"
        full = os.path.join(table_uri, relative)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        pq.write_table(table, full)
        staged.append(staged_file(location, location.fs.get_file_info(full)))
    adds = add_actions(staged)
    for start in range(0, len(adds), COMMIT_FILES):
        chunk = adds[start:start + COMMIT_FILES]
        properties = CommitProperties(custom_metadata={"bench": "build"})
        if start == 0:
            create_table_with_add_actions(table_uri, delta_schema_of(schema), chunk, mode="error",
                                          commit_properties=properties)
        else:
            Ledger.open(table_uri).table.create_write_transaction(chunk, mode="append", schema=delta_schema_of(schema),
                                                                  commit_properties=properties)


def read_seconds(table_uri: str, rows: int) -> float:
    from deltalake import DeltaTable

    started = time.monotonic()
    table = DeltaTable(table_uri).to_pyarrow_table()
    seconds = time.monotonic() - started
    if table.num_rows != rows:
        raise RuntimeError(f"read {table.num_rows} rows, expected {rows}")
    return seconds


# Each step in a child process: compaction's peak RSS is its own, and a process that read the
# table after a compaction aborts at exit now and then ("terminate called without an active
# exception", a native thread of the Arrow/deltalake stack), so children leave with os._exit.
_CHILD = """
import json, os, resource, sys, time
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from bench_maintenance import read_seconds
from airflow_eo.table.maintenance import MaintenancePlan, maintain
action, table_uri, rows, reads = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if action == "read":  # the first read of a process starts deltalake's runtime: a warm-up, not counted
    out = {"seconds": [read_seconds(table_uri, rows) for _ in range(reads + 1)][1:]}
else:
    started = time.monotonic()
    done = maintain(table_uri, plan=MaintenancePlan(vacuum=False, cleanup_log=False, prune_orphans=False,
                                                    prune_records=False))
    out = {"seconds": time.monotonic() - started, "compaction": done["compaction"],
           "files_after": done["layout"]["files"],
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
print(json.dumps(out), flush=True)
os._exit(0)
"""


def _child(action: str, table_uri: str, rows: int = 0, reads: int = 0) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, os.path.abspath(__file__), action, table_uri, str(rows),
                          str(reads)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(work: str, files: int, rows: int, repetitions: int, say=print) -> dict:
    """Build, read ``repetitions`` times, compact (child process), read again; the medians."""
    table_uri = os.path.join(work, "maintenance-table")
    say(f"building a table of {rows:,} rows in {files:,} batch files")
    started = time.monotonic()
    build(table_uri, files, rows)
    say(f"built in {time.monotonic() - started:.1f}s")
    expected = max(1, rows // files) * files
    before = _child("read", table_uri, expected, repetitions)["seconds"]
    compaction = _child("compact", table_uri)
    say(f"compacted {compaction['compaction']['numFilesRemoved']:,} files into {compaction['files_after']} "
        f"in {compaction['seconds']:.1f}s, peak RSS {compaction['peak_rss_mb']:.0f} MB")
    after = _child("read", table_uri, expected, repetitions)["seconds"]
    return {"files": files, "rows": expected, "read_before_seconds": before, "read_after_seconds": after,
            "read_speedup": statistics.median(before) / statistics.median(after), **compaction}
