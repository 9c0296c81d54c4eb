"""Planning-latency fixtures: a Delta table with many commits, built with the project's own
commit path (``airflow_eo.table.commit.commit``), no Spark.

Each commit is one batch of an ingest over a ``partitions``-partition topic with one tiny
Parquet file written with pyarrow into the batch's attempt directory. Offsets advance by one
record on one partition per batch, so the topic needs only ``commits / partitions`` records
per partition. delta-rs writes a checkpoint every ``delta.checkpointInterval`` (default 100)
commits by itself (post-commit hook); :func:`build_table` reports how many.

Why two shapes of commit: a real batch carries a ``txn`` for *every* partition (empty ranges
included), and ``commit_batch`` reads each one with ``DeltaTable.transaction_version`` (one
log scan per call, 0.5-3 ms), so real-shaped commits build at ~3/s here and 10,000 of them
would take about an hour. Everything a reader replays *before the last checkpoint* is folded
into that checkpoint (the latest ``txn`` per appId, the live ``add`` files), which is the same
whichever shape built it. So the bulk is built with "narrow" commits (the moving partition's
``txn`` + the batch counter) and the commits a reader replays *after* the checkpoint
(:func:`extend_table`, up to 99) are real-shaped with all partitions: the log a planner reads
is then the same as a real table's.

The last batch is planned like a real run (plan logged under its run key before commit),
so the same table also serves the "committed rerun" measurement.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_eo.sinks.append import BatchCommit
from airflow_eo.table.commit import StagedBatch, commit
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.driver.reader import KAFKA_SCHEMA
from airflow_eo.table.plan_log import PlanLog
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import OffsetRange, RunIdentity, TopicPartition
from airflow_eo.table.staging import StagingArea, new_attempt_id
from airflow_eo.table.storage import TableLocation

PLANNING_INGEST_ID = "bench_planning"


def _tiny_file(path: str, topic: str, partition: int, offset: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    row = {
        "topic": [topic], "partition": [partition], "offset": [offset], "timestamp": [0],
        "timestampType": [0], "key": [b"k"], "value": [b"v"], "headers": [None],
    }
    pq.write_table(pa.table(row, schema=KAFKA_SCHEMA), path)


def batch_plan(topic: str, partitions: int, batch: int, run_key: str, narrow: bool = False) -> BatchPlan:
    """Batch ``batch``: partition (batch-1) % n advances by one; a full plan also lists every
    other partition with an empty range, a narrow one only the moving partition."""
    moving = (batch - 1) % partitions
    ranges = []
    for p in ([moving] if narrow else range(partitions)):
        start = (batch - 1) // partitions + (1 if p < moving else 0)
        ranges.append(OffsetRange(topic, p, start, start + (1 if p == moving else 0)))
    new = tuple(TopicPartition(r.topic, r.partition) for r in ranges) if batch == 1 else ()
    return BatchPlan(ingest_id=PLANNING_INGEST_ID, batch=batch, ranges=tuple(ranges),
                     run=RunIdentity(run_key), new_partitions=new, attempt_id=new_attempt_id())


def commit_one(table_uri: str, staging: StagingArea, plan: BatchPlan) -> None:
    moving = next(r for r in plan.ranges if r.size > 0)
    _tiny_file(os.path.join(staging.attempt_path(plan), "part-00000.parquet"), moving.topic,
               moving.partition, moving.start)
    files = staging.staged_files(staging.attempt_path(plan))
    commit(BatchCommit(StagedBatch(plan, tuple(files), staging.rows_per_partition(files), KAFKA_SCHEMA)), table_uri)


def build_table(table_uri: str, topic: str, partitions: int, commits: int, rerun_key: str,
                progress_every: int = 500, first: int = 1, narrow: bool = True) -> dict:
    """Commit batches ``first..commits``; the last one under ``rerun_key`` with its plan logged."""
    location = TableLocation.of(table_uri)
    staging, plans = StagingArea(location), PlanLog(location)
    started = time.monotonic()
    for batch in range(first, commits + 1):
        last = batch == commits
        # batch 1 creates every partition's txn: always full-shaped
        plan = batch_plan(topic, partitions, batch, rerun_key if last else f"build-{batch}",
                          narrow=narrow and batch > 1)
        if last:
            plans.record(plan)
        commit_one(table_uri, staging, plan)
        if batch % progress_every == 0 or last:
            elapsed = time.monotonic() - started
            print(f"  planning table {os.path.basename(table_uri)}: {batch}/{commits} commits "
                  f"({elapsed:.0f}s, {(batch - first + 1) / elapsed:.1f}/s)", file=sys.stderr, flush=True)
    log_dir = os.path.join(table_uri, "_delta_log")
    checkpoints = sorted(f for f in os.listdir(log_dir) if ".checkpoint." in f)
    return {"commits": commits, "partitions": partitions, "build_seconds": time.monotonic() - started,
            "checkpoints": len(checkpoints), "last_checkpoint": checkpoints[-1] if checkpoints else None}


def extend_table(table_uri: str, topic: str, partitions: int, commits: int, extra: int, rerun_key: str) -> dict:
    """Add ``extra`` real-shaped (all-partition) commits after ``commits``: the log tail a reader
    replays past the last checkpoint."""
    return build_table(table_uri, topic, partitions, commits + extra, rerun_key, progress_every=50,
                       first=commits + 1, narrow=False)


def records_needed(commits: int, partitions: int) -> int:
    """Records per partition the topic must hold for the table's offsets to be valid."""
    return -(-commits // partitions)


def planning_ingestion(table_uri: str, topic: str, kafka_config: dict, submitter, mode: str = "offsets") -> Ingestion:
    config = IngestConfig(table_uri=table_uri, ingest_id=PLANNING_INGEST_ID, topics=[topic],
                          kafka_config=kafka_config, mode=mode)
    return Ingestion(config, submitter)


def time_plan(ingestion: Ingestion, run_key: str, interval=None) -> tuple[float, int]:
    """Seconds for ``Ingestion.plan`` (ledger read + Kafka metadata and bounds; in interval mode
    also the offsets by timestamp of both ends), and its batch."""
    t = time.perf_counter()
    plan = ingestion.plan(RunIdentity(run_key), interval=interval)
    return time.perf_counter() - t, plan.batch


PLANNING_TOPIC = "bench-planning"
RERUN_KEY = "bench/committed-rerun/ingest/-1"  # the operator's run-key shape


def cached_table(cache_dir: str, commits: int, partitions: int, long_log: bool = False) -> tuple[str, dict]:
    """The ``commits``-commit table under ``cache_dir`` (built once: it takes minutes), by the
    project's commit path or, ``long_log``, by :func:`build_long_log`."""
    path = os.path.join(cache_dir, f"{'long-log' if long_log else 'planning'}-{commits}x{partitions}")
    marker = path + ".json"
    if os.path.exists(marker):
        with open(marker) as f:
            return path, {**json.load(f), "cached": True}
    if os.path.exists(path):
        import shutil

        shutil.rmtree(path)  # an interrupted build
    if long_log:
        info = build_long_log(path, PLANNING_TOPIC, partitions, commits)
    else:
        info = build_table(path, PLANNING_TOPIC, partitions, commits, f"{RERUN_KEY}-base")
    with open(marker, "w") as f:
        json.dump(info, f)
    return path, {**info, "cached": False}


def build_long_log(table_uri: str, topic: str, partitions: int, commits: int, progress_every: int = 10_000) -> dict:
    """A table of ``commits`` commits made with deltalake's own commit, without files: each the
    txn of its moving partition, the batch counter and the batch metadata an ingest writes (batch
    1 carries every partition). For 100k commits the project's commit path (a table open and a
    staged file per commit) would take hours. The writer checkpoints every 100 commits and, with
    ``delta.logRetentionDuration`` 0, cleans the log behind each checkpoint, so a commit does not
    list an ever longer log; a planner reads the same either way: the last checkpoint (every
    partition's txn) plus the commits after it."""
    from deltalake import DeltaTable, Transaction
    from deltalake.transaction import CommitProperties

    from airflow_eo.table.metadata import BatchMetadata, CommitKind
    from airflow_eo.table.metadata import METADATA_KEY
    from airflow_eo.table.app_ids import batch_app_id, partition_app_id
    from airflow_eo.table.schema import delta_schema_of

    started = time.monotonic()
    schema = delta_schema_of(KAFKA_SCHEMA)
    table = DeltaTable.create(table_uri, schema, configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    for batch in range(1, commits + 1):
        plan = batch_plan(topic, partitions, batch, f"build-{batch}", narrow=batch > 1)
        txns = [Transaction(partition_app_id(PLANNING_INGEST_ID, r.tp), r.end) for r in plan.ranges]
        properties = CommitProperties(custom_metadata={METADATA_KEY: BatchMetadata.of(CommitKind.BATCH, plan).to_json()},
                                      app_transactions=[*txns, Transaction(batch_app_id(PLANNING_INGEST_ID), batch)])
        table.create_write_transaction([], mode="append", schema=schema, commit_properties=properties)
        table.update_incremental()
        if batch % progress_every == 0:
            elapsed = time.monotonic() - started
            print(f"  long log: {batch}/{commits} commits ({elapsed:.0f}s, {batch / elapsed:.0f}/s)", file=sys.stderr,
                  flush=True)
    log_dir = os.path.join(table_uri, "_delta_log")
    return {"commits": commits, "partitions": partitions, "build_seconds": time.monotonic() - started,
            "log_files": len(os.listdir(log_dir)), "version": table.version()}


if __name__ == "__main__":  # prebuild: python benchmarks/bench_ledger.py CACHE_DIR COMMITS PARTITIONS
    print(cached_table(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
