"""The Spark side of one attempt: read the planned ranges, stage Parquet, commit.

Runs in the Spark driver (``spark_jobs/kafka_to_delta.py``). The plan was logged and the
attempt recorded before spark-submit started; this code only executes it:

1. **read** the plan's ranges through the Python Data Source (read_committed);
2. **transform** them into the table's columns;
3. **stage** Parquet files with Spark's writer into the attempt's own directory;
4. **compare-and-set commit** the files with the offsets in one Delta commit;
5. **verify** the commit in the log (inside :func:`airflow_eo.commit.commit_batch`).

Secrets (Kafka client config, storage credentials) arrive through environment
variables, never as command-line arguments, which show up in process lists and logs.
"""

from __future__ import annotations

import json
import logging
import os
import time

from airflow_eo.commit import ALREADY_COMMITTED, COMMITTED, CommitOutcome, commit_batch
from airflow_eo.dead_letters import DeadLetters, complete_dead_letters
from airflow_eo.faults import failpoint
from airflow_eo.ledger import Ledger
from airflow_eo.planning import BatchPlan
from airflow_eo.spark_source import DEFAULT_MAX_OFFSETS_PER_TASK, SOURCE_NAME, register, source_options
from airflow_eo.staging import StagingArea
from airflow_eo.storage import TableLocation, is_local
from airflow_eo.transforms import Transform

log = logging.getLogger(__name__)

KAFKA_CONFIG_ENV = "AIRFLOW_EO_KAFKA_CONFIG"
STORAGE_OPTIONS_ENV = "AIRFLOW_EO_STORAGE_OPTIONS"

# Session settings the commit relies on: microsecond UTC timestamps in Parquet, so the
# Delta schema is plain `timestamp` (readable by delta-spark), not INT96/nanos.
SPARK_DEFAULTS = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def secret_from_env(name: str) -> dict:
    raw = os.environ.get(name)
    return json.loads(raw) if raw else {}


def read_plan(spark, plan: BatchPlan, kafka_config: dict, max_offsets_per_task: int):
    """Step 3 (read): a DataFrame of exactly the plan's records."""
    register(spark)
    options = source_options(plan.data_ranges, kafka_config, max_offsets_per_task)
    return spark.read.format(SOURCE_NAME).options(**options).load()


def spark_path(location: TableLocation, path: str) -> str:
    return f"file://{path}" if is_local(location.uri) else location.uri_of(location.relative(path))


def stage(out, location: TableLocation, target: str, storage_options: dict | None, arrow_schema):
    """Step 4 (stage): Spark's Parquet writer for local tables; for object stores the
    executors write with pyarrow (:mod:`airflow_eo.writer`), since Spark here has no
    ``hadoop-aws`` jar to write ``s3a://``."""
    if is_local(location.uri):
        out.write.mode("errorifexists").parquet(spark_path(location, target))
        return StagingArea(location).staged_files(target)
    from airflow_eo.writer import stage_with_arrow

    return stage_with_arrow(out, location, target, storage_options, arrow_schema)


