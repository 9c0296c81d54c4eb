"""The audit in the benchmark: auditing a table against ingesting the same records on the same Spark path,
and the audit's memory against the number of records.

Side by side in one run, on one broker holding ``--records`` x ``--audit-multiplier`` records
(``--partitions`` partitions), interleaved (the paths' order alternates between repetitions):

* ``raw``: one plain confluent-kafka consumer reading the first ``--records`` records
  (read_committed, counting), right before each repetition: what reading them costs here;
* per Spark path, ``airflow-eo ingest`` of the first ``--records`` records into a fresh table,
  then ``airflow-eo audit --all`` of that table on the same path, each command timed whole:

  - ``local``: the ingest with spark-submit (``--master``); the audit with ``--master`` and its
    default threshold (below 10M offsets: compared in its own process, starting no JVM), and
    ``local_spark``: the same with every slice a Spark task in a session of that master
    (``--spark-threshold 0``: the JVM start included);
  - ``connect``: both on one warm Spark Connect server (``--remote``), the audit with its default
    threshold (below 2M offsets: in its own process), and ``connect_spark``: every slice a Spark
    task on that server;

* memory: the peak PSS of the auditing command's process tree (the command, and on the Spark
  path its JVM and Python workers; sampled every 0.1 s) auditing the 1x table and the
  ``--audit-multiplier`` x table, in process and as Spark tasks of a local session; beside it,
  reported and not judged, the exact peak RSS of the command's own process (the kernel's, at its
  exit), which also holds a peak shorter than the sampling interval.

Targets: audit / ingest <= 0.5 on each path with the audit's defaults (medians of the
repetitions; the ``_spark`` rows are reported beside them); the audit's peak memory at the large table / at the 1x table <= 1.25 ("flat in
the number of records")::

    .venv/bin/python benchmarks/benchmark.py --only audit                      # 1M records, x4 for memory
    .venv/bin/python benchmarks/benchmark.py --only audit --records 20000 --repetitions 1 --audit-multiplier 2
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import bench_paths
from bench_memory import PeakPss
from airflow_eo.attempt import Env, Secrets
from airflow_eo.audit import SPARK_THRESHOLD_COLD, SPARK_THRESHOLD_WARM
from airflow_eo.core.offsets import OffsetRange
from airflow_eo.submit.connect_server import ConnectServer

TOPIC = "bench-audit"
PATHS = ("local", "connect")

def engine_of(path: str, offsets: int) -> str:
    """Where the audit's defaults compare ``offsets`` on ``path`` (airflow_eo.audit's thresholds)."""
    threshold = {"local": SPARK_THRESHOLD_COLD, "connect": SPARK_THRESHOLD_WARM, "local_spark": 0,
                 "connect_spark": 0}.get(path)
    return "spark" if threshold is not None and offsets >= threshold else "in_process"


def audit(table: str, kafka_config: dict, path: str, master: str, remote: str | None = None,
          memory: bool = False) -> dict:
    """One ``airflow-eo audit --all`` of ``table`` on ``path`` (:func:`engine_of`): wall seconds, what
    it checked, and (``memory``) its peak PSS."""
    cmd = [bench_paths.AIRFLOW_EO, "audit", table, "--ingest-id", "bench", "--all", "--json"]
    if path == "in_process":
        cmd += ["--in-process"]
    elif path.startswith("connect"):
        cmd += ["--remote", str(remote)] + (["--spark-threshold", "0"] if path == "connect_spark" else [])
    else:
        cmd += ["--master", master, "--conf", "spark.ui.enabled=false"] + \
            (["--spark-threshold", "0"] if path == "local_spark" else [])
    env = {**os.environ, **Secrets(kafka_config).to_env(), Env.SPARK_LOCAL_IP: "127.0.0.1"}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", MAX_RSS_LAUNCHER, *cmd], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    with PeakPss(process.pid, interval=0.1) if memory else contextlib.nullcontext() as pss:
        out, err, max_rss_mb = communicate(process)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"airflow-eo audit ({path}) exited {process.returncode}:\n{err[-3000:]}")
    report = json.loads(out.strip().splitlines()[-1])
    if report["drift"] or report["engine"] != engine_of(path, report["checked_offsets"]):
        raise RuntimeError(f"audit ({path}) of a clean table: drift {report['drift']}, engine {report['engine']}")
    return {"seconds": seconds, "checked_offsets": report["checked_offsets"], "engine": report["engine"],
            "rows_read": report["rows_read"],
            **({"peak_pss_mb": pss.peak, "max_rss_mb": max_rss_mb} if memory else {})}


# Runs argv[1:] in a child forked from this small process and prints that child's peak RSS (kB,
# the kernel's, from wait4) as stderr's last line. Forked from the benchmark's own process, the
# command would inherit its high-water mark: Linux keeps ru_maxrss across exec.
MAX_RSS_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "sys.stderr.write(f'\\nmax_rss_kb={usage.ru_maxrss}\\n')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def communicate(process: subprocess.Popen) -> tuple[str, str, float]:
    """``process.communicate()`` of a command started through :data:`MAX_RSS_LAUNCHER`, and the
    command's exact peak RSS (MB): the sampled PSS can miss a peak shorter than its interval,
    such as a fetch response held for a tenth of a second."""
    out, err = process.communicate()
    body, _, last = err.rstrip().rpartition("\n")
    if not last.startswith("max_rss_kb="):
        raise RuntimeError(f"the launcher reported no peak RSS:\n{err[-3000:]}")
    return out, body, int(last.removeprefix("max_rss_kb=")) / 1024


def ingest(table: str, kafka_config: dict, records: int, path: str, master: str, remote: str) -> dict:
    out = bench_paths.cli_ingest(table, TOPIC, kafka_config, records, remote=remote if path == "connect" else None,
                                master=master)
    if out["rows"] != records:
        raise RuntimeError(f"ingest ({path}) committed {out['rows']} rows, expected {records}")
    return out


def run(bench, say) -> dict:
    """The audit part of ``benchmark.py`` (``bench``: its :class:`Bench`, for the broker, the args and the times)."""
    a = bench.args
    records, multiplier = a.records, max(1, a.audit_multiplier)
    load = {"load_average_at_start": os.getloadavg()}
    try:
        bench.start_broker(TOPIC, records)  # as large as the throughput part's: the broker slows with its size
        timed(bench, say, records)
        bench.stop_broker()
        memory = peak_memory(bench, say, records, multiplier) if multiplier > 1 else {}
    finally:
        bench.stop_broker()
    load["load_average_at_end"] = os.getloadavg()
    return {"records": records, "partitions": a.partitions, "multiplier": multiplier, **load,
            **summarise(bench.times, memory)}


def timed(bench, say, records: int) -> None:
    """Each repetition: the raw consumer, then per path the ingest of a fresh table and its audit."""
    a, config = bench.args, bench.kafka_config
    first = [OffsetRange(TOPIC, p, 0, records // a.partitions + (p < records % a.partitions))
             for p in range(a.partitions)]  # the records the ingest plans (the load is round-robin)
    with ConnectServer(master=a.master, log_file=os.path.join(bench.work, "audit-connect.log")) as server:
        for rep in range(a.repetitions):
            raw = bench_paths.raw_single_consumer(config, first)
            bench.record("audit.raw_single_consumer", raw["seconds"])
            for path in (PATHS if rep % 2 == 0 else PATHS[::-1]):
                table = bench.fresh(f"audit-{path}")
                done = ingest(table, config, records, path, a.master, server.url)
                bench.record(f"audit.{path}.ingest", done["seconds"])
                for side in (path, f"{path}_spark"):
                    checked = audit(table, config, side, a.master, server.url)
                    if checked["checked_offsets"] != records:
                        raise RuntimeError(f"audit ({side}) checked {checked['checked_offsets']} of {records}")
                    bench.record(f"audit.{side}.audit", checked["seconds"])
                    say(f"rep {rep + 1}/{a.repetitions}: {side}: ingest {done['seconds']:.1f}s, audit "
                        f"{checked['seconds']:.1f}s ({checked['engine']}; raw consumer {raw['seconds']:.1f}s)")


def peak_memory(bench, say, records: int, multiplier: int) -> dict:
    """On a broker of its own: tables of 1x and ``multiplier`` x the records (ingested warm), each
    audited in process and as Spark tasks of a local session, with the command tree's peak PSS."""
    a = bench.args
    bench.start_broker(TOPIC, records * multiplier)
    config, tables = bench.kafka_config, {}
    with ConnectServer(master=a.master, log_file=os.path.join(bench.work, "audit-memory-connect.log")) as server:
        for n in (records, records * multiplier):
            say(f"memory: ingesting a table of {n:,} records (warm)")
            tables[n] = bench.fresh("audit-memory")
            ingest(tables[n], config, n, "connect", a.master, server.url)
    memory: dict = {}
    for path in ("in_process", "local_spark"):
        for n, table in tables.items():
            out = audit(table, config, path, a.master, memory=True)
            memory.setdefault(path, {})[f"x{n // records}"] = {"records": n, "seconds": out["seconds"],
                                                                "peak_pss_mb": out["peak_pss_mb"],
                                                                "max_rss_mb": out["max_rss_mb"]}
            say(f"memory: audit {path} of {n:,} records: peak PSS {out['peak_pss_mb']:.0f} MB (sampled, the "
                f"tree), max RSS {out['max_rss_mb']:.0f} MB (exact, the command's process), {out['seconds']:.1f}s")
    return memory


