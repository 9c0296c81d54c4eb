"""Tables other Delta engines share (docs/how-to/shared-tables.md): what honouring their features costs.

* **constraints**: one batch of the data topic (``--records``) into a table without rules against
  the same batch into a table with two CHECK constraints and a NOT NULL column (checked by Spark in
  the pass that writes the rows). Both tables are pre-created by deltalake (adopted: ``adopt_table``)
  with the transform's columns, and both runs use the same SQL transform, so both take the Spark
  path (a table with rules always does; without rules and without a transform the driver's direct
  path would be a different path, not the cost of the check);
* **CDF merge**: a merge batch (``--shared-merge-changes`` records, a tenth tombstones, keys over the
  whole table) into a table of ``--shared-merge-rows`` rows with ``delta.enableChangeDataFeed`` on
  (committed through deltalake's MERGE, which writes the change files) against the same batch into
  the same table without the feed (airflow-eo's own file swap).

Each measured run gets a fresh copy of its table; the sides are interleaved.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid

import pyarrow as pa

INGEST_ID = "bench_shared"
SQL = "SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body FROM source"
SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                    ("timestamp", pa.timestamp("us", tz="UTC")), ("body", pa.string())])
CONSTRAINTS = {"offset_not_negative": "offset >= 0", "body_not_empty": "body <> ''"}


def constrained_table(table_uri: str, rules: bool) -> None:
    """An empty table of the transform's columns; with ``rules``, ``body`` NOT NULL and the CHECK
    constraints (deltalake's alter API)."""
    from deltalake import DeltaTable, write_deltalake

    schema = SCHEMA
    if rules:
        schema = schema.set(schema.get_field_index("body"), pa.field("body", pa.string(), nullable=False))
    write_deltalake(table_uri, schema.empty_table())
    if rules:
        DeltaTable(table_uri).alter.add_constraint(CONSTRAINTS)


def ingest(spark, kafka_config: dict, table_uri: str, topic: str, ingest_id: str = INGEST_ID, **options) -> dict:
    from airflow_eo.driver.main import InProcessSubmitter
    from airflow_eo.loop.ingest import Ingestion
    from airflow_eo.loop.config import IngestConfig
    from airflow_eo.core.offsets import RunIdentity

    config = IngestConfig(table_uri=table_uri, ingest_id=ingest_id, topics=[topic], kafka_config=kafka_config,
                          **options)
    started = time.monotonic()
    result = Ingestion(config, InProcessSubmitter(spark)).run(RunIdentity(uuid.uuid4().hex))
    return {"seconds": time.monotonic() - started, "rows": result.rows, "inserted": result.inserted,
            "updated": result.updated, "deleted": result.deleted}


def run(args, work: str, kafka_config: dict, data_topic: str, spark, say, record, interleaved) -> dict:
    """The shared-tables part of ``benchmarks/benchmark.py``."""
    import bench_kafka
    import bench_merge
    from deltalake import DeltaTable

    results: dict = {}
    copies = 0

    def fresh(source: str) -> str:
        nonlocal copies
        copies += 1
        target = os.path.join(work, f"shared-{copies}")
        shutil.copytree(source, target)
        return target

    # -- constraints ------------------------------------------------------------------------------
    built = {side: os.path.join(work, f"shared-built-{side}") for side in ("plain", "constraints")}
    for side, path in built.items():
        constrained_table(path, side == "constraints")
    sides = ["plain", "constraints"]
    for rep, side in [(None, s) for s in sides] + list(interleaved(sides, args.repetitions)):
        out = ingest(spark, kafka_config, fresh(built[side]), data_topic, transform_sql=SQL, adopt_table=True)
        if rep is None:
            continue  # not counted: the session's first jobs of each kind
        if out["rows"] != args.records:
            raise RuntimeError(f"shared constraints {side}: {out['rows']} rows, expected {args.records}")
        record(f"shared.{side}", out["seconds"])
        say(f"rep {rep + 1}/{args.repetitions}: {side} {out['seconds']:.2f}s")
    results["constraints"] = {"records": args.records, "rules": len(CONSTRAINTS)}

    # -- a merge batch on a table with the change data feed ---------------------------------------
    rows, count = args.shared_merge_rows, args.shared_merge_changes
    base = os.path.join(work, "shared-merge-built")
    say(f"shared: a merge table of {rows:,} rows; its copy with the change data feed on")
    bench_merge.build(base, rows, 10, merge=True)
    cdf = fresh(base)
    DeltaTable(cdf).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    topic = "shared-merge"
    bench_kafka.create_topic(kafka_config, topic, args.partitions)
    bench_merge.load(kafka_config, topic, bench_merge.changes_of("uniform", rows, count, 0.1), args.partitions)
    sides = ["merge", "merge_cdf"]
    merge_options = {"transform_sql": bench_merge.SQL.format(bench_merge.CHANGE), "write_mode": "merge",
                     "merge_key": "id", "ingest_id": bench_merge.INGEST_ID}
    found: dict = {}
    for rep, side in [(None, s) for s in sides] + list(interleaved(sides, args.repetitions)):
        table = fresh(cdf if side == "merge_cdf" else base)
        out = ingest(spark, kafka_config, table, topic, **merge_options)
        if rep is None:
            continue
        record(f"shared.{side}", out["seconds"])
        found[side] = {k: out[k] for k in ("inserted", "updated", "deleted")}
        say(f"rep {rep + 1}/{args.repetitions}: {side} {out['seconds']:.2f}s ({found[side]})")
    if found.get("merge") != found.get("merge_cdf"):
        raise RuntimeError(f"the two merges did different things: {found}")
    results["cdf_merge"] = {"table_rows": rows, "batch_changes": count, "counts": found.get("merge")}
    return results


def ratios_and_targets(times: dict) -> dict:
    import statistics

    med = {k: statistics.median(v) for k, v in times.items() if k.startswith("shared.")}
    out = {"constraints_over_plain": med["shared.constraints"] / med["shared.plain"],
           "merge_cdf_over_merge": med["shared.merge_cdf"] / med["shared.merge"]}
    return {"ratios": out, "targets": {"constraints/plain<=1.05": out["constraints_over_plain"] <= 1.05,
                                       "merge_cdf/merge<=1.3": out["merge_cdf_over_merge"] <= 1.3}}