def run_attempt(spark, table_uri: str, attempt_id: str, kafka_config: dict,
                storage_options: dict | None = None) -> CommitOutcome:
    """Execute a logged attempt: read, transform, stage, compare-and-set commit."""
    started = time.monotonic()
    location = TableLocation.of(table_uri, storage_options)
    staging = StagingArea(location)
    plan, job = staging.attempt_plan(attempt_id)
    failpoint("before_read")
    source = read_plan(spark, plan, kafka_config, int(job.get("max_offsets_per_task", DEFAULT_MAX_OFFSETS_PER_TASK)))
    dead = DeadLetters.of(source, job.get("decode"), plan, storage_options)  # None unless decoding
    if dead is not None:
        dead.stage(stage)  # undecodable records: staged beside the dead-letter table, threshold checked
        source = dead.good
    out = Transform(**job.get("transform", {})).apply(source)
    target = staging.attempt_path(plan)
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(out.schema)
    planned = time.monotonic()
    files = stage(out, location, target, storage_options, arrow_schema)
    rows = staging.rows_per_partition(files)
    staged = time.monotonic()
    # phase timings: where a run's time goes (README "Performance")
    log.info("batch %s: read+transform planned in %.2fs; read, transformed and staged %d rows in %d file(s) "
             "in %.2fs", plan.batch, planned - started, sum(rows.values()), len(files), staged - planned)
    failpoint("after_stage")
    failpoint("before_commit")
    if job.get("mode") == "reprocess":  # replace a past batch's rows (airflow_eo.reprocess)
        from airflow_eo.reprocess import commit_reprocess

        outcome = commit_reprocess(location.uri, plan, files, rows, arrow_schema, job, storage_options)
    else:
        extra = {"dead_letters": dead.manifest()} if dead is not None else None
        outcome = commit_batch(location.uri, plan, files, rows, arrow_schema, storage_options,
                               schema_evolution=bool(job.get("schema_evolution")), extra_metadata=extra)
        if dead is not None:  # the main commit decided: its dead letters follow (or an earlier attempt's)
            complete_dead_letters(Ledger.open(location.uri, storage_options), plan.ingest_id, storage_options)
    staging.end_attempt(attempt_id, committed=outcome.status == COMMITTED)
    log.info("batch %s: %s (compare-and-set commit and verify) in %.2fs", plan.batch, outcome.status,
             time.monotonic() - staged)
    failpoint("after_commit")
    if outcome.status == ALREADY_COMMITTED:
        log.info("batch %s was already committed by an earlier attempt", plan.batch)
    return outcome


def build_session(app_name: str, extra_conf: dict | None = None):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in {**SPARK_DEFAULTS, **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main(argv: list[str]) -> int:
    """``spark_jobs/kafka_to_delta.py``: run a prepared attempt, or plan and run one batch."""
    import argparse

    parser = argparse.ArgumentParser(prog="kafka_to_delta.py", description=__doc__.splitlines()[0])
    parser.add_argument("--table-uri", required=True)
    parser.add_argument("--attempt-id", help="execute an attempt logged by airflow-eo ingest / the operator")
    parser.add_argument("--ingest-id", help="standalone: the ingest's stable id")
    parser.add_argument("--topics", help="standalone: comma-separated topics")
    parser.add_argument("--run-key", default="", help="standalone: stable key that makes reruns replay")
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--max-records-per-run", type=int)
    parser.add_argument("--on-data-loss", default="fail", choices=["fail", "skip"])
    parser.add_argument("--transform-sql")
    parser.add_argument("--transform")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kafka_config = secret_from_env(KAFKA_CONFIG_ENV)
    storage_options = secret_from_env(STORAGE_OPTIONS_ENV) or None
    spark = build_session("airflow-eo kafka_to_delta")
    try:
        if args.attempt_id:
            outcome = run_attempt(spark, args.table_uri, args.attempt_id, kafka_config, storage_options)
            print("AIRFLOW_EO_RESULT " + json.dumps(outcome.__dict__), flush=True)
            return 0
        if not (args.ingest_id and args.topics):
            parser.error("give --attempt-id, or --ingest-id and --topics for a standalone run")
        from airflow_eo.ingest import IngestConfig, Ingestion
        from airflow_eo.planning import RunIdentity
        from airflow_eo.submit import InProcessSubmitter

        config = IngestConfig(
            table_uri=args.table_uri, ingest_id=args.ingest_id, topics=args.topics.split(","),
            kafka_config=kafka_config, starting_offsets=args.starting_offsets,
            max_records_per_run=args.max_records_per_run, on_data_loss=args.on_data_loss,
            transform=Transform(sql=args.transform_sql, callable=args.transform),
            storage_options=storage_options,
        )
        result = Ingestion(config, InProcessSubmitter(spark)).run(RunIdentity(run_key=args.run_key))
        print("AIRFLOW_EO_RESULT " + json.dumps(result.to_dict()), flush=True)
        return 0
    finally:
        spark.stop()
