"""Spark side of the benchmark: the at-least-once baseline and the exactly-once run (their peak memory: bench_memory).

Both sides start spark-submit with the same master and settings (those of
:class:`airflow_eo.submit.spark_submit.LocalSparkSubmit`) plus Spark's event log, so each run also yields
its *in-Spark* time from Spark's own events: application start (session ready) to
application end (``spark.stop()``, after the write, and for exactly-once after the commit).
JVM start (~15 s here) dominates small runs; the in-Spark time shows the work itself.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time
import uuid

import psutil

from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.loop.result import IngestResult
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.attempt import Secrets
from airflow_eo.submit.spark_submit import LocalSparkSubmit, job_environment, spark_submit_binary

ALO_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "alo_job.py")


def event_log_conf(directory: str) -> dict:
    os.makedirs(directory, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{directory}",
            "spark.eventLog.compress": "false"}


def _events(directory: str):
    # Spark 4 writes rolling logs: eventlog_v2_<app>/events_<n>_<app>
    for path in sorted(glob.glob(os.path.join(directory, "**", "*"), recursive=True)):
        if not os.path.isfile(path) or path.endswith(".crc"):
            continue
        with open(path, errors="replace") as f:
            for line in f:
                if '"SparkListenerApplication' in line or '"SparkListenerJob' in line:
                    yield json.loads(line)


def spark_phases(directory: str) -> dict:
    """From Spark's own event log: application start → end (``in_spark``) and the summed
    wall time of its jobs (``jobs``: the read → transform → Parquet write of the batch)."""
    start = end = None
    jobs, job_starts = 0.0, {}
    for event in _events(directory):
        kind = event["Event"]
        if kind == "SparkListenerApplicationStart":
            start = event["Timestamp"]
        elif kind == "SparkListenerApplicationEnd":
            end = event["Timestamp"]
        elif kind == "SparkListenerJobStart":
            job_starts[event["Job ID"]] = event["Submission Time"]
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in job_starts:
            jobs += (event["Completion Time"] - job_starts.pop(event["Job ID"])) / 1000
    return {"in_spark": (end - start) / 1000 if start and end else None, "jobs": jobs or None}


def spark_processes(exclude: set[int]) -> list[int]:
    """PIDs of spark-submit / JVM children still alive (none may run during a committed rerun)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in exclude and (child.name() == "java" or "spark-submit" in " ".join(child.cmdline())):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def run_alo(submitter: LocalSparkSubmit, kafka_config: dict, ranges: list[OffsetRange], out_dir: str,
            events_dir: str) -> dict:
    """spark-submit the at-least-once job over ``ranges``; wall and in-Spark seconds."""
    conf = {**submitter.conf, **event_log_conf(events_dir)}
    cmd = [spark_submit_binary(), "--master", submitter.master]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += [ALO_JOB, "--ranges", json.dumps([r.__dict__ for r in ranges]), "--out", out_dir]
    env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
           **job_environment(Secrets(kafka_config))}
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError("the at-least-once job failed:\n" + "\n".join(done.stdout.splitlines()[-30:]))
    phases = spark_phases(events_dir)
    return {"seconds": seconds, "in_spark_seconds": phases["in_spark"], "spark_jobs_seconds": phases["jobs"]}


def eo_config(table_uri: str, topic: str, kafka_config: dict, records: int) -> IngestConfig:
    # a Spark job whatever the size, as the at-least-once side is: a batch within
    # driver_read_max_offsets would be read by the driver itself, without Spark (and its event log)
    return IngestConfig(table_uri=table_uri, ingest_id="bench", topics=[topic], kafka_config=kafka_config,
                        max_records_per_run=records, driver_read_max_offsets=0)


def planned_ranges(config: IngestConfig) -> list[OffsetRange]:
    """The ranges a first run of ``config`` reads (planned without side effects)."""
    return list(Ingestion(config, None).plan(RunIdentity("bench-probe")).data_ranges)


def run_eo(master: str, conf: dict, config: IngestConfig, events_dir: str) -> tuple[dict, IngestResult]:
    """The real path: ``Ingestion(config, LocalSparkSubmit(...)).run(RunIdentity(unique))``."""
    submitter = LocalSparkSubmit(master=master, conf={**conf, **event_log_conf(events_dir)})
    started = time.perf_counter()
    # a run key of the operator's shape, so the committed rerun can go through the operator
    result = Ingestion(config, submitter).run(RunIdentity(f"bench/run-{uuid.uuid4().hex[:8]}/ingest/-1"))
    seconds = time.perf_counter() - started
    if result.status != "committed":
        raise RuntimeError(f"exactly-once run ended {result.status}")
    phases = spark_phases(events_dir)
    return {"seconds": seconds, "in_spark_seconds": phases["in_spark"], "spark_jobs_seconds": phases["jobs"],
            "rows": result.rows}, result


def committed_rerun(config: IngestConfig, run_key: str, exclude: set[int]) -> dict:
    """The whole operator task for an already-committed run: ``KafkaToDeltaOperator.execute``
    (connection lookup, config, ledger, plan log, summary, lag) must report the batch and
    start no Spark. ``run_key`` is ``<dag_id>/<run_id>/<task_id>/<map_index>``."""
    from types import SimpleNamespace

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    dag_id, run_id, task_id, _ = run_key.split("/")
    os.environ["AIRFLOW_CONN_AIRFLOW_EO_BENCH"] = json.dumps({"conn_type": "kafka", "extra": config.kafka_config})
    context = {"ti": SimpleNamespace(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=-1, try_number=2),
               "params": {}}
    started = time.perf_counter()
    operator = KafkaToDeltaOperator(task_id=task_id, topics=config.topics, table_uri=config.table_uri,
                                    ingest_id=config.ingest_id, kafka_conn_id="airflow_eo_bench",
                                    max_records_per_run=config.spec.planning.max_records_per_run)
    summary = operator.execute(context)
    seconds = time.perf_counter() - started
    if summary["status"] != "already_committed" or summary["spark_started"] or operator.submitter.hook is not None:
        raise RuntimeError(f"committed rerun did not short-cut: {summary['status']}")
    if spark_processes(exclude):
        raise RuntimeError("a Spark process is running during the committed rerun")
    return {"seconds": seconds, "spark_launches": 0}
