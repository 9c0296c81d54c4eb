"""Merge by key: a batch of changes (10 % deletes) merged into a large table against the same batch
appended, for two key distributions, with the files each merge rewrote.

The table (``rows`` rows keyed ``id`` 0..rows-1) is built with pyarrow and deltalake, not through
Spark, owned by the benchmark's ingest id: its rows arrive spread over every file (file i holds
ids i, i+F, i+2F…, as rows arriving out of key order would), then ``maintain --z-order id``
clusters them into about ``files`` files. A merge table is marked as one (write_mode=merge); the
append side gets a table of the same rows without the mark. Each measured run gets a fresh copy.

The batches (``changes`` records each, a tenth of them tombstones):

* **recent-heavy** (as with auto-increment ids): 90 % of the changes update or delete keys of the
  newest 5 % of the table, the other 10 % insert new keys above it (new rows), so the keys a batch
  changes cluster at the top of the key range;
* **uniform**: every change updates or deletes a key drawn from the whole table, so every file
  holds some of them and every file is rewritten (the number is reported: this is the worst case
  of a copy-on-write merge, and why z-ordering by the key cannot help it).

One plain confluent-kafka consumer fetches each batch right before its runs (the floor any
ingest of those records has), interleaved with them. The merge side's transform keeps the
record's change column (``_airflow_eo_change``, as the guide advises); ``merge_join_back``
(recent-heavy) leaves it out, so the driver joins it back by offset.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

INGEST_ID = "bench_merge"
SQL = ("SELECT CAST(CAST(key AS STRING) AS BIGINT) AS id, get_json_object(CAST(value AS STRING), '$.body') AS body, "
       "topic, partition, offset{} FROM source")
# the merge side keeps the record's change column (docs/how-to/upserts.md); join_back leaves it out
CHANGE = ", _airflow_eo_change"
DISTRIBUTIONS = ("recent_heavy", "uniform")
SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
                    ("offset", pa.int64())])


def build(table_uri: str, rows: int, spread_files: int, merge: bool) -> None:
    """``rows`` rows over ``spread_files`` files, each file spanning the whole key range."""
    from deltalake.transaction import CommitProperties, Transaction, create_table_with_add_actions

    from airflow_eo.table.commit import add_actions
    from airflow_eo.table.app_ids import batch_app_id, merge_app_id, merge_mark
    from airflow_eo.table.merge import with_key_stats
    from airflow_eo.table.schema import delta_schema_of
    from airflow_eo.table.staging import staged_file
    from airflow_eo.table.storage import TableLocation

    location, staged = TableLocation.of(table_uri), []
    directory = os.path.join(table_uri, f"b00000001-{uuid.uuid4().hex[:16]}")
    os.makedirs(directory)
    for i in range(spread_files):
        ids = pa.array(range(i, rows, spread_files), pa.int64())
        n = len(ids)
        table = pa.table({"id": ids, "body": pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), ""),
                          "topic": pa.array(["history"] * n), "partition": pa.array([0] * n, pa.int32()),
                          "offset": ids}, schema=SCHEMA)
        full = os.path.join(directory, f"part-{i:05d}.parquet")
        pq.write_table(table, full)
        staged.append(staged_file(location, location.fs.get_file_info(full)))
    txns = [Transaction(batch_app_id(INGEST_ID), 1)]
    if merge:
        txns.append(Transaction(merge_app_id(INGEST_ID), merge_mark(("id",))))
        staged = with_key_stats(location, staged, ("id",))
    create_table_with_add_actions(table_uri, delta_schema_of(SCHEMA), add_actions(staged), mode="error",
                                  commit_properties=CommitProperties(custom_metadata={"bench": "build"},
                                                                     app_transactions=txns))


def z_order(table_uri: str, files: int) -> dict:
    """``maintain --z-order id`` into about ``files`` files."""
    from deltalake import DeltaTable

    from airflow_eo.table.maintenance import MaintenancePlan, maintain

    size = sum(pa.table(DeltaTable(table_uri).get_add_actions(flatten=True))["size_bytes"].to_pylist())
    started = time.monotonic()
    done = maintain(table_uri, plan=MaintenancePlan(z_order=("id",), target_file_bytes=max(1, size // files),
                                                    vacuum=False, prune_orphans=False, prune_records=False))
    return {"seconds": time.monotonic() - started, "files": done["layout"]["files"]}


def changes_of(distribution: str, rows: int, count: int, delete_share: float, seed: int = 24) -> list[tuple]:
    """(id, delete?) of one batch."""
    rng = random.Random(seed)
    deletes = int(count * delete_share)
    if distribution == "uniform":
        keys = [rng.randrange(rows) for _ in range(count)]
    else:
        recent = count - count // 10
        keys = [rng.randrange(rows - rows // 20, rows) for _ in range(recent)] + list(range(rows, rows + count // 10))
    flagged = set(rng.sample(range(len(keys) - (0 if distribution == "uniform" else count // 10)), deletes))
    return [(k, i in flagged) for i, k in enumerate(keys)]


def load(config: dict, topic: str, changes: list[tuple], partitions: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({**config, "linger.ms": 20})
    for i, (key, delete) in enumerate(changes):
        value = None if delete else json.dumps({"body": f"changed-{i}"}).encode()
        while True:
            try:
                producer.produce(topic, key=str(key).encode(), value=value, partition=key % partitions)
                break
            except BufferError:
                producer.poll(0.5)
    producer.flush(60)


def ingest(spark, kafka_config: dict, table_uri: str, topic: str, merge: bool, join_back: bool = False) -> dict:
    """One exactly-once batch of the whole topic into ``table_uri`` (in this process's session);
    ``join_back``: the transform leaves the change column out, so the driver joins it back."""
    from airflow_eo.driver.main import InProcessSubmitter
    from airflow_eo.loop.ingest import Ingestion
    from airflow_eo.loop.config import IngestConfig
    from airflow_eo.core.offsets import RunIdentity

    config = IngestConfig(table_uri=table_uri, ingest_id=INGEST_ID, topics=[topic], kafka_config=kafka_config,
                          transform_sql=SQL.format(CHANGE if merge and not join_back else ""),
                          **({"write_mode": "merge", "merge_key": "id"} if merge else {}))
    started = time.monotonic()
    result = Ingestion(config, InProcessSubmitter(spark)).run(RunIdentity(uuid.uuid4().hex))
    return {"seconds": time.monotonic() - started, "rows": result.rows, "inserted": result.inserted,
            "updated": result.updated, "deleted": result.deleted, "files_rewritten": result.files_rewritten}


def table_files(table_uri: str) -> int:
    from deltalake import DeltaTable

    return len(DeltaTable(table_uri).file_uris())


def run(args, work: str, kafka_config: dict, spark, say, record, interleaved) -> dict:
    """The merge part of ``benchmarks/benchmark.py``: builds, loads, measures; returns the results
    (``record(key, seconds)`` collects the times the report prints)."""
    from bench_paths import raw_single_consumer

    import bench_kafka
    from airflow_eo.core.offsets import OffsetRange

    rows, count = args.merge_rows, args.merge_changes
    built = {side: os.path.join(work, f"merge-built-{side}") for side in ("merge", "append")}
    say(f"merge: building two tables of {rows:,} rows over {args.merge_spread_files} files (keys spread over all)")
    for side, path in built.items():
        build(path, rows, args.merge_spread_files, merge=side == "merge")
    unordered = os.path.join(work, "merge-built-unordered")
    shutil.copytree(built["merge"], unordered)
    say(f"merge: maintain --z-order id into ~{args.merge_files} files")
    zorder = z_order(built["merge"], args.merge_files)
    say(f"  {zorder['files']} files in {zorder['seconds']:.1f}s")
    results: dict = {"table_rows": rows, "batch_changes": count, "delete_share": args.merge_delete_share,
                     "z_order": zorder, "distributions": {}}
    copies = 0

    def fresh(side: str, source: str | None = None) -> str:
        nonlocal copies
        copies += 1
        target = os.path.join(work, f"merge-{side}-{copies}")
        shutil.copytree(source or built[side], target)
        return target

    for distribution in DISTRIBUTIONS:
        topic = f"merge-{distribution.replace('_', '-')}"
        bench_kafka.create_topic(kafka_config, topic, args.partitions)
        changes = changes_of(distribution, rows, count, args.merge_delete_share)
        load(kafka_config, topic, changes, args.partitions)
        ranges = [OffsetRange(topic, p, 0, sum(1 for k, _ in changes if k % args.partitions == p))
                  for p in range(args.partitions)]
        found: dict = {"files_before": zorder["files"]}
        for warm_up in ("append", "merge") if args.repetitions > 1 else ():  # not counted: the first jobs of each kind
            ingest(spark, kafka_config, fresh(warm_up), topic, warm_up == "merge")
        sides = ["raw_fetch", "append", "merge"] + (["merge_join_back"] if distribution == "recent_heavy" else [])
        for rep, side in interleaved(sides, args.repetitions):
            if side == "raw_fetch":
                out = raw_single_consumer(kafka_config, ranges)
            else:
                merge = side.startswith("merge")
                out = ingest(spark, kafka_config, fresh("merge" if merge else "append"), topic, merge,
                             side == "merge_join_back")
                if side == "merge":
                    found.update({k: out[k] for k in ("inserted", "updated", "deleted", "files_rewritten")})
            record(f"merge.{distribution}.{side}", out["seconds"])
            say(f"rep {rep + 1}/{args.repetitions}: {distribution} {side} {out['seconds']:.2f}s" +
                (f" ({out['files_rewritten']} of {zorder['files']} files rewritten)" if side.startswith("merge") else ""))
        if distribution == "recent_heavy":  # the same batch before z-ordering: keys spread over every file
            out = ingest(spark, kafka_config, fresh("merge", unordered), topic, True)
            found["before_z_order"] = {"seconds": out["seconds"], "files_rewritten": out["files_rewritten"],
                                       "files": table_files(unordered)}
        results["distributions"][distribution] = found
    return results


def ratios_and_targets(results: dict, times: dict) -> dict:
    """merge/append per distribution, the share of files rewritten, and the issue's targets."""
    med = {k: statistics.median(v) for k, v in times.items() if k.startswith("merge.")}
    out: dict = {}
    for distribution, found in results["distributions"].items():
        merge, append = med[f"merge.{distribution}.merge"], med[f"merge.{distribution}.append"]
        out[f"merge_over_append.{distribution}"] = merge / append
        out[f"files_rewritten_share.{distribution}"] = found["files_rewritten"] / found["files_before"]
        if f"merge.{distribution}.merge_join_back" in med:
            out[f"merge_join_back_over_append.{distribution}"] = med[f"merge.{distribution}.merge_join_back"] / append
    targets = {
        "merge/append<=3x(recent_heavy)": out["merge_over_append.recent_heavy"] <= 3.0,
        "files_rewritten<=10%(recent_heavy,z-ordered)": out["files_rewritten_share.recent_heavy"] <= 0.10,
    }
    return {"ratios": out, "targets": targets}