def summarise(times: dict, memory: dict) -> dict:
    med = {k: statistics.median(v) for k, v in times.items() if k.startswith("audit.")}
    ratios = {f"{p}_audit_over_ingest": med[f"audit.{p}.audit"] / med[f"audit.{p}.ingest"] for p in PATHS}
    ratios.update({f"{p}_spark_audit_over_ingest": med[f"audit.{p}_spark.audit"] / med[f"audit.{p}.ingest"]
                   for p in PATHS})
    ratios["raw_consumer_over_local_audit"] = med["audit.raw_single_consumer"] / med["audit.local.audit"]
    growth = {p: max(m["peak_pss_mb"] for m in runs.values()) / min(m["peak_pss_mb"] for m in runs.values())
              for p, runs in memory.items()}
    targets = {f"audit/ingest<=0.5 ({p})": ratios[f"{p}_audit_over_ingest"] <= 0.5 for p in PATHS}
    targets.update({f"audit_memory_flat ({p}: large/x1<=1.25)": g <= 1.25 for p, g in growth.items()})
    # reported, not judged: the exact peak of the command's process, which the sampled PSS may miss
    rss_growth = {p: max(m["max_rss_mb"] for m in runs.values()) / min(m["max_rss_mb"] for m in runs.values())
                  for p, runs in memory.items()}
    for key, value in {**ratios, **{f"memory_growth.{p}": g for p, g in growth.items()},
                       **{f"max_rss_growth.{p}": g for p, g in rss_growth.items()}}.items():
        print(f"  audit: {key:40} {value:,.3f}")
    print("  audit targets: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in targets.items()))
    return {"ratios": ratios, "memory": memory, "memory_growth": growth, "max_rss_growth": rss_growth,
            "targets": targets}
