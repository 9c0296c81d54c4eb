"""The warm and cold paths against one raw consumer: the rows of docs/performance.md's first table.

Each ingest is timed as the whole ``airflow-eo ingest`` command a user waits for, into a table
of its own, and every ratio pairs it with one plain confluent-kafka consumer (read_committed,
assigned every partition, counting) timed **right before it** on the same records: a raw time
taken under other load, or right after the broker was loaded, would flatter the ratio.

* warm (``--remote``): a server started by ``airflow-eo connect-server`` (its warm-up included);
  the first 1M batch on it and the next (steady) ones; a 1,000-record batch; the exactly-once
  overhead (the same read + write without ledger or commit, both in this process); optionally a
  larger batch (time per million against 1M) with the server's memory during both;
* cold (spark-submit): a 1,000-record batch and a 1M batch;
* an unreachable broker: the command's time until its error.

:class:`Load` measures what else ran on the machine during each timed step (CPU time of the
whole machine minus this benchmark's own process tree), so a busy run says so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition

from bench_memory import tree_pss_mb
from airflow_eo.attempt import Env, Secrets
from airflow_eo.core.offsets import OffsetRange

AIRFLOW_EO = os.path.join(os.path.dirname(sys.executable), "airflow-eo")
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
# Kafka's columns as a projection: the direct path (the read tasks write the Parquet)
SQL = "SELECT topic, partition, offset, timestamp, key, value FROM source"
_PHASES = {
    "read_planned": re.compile(r"read\+transform planned in ([\d.]+)s"),
    "read_and_stage": re.compile(r"staged \d+ rows in \d+ file\(s\) in ([\d.]+)s"),
    "commit_and_verify": re.compile(r"\(compare-and-set commit and verify\) in ([\d.]+)s"),
    "spark_job": re.compile(r"spark job for batch \d+ ended after ([\d.]+)s"),
}
BUSY_CORES = 0.25  # other work using more than this many cores on average during a step: a busy machine
# CPU times advance in clock ticks (10 ms): over a step of a few milliseconds one tick of anyone's
# reads as more than a core, so shorter steps are listed but not judged
JUDGED_SECONDS = 0.25
RAW_SPREAD = 1.25  # a raw time this much above the run's minimum: the broker or the machine was slowed


class Load:
    """CPU used on the machine by anything but this process tree, over a timed step, in cores."""

    def __init__(self):
        self.me = psutil.Process()
        self.steps: list[dict] = []

    def _ours(self) -> float:
        total = 0.0
        for proc in [self.me, *self.me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                continue
        return total

    @staticmethod
    def _machine() -> float:
        t = psutil.cpu_times()
        return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)

    def measure(self, label: str, step):
        """Run ``step()``; remember the other load during it; return its result."""
        load_before = os.getloadavg()[0]
        machine, ours, started = self._machine(), self._ours(), time.monotonic()
        result = step()
        wall = max(time.monotonic() - started, 1e-6)
        other = max(0.0, (self._machine() - machine) - (self._ours() - ours)) / wall
        self.steps.append({"step": label, "other_cores": round(other, 2), "load_1min_before": load_before,
                           "seconds": round(wall, 3)})
        return result

    def busy_steps(self) -> list[dict]:
        return [s for s in self.judged() if s["other_cores"] > BUSY_CORES]

    def judged(self) -> list[dict]:
        return [s for s in self.steps if s["seconds"] >= JUDGED_SECONDS]


def raw_single_consumer(kafka_config: dict, ranges: list[OffsetRange]) -> dict:
    """One confluent-kafka consumer, read_committed, assigned every range, counting into memory."""
    consumer = Consumer({**kafka_config, "group.id": "bench-raw-single", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    ends = {(r.topic, r.partition): r.end for r in ranges if r.size}
    started = time.perf_counter()
    consumer.assign([KafkaTopicPartition(r.topic, r.partition, r.start) for r in ranges if r.size])
    count, done, expected = 0, set(), sum(r.size for r in ranges)
    try:
        while len(done) < len(ends):
            # no more than the ranges still hold: consume() would wait out its timeout for the rest
            for m in consumer.consume(max(1, min(100_000, expected - count)), 1.0):
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
    if count != expected:
        raise RuntimeError(f"the raw consumer counted {count} records, expected {expected}")
    return {"seconds": time.perf_counter() - started, "records": count}


# A small batch is read by the driver itself (driver_read_max_offsets); these flags make it run as
# Spark tasks, as a batch does whose transform Spark must run: the Spark path's fixed cost
SPARK_TASKS = ("--driver-read-max-offsets", "0")


def command_env(kafka_config: dict, token: str | None = None) -> dict:
    """The environment of an ``airflow-eo`` command: the Kafka secrets, and the Connect token if any
    (never on the command line)."""
    env = {**os.environ, **Secrets(kafka_config).to_env(), Env.SPARK_LOCAL_IP: "127.0.0.1"}
    env.pop(TOKEN_ENV, None)
    if token:
        env[TOKEN_ENV] = token
    return env


def cli_ingest(table_uri: str, topic: str, kafka_config: dict, records: int, remote: str | None = None,
               master: str = "local[*]", token: str | None = None, expect_error: bool = False,
               extra: tuple[str, ...] = (), starts: dict[int, int] | None = None) -> dict:
    """One ``airflow-eo ingest`` of ``records`` offsets into a fresh table, from the first offsets or
    from ``starts`` (partition → offset): wall and phases."""
    cmd = [AIRFLOW_EO, "ingest", "--table", table_uri, "--ingest-id", "bench", "--topics", topic,
           "--max-records-per-run", str(records), "--transform-sql", SQL, "--json", *extra]
    if starts:
        cmd += ["--starting-offsets", json.dumps({topic: {str(p): o for p, o in starts.items()}})]
    cmd += ["--remote", remote] if remote else ["--master", master, "--conf", "spark.ui.enabled=false"]
    started = time.perf_counter()
    done = subprocess.run(cmd, env=command_env(kafka_config, token), capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if expect_error:
        if done.returncode == 0:
            raise RuntimeError("airflow-eo ingest succeeded where it had to fail")
        return {"seconds": seconds, "error": done.stderr.strip().splitlines()[-1][:300]}
    if done.returncode != 0:
        raise RuntimeError(f"airflow-eo ingest failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["rows"] != records:
        raise RuntimeError(f"airflow-eo ingest committed {result['rows']} rows, expected {records}")
    phases = {name: float(m.group(1)) for name, rx in _PHASES.items() if (m := rx.search(done.stderr))}
    return {"seconds": seconds, "rows": result["rows"], "phases": phases}


class ServerCommand:
    """``airflow-eo connect-server`` as a supervisor starts it: ready when its ``--ready-file`` appears
    (the check a health check makes, independent of the command's output), which must be when it
    prints its URL."""

    def __init__(self, master: str, work: str, timeout: float = 600.0, conf: tuple[str, ...] = ()):
        self.master, self.work, self.timeout, self.conf = master, work, timeout, conf
        stamp = time.time_ns()
        self.token_file = os.path.join(work, f"token-{stamp}")
        self.ready_file = os.path.join(work, f"ready-{stamp}")
        self.process: subprocess.Popen | None = None
        self.url: str | None = None
        self.start_seconds = 0.0

    def _failed(self, why: str) -> RuntimeError:
        self.stop()
        with open(os.path.join(self.work, "connect-server.log"), errors="replace") as log:
            tail = log.read()[-3000:]  # the work directory goes with the benchmark
        return RuntimeError(f"airflow-eo connect-server {why} (exit {self.process.returncode}):\n{tail}")

    def __enter__(self) -> "ServerCommand":
        from airflow_eo.submit.connect_server import die_with_parent, free_port

        started = time.perf_counter()
        self.process = subprocess.Popen(
            [AIRFLOW_EO, "connect-server", "--port", str(free_port()), "--master", self.master,
             "--token-file", self.token_file, "--ready-file", self.ready_file,
             *(arg for kv in self.conf for arg in ("--conf", kv))],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.work, "connect-server.log"), "ab"), text=True,
            env={k: v for k, v in os.environ.items() if k != TOKEN_ENV},
            preexec_fn=die_with_parent(os.getpid()))  # a killed benchmark takes its server (and the JVM) along
        while not os.path.exists(self.ready_file):
            if self.process.poll() is not None or time.perf_counter() - started > self.timeout:
                raise self._failed("did not become ready")
            time.sleep(0.02)
        self.start_seconds = time.perf_counter() - started
        with open(self.ready_file) as f:
            self.url = f.read().strip()
        if self.process.stdout.readline().strip() != self.url or not self.url.startswith("sc://"):
            raise self._failed(f"printed another URL than its ready file's ({self.url!r})")
        return self

    @property
    def token(self) -> str:
        with open(self.token_file) as f:
            return f.read().strip()

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __exit__(self, *exc) -> None:
        self.stop()


def warm_at_least_once(url: str, token: str, kafka_config: dict, ranges: list[OffsetRange], out_dir: str) -> dict:
    """The same read + write as a warm batch (the direct path), without ledger, plan log or commit,
    in this process's client of the shared session."""
    from airflow_eo.spec import DEFAULT_MAX_OFFSETS_PER_TASK
    from airflow_eo.driver.direct import read_and_stage
    from airflow_eo.submit.connect import ConnectSubmitter
    from airflow_eo.table.storage import TableLocation

    columns = ("topic", "partition", "offset", "timestamp", "key", "value")
    started = time.perf_counter()
    spark = ConnectSubmitter(f"{url}/;token={token}").session()
    files, rows = read_and_stage(spark, ranges, kafka_config, DEFAULT_MAX_OFFSETS_PER_TASK,
                                 TableLocation.of(out_dir), out_dir, columns=columns)
    seconds = time.perf_counter() - started
    if sum(rows.values()) != sum(r.size for r in ranges):
        raise RuntimeError(f"the at-least-once side staged {rows}")
    return {"seconds": seconds}


def warm_exactly_once(url: str, token: str, table_uri: str, topic: str, kafka_config: dict, records: int) -> dict:
    """The same batch through the exactly-once loop in this process: the fair pair of
    :func:`warm_at_least_once` (no command start-up on either side)."""
    from airflow_eo.loop.ingest import Ingestion
    from airflow_eo.loop.config import IngestConfig
    from airflow_eo.core.offsets import RunIdentity
    from airflow_eo.spec.parts import Transform
    from airflow_eo.submit.connect import ConnectSubmitter

    config = IngestConfig(table_uri=table_uri, ingest_id="bench", topics=[topic], kafka_config=kafka_config,
                          max_records_per_run=records, transform=Transform(sql=SQL))
    started = time.perf_counter()
    result = Ingestion(config, ConnectSubmitter(f"{url}/;token={token}")).run(RunIdentity(f"bench-{time.time_ns()}"))
    seconds = time.perf_counter() - started
    if result.rows != records:
        raise RuntimeError(f"the exactly-once side committed {result.rows} rows, expected {records}")
    return {"seconds": seconds}


def unreachable_broker(work: str) -> dict:
    """``airflow-eo ingest`` against a port where no broker listens: seconds until it fails."""
    from airflow_eo.submit.connect_server import free_port

    table = tempfile.mkdtemp(prefix="unreachable-", dir=work)
    return cli_ingest(table, "nowhere", {"bootstrap.servers": f"127.0.0.1:{free_port()}"}, 1000,
                      master="local[1]", expect_error=True)


def pairs_summary(pairs: list[tuple[float, float]]) -> dict:
    """Median of raw/ingest over the pairs, with the medians and ranges of both sides."""
    raws, ingests = [p[0] for p in pairs], [p[1] for p in pairs]
    return {"ratio": statistics.median(r / i for r, i in pairs), "raw_median": statistics.median(raws),
            "raw_min": min(raws), "raw_max": max(raws), "ingest_median": statistics.median(ingests),
            "ingest_min": min(ingests), "ingest_max": max(ingests), "n": len(pairs),
            "pairs": [[round(r, 3), round(i, 3)] for r, i in pairs]}


def server_memory(url: str, token: str, pid: int, work: str, topic: str, kafka_config: dict, batches: int,
                  checkpoints: tuple[int, ...] = (10,)) -> dict:
    """Run ``batches`` small batches (one table, consecutive ranges of 10 records) in this process;
    the server's PSS after each checkpoint and at the end (no state may leak between runs)."""
    from airflow_eo.loop.ingest import Ingestion
    from airflow_eo.loop.config import IngestConfig
    from airflow_eo.core.offsets import RunIdentity
    from airflow_eo.spec.parts import Transform
    from airflow_eo.submit.connect import ConnectSubmitter

    # the server's memory is the point: these batches run on it as Spark tasks, though a batch this
    # small would be read by the driver itself (driver_read_max_offsets)
    config = IngestConfig(table_uri=os.path.join(work, f"soak-{time.time_ns()}"), ingest_id="soak", topics=[topic],
                          kafka_config=kafka_config, max_records_per_run=10, transform=Transform(sql=SQL),
                          driver_read_max_offsets=0)
    submitter, pss = ConnectSubmitter(f"{url}/;token={token}"), {}
    for n in range(1, batches + 1):
        Ingestion(config, submitter).run(RunIdentity(f"soak-{n}"))
        if n in checkpoints or n == batches:
            time.sleep(2)  # let the JVM settle after the last job
            pss[f"after_{n}"] = tree_pss_mb(pid)
    return pss


# -- the report: the rows of docs/performance.md's first table ---------------------------------

def _row(metric: str, must: str, aim: str, measured: str, raw: str, met: bool | None) -> dict:
    return {"metric": metric, "must": must, "aim": aim, "measured": measured, "raw": raw, "met": met}


def _ratio_row(metric: str, summary: dict | None, must: float, aim: float) -> dict | None:
    if not summary:
        return None
    return _row(metric, f">= {must}", f">= {aim}", f"{summary['ratio']:.3f} (ingest {summary['ingest_median']:.2f} s, "
                f"{summary['ingest_min']:.2f}-{summary['ingest_max']:.2f})",
                f"{summary['raw_median']:.2f} s ({summary['raw_min']:.2f}-{summary['raw_max']:.2f})",
                summary["ratio"] >= must)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def _min_max(values: list[float] | None) -> str:
    return f", {min(values):.1f}-{max(values):.1f}" if values else ""


def _seconds_row(metric: str, values: list[float] | None, must: float, aim: float,
                 raw: list[float] | None = None) -> dict | None:
    """A time against its targets; ``raw``: one plain consumer reading the same records, right before each."""
    if not values:
        return None
    median = statistics.median(values)
    return _row(metric, f"<= {must} s", f"<= {aim} s", _spread(values), _spread(raw) if raw else "", median <= must)


def _info_row(metric: str, values: list[float] | None) -> dict | None:
    """A measurement beside the targets (no target of its own)."""
    if not values:
        return None
    return _row(metric, "", "", _spread(values), "", None)


def rows(results: dict) -> list[dict]:
    """The issue's rows from the warm and cold parts' results (those that ran)."""
    warm, cold = results.get("warm_paths", {}), results.get("cold_paths", {})
    scale = warm.get("scale")
    n = f"{results.get('records', 1_000_000):,}"
    small = f"{results.get('small_records', 1000):,}"
    out = [
        _ratio_row(f"warm, {n} records, steady state: raw / whole command", warm.get("steady_1m"), 0.6, 0.9),
        None if not warm.get("first_over_steady") else _row(
            f"warm, first {n}-record batch from ready (a fresh server's ready file) / steady batch", "<= 1.3x",
            "<= 1.1x",
            f"{statistics.median(warm['first_over_steady']):.2f}x "
            f"({min(warm['first_over_steady']):.2f}-{max(warm['first_over_steady']):.2f}; first "
            f"{statistics.median(warm['first_seconds']):.2f} s)", "",
            statistics.median(warm["first_over_steady"]) <= 1.3),
        _seconds_row(f"warm, {small}-record batch, whole command", warm.get("small_seconds"), 1.5, 1.0,
                     warm.get("small_raw_seconds")),
        _info_row(f"warm, {small}-record batch as Spark tasks ({' '.join(SPARK_TASKS)})", warm.get("small_spark_seconds")),
        _seconds_row(f"cold, {small}-record batch, whole command", cold.get("small_seconds"), 8.0, 6.0,
                     cold.get("small_raw_seconds")),
        _info_row(f"cold, {small}-record batch as Spark tasks ({' '.join(SPARK_TASKS)})", cold.get("small_spark_seconds")),
        _ratio_row(f"cold, {n} records: raw / whole command", cold.get("full_1m"), 0.15, 0.25),
        None if not scale else _row(
            f"warm, {scale['records']:,} records: time per million / {n}'s", "<= 1.1x (server memory flat)", "",
            f"{scale['per_million_ratio']:.2f}x ({scale['seconds']:.1f} s{_min_max(scale.get('seconds_all'))} vs steady "
            f"{scale['seconds_1m']:.2f} s); server peak PSS {scale['peak_pss_mb']:.0f} MB vs "
            f"{scale['peak_pss_mb_1m']:.0f} MB for {n} on the same broker",
            f"{scale['raw_seconds']:.1f} s (raw / ingest {scale['raw_seconds'] / scale['seconds']:.2f}"
            f"; {n} on the same broker: raw {scale['raw_seconds_1m_same_broker']:.1f} s, ingest "
            f"{scale['seconds_1m_same_broker']:.1f} s)" if "raw_seconds" in scale else "",
            scale["per_million_ratio"] <= 1.1 and scale["peak_pss_mb"] <= 1.25 * scale["peak_pss_mb_1m"]),
        _seconds_row("unreachable broker, until the error", cold.get("unreachable_seconds"), 10.0, 5.0),
        None if not warm.get("eo_over_alo") else _row(
            "exactly-once overhead: warm batch / the same read + write without ledger (in-process)", "<= 1.01", "",
            f"{statistics.median(warm['eo_over_alo']):.3f} ({min(warm['eo_over_alo']):.3f}-"
            f"{max(warm['eo_over_alo']):.3f})", "", statistics.median(warm["eo_over_alo"]) <= 1.01),
    ]
    return [r for r in out if r is not None]


def warnings(results: dict, load: Load) -> list[str]:
    """Why these figures may not stand for an idle machine."""
    out = []
    busy = load.busy_steps()
    if busy:
        worst = max(busy, key=lambda s: s["other_cores"])
        cores = [s["other_cores"] for s in busy]
        out.append(f"busy machine: other work used more than {BUSY_CORES} cores during {len(busy)} of "
                   f"{len(load.judged())} timed steps of {JUDGED_SECONDS} s or more (median {statistics.median(cores):.2f}, up to {worst['other_cores']:.2f} "
                   f"during {worst['step']}; load average {worst['load_1min_before']:.2f} before it of "
                   f"{os.cpu_count()} cores): re-measure on an idle machine")
    for part in ("warm_paths", "cold_paths", "fanout", "routing"):
        for key, summary in results.get(part, {}).items():
            if isinstance(summary, dict) and "raw_min" in summary and summary["raw_max"] > RAW_SPREAD * summary["raw_min"]:
                out.append(f"raw consumer times of {part}.{key} spread {summary['raw_min']:.2f}-{summary['raw_max']:.2f} s "
                           f"(more than {RAW_SPREAD}x its minimum): the machine or the broker was slowed")
    return out
