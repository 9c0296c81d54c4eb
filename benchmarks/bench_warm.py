"""The warm path in the benchmark: a batch on a long-lived Spark Connect server vs a cold spark-submit.

Measured side by side on one broker and one server, interleaved:

* ``airflow-eo ingest`` whole-command wall time for a 1,000-record batch, ``--remote`` (warm)
  and with spark-submit (cold), each into a fresh table;
* the same command for the full data set on the warm server, against the raw baseline: one
  plain confluent-kafka consumer, read_committed, assigned all partitions, counting the
  records into memory;
* the exactly-once overhead on the warm server: the same read + Parquet write without ledger,
  plan log or commit (``at-least-once``), in one Connect session;
* where the time goes: the phase lines the command logs (plan, Spark read+stage, commit);
* the server's memory after 10 and after N small batches (no state may leak between runs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import psutil
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition

from datasource import read_with_data_source

from airflow_eo.attempt import Env, Secrets, Transform
from airflow_eo.driver.source import read_plan
from airflow_eo.driver.transforms import apply_transform
from airflow_eo.ingest import IngestConfig, Ingestion
from airflow_eo.planning import OffsetRange, RunIdentity
from airflow_eo.submit.connect import ConnectSubmitter

AIRFLOW_EO = os.path.join(os.path.dirname(sys.executable), "airflow-eo")
SQL = "SELECT topic, partition, offset, timestamp, key, value FROM source"
_PHASES = {
    "read_planned": re.compile(r"read\+transform planned in ([\d.]+)s"),
    "read_and_stage": re.compile(r"staged \d+ rows in \d+ file\(s\) in ([\d.]+)s"),
    "commit_and_verify": re.compile(r"\(compare-and-set commit and verify\) in ([\d.]+)s"),
    "spark_job": re.compile(r"spark job for batch \d+ ended after ([\d.]+)s"),
}


def cli_ingest(table_uri: str, topic: str, kafka_config: dict, records: int, remote: str | None = None,
               master: str = "local[*]") -> dict:
    """One ``airflow-eo ingest`` of the first ``records`` offsets into a fresh table: wall and phases."""
    cmd = [AIRFLOW_EO, "ingest", "--table", table_uri, "--ingest-id", "bench", "--topics", topic,
           "--max-records-per-run", str(records), "--transform-sql", SQL, "--json"]
    cmd += ["--remote", remote] if remote else ["--master", master, "--conf", "spark.ui.enabled=false"]
    env = {**os.environ, **Secrets(kafka_config).to_env(), Env.SPARK_LOCAL_IP: "127.0.0.1"}
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"airflow-eo ingest failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    phases = {name: float(m.group(1)) for name, rx in _PHASES.items() if (m := rx.search(done.stderr))}
    return {"seconds": seconds, "rows": result["rows"], "phases": phases}


def raw_single_consumer(kafka_config: dict, ranges: list[OffsetRange]) -> dict:
    """One confluent-kafka consumer, read_committed, assigned every range, counting into memory."""
    consumer = Consumer({**kafka_config, "group.id": "bench-raw-single", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    ends = {(r.topic, r.partition): r.end for r in ranges if r.size}
    started = time.perf_counter()
    consumer.assign([KafkaTopicPartition(r.topic, r.partition, r.start) for r in ranges if r.size])
    count, done = 0, set()
    try:
        while len(done) < len(ends):
            for m in consumer.consume(100_000, 1.0):
                key = (m.topic(), m.partition())
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        done.add(key)
                    continue
                if m.offset() < ends[key]:
                    count += 1
                if m.offset() >= ends[key] - 1:
                    done.add(key)
    finally:
        consumer.close()
    return {"seconds": time.perf_counter() - started, "records": count}


def warm_at_least_once(url: str, kafka_config: dict, ranges: list[OffsetRange], out_dir: str,
                       reader: str = "arrow") -> dict:
    """The same read + Parquet write on the warm server, without ledger, plan log or commit;
    ``reader``: ``arrow`` (the package's mapInArrow reader) or ``datasource`` (the Python Data
    Source in ``benchmarks/datasource.py``)."""
    submitter = ConnectSubmitter(url)
    started = time.perf_counter()
    spark = submitter.session()  # this process's client of the shared session, as an attempt uses it
    read = read_with_data_source if reader == "datasource" else read_plan
    source = read(spark, ranges, dict(kafka_config), 1_000_000)
    apply_transform(Transform(sql=SQL), source, "source_alo").write.mode("error").parquet(f"file://{out_dir}")
    spark.catalog.dropTempView("source_alo")
    return {"seconds": time.perf_counter() - started}


def warm_exactly_once_in_process(url: str, table_uri: str, topic: str, kafka_config: dict, records: int) -> dict:
    """The same batch through the loop in this process (no command start-up): the fair pair of
    :func:`warm_at_least_once`."""
    config = IngestConfig(table_uri=table_uri, ingest_id="bench", topics=[topic], kafka_config=kafka_config,
                          max_records_per_run=records, transform=Transform(sql=SQL))
    started = time.perf_counter()
    result = Ingestion(config, ConnectSubmitter(url)).run(RunIdentity(f"bench-{time.time_ns()}"))
    return {"seconds": time.perf_counter() - started, "rows": result.rows}


def tree_pss_mb(pid: int) -> float:
    """Proportional set size of a process and its children (the server's JVM and Python
    workers): shared pages counted once, unlike RSS."""
    total = 0
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            continue
    return total / 2**20


def server_memory(url: str, pid: int, work: str, topic: str, kafka_config: dict, batches: int,
                  checkpoints: tuple[int, ...] = (10,)) -> dict:
    """Run ``batches`` small batches (one table, consecutive ranges of 10 records); the server's
    PSS after each checkpoint and at the end."""
    config = IngestConfig(table_uri=os.path.join(work, "soak-table"), ingest_id="soak", topics=[topic],
                          kafka_config=kafka_config, max_records_per_run=10, transform=Transform(sql=SQL))
    submitter, rss = ConnectSubmitter(url), {}
    for n in range(1, batches + 1):
        Ingestion(config, submitter).run(RunIdentity(f"soak-{n}"))
        if n in checkpoints or n == batches:
            time.sleep(2)  # let the JVM settle after the last job
            rss[f"after_{n}"] = tree_pss_mb(pid)
    return rss

