"""At-least-once baseline job: the same Spark read and Parquet write as an exactly-once
attempt (the direct path: the read tasks write the files), without ledger read, plan log,
attempt marker or Delta commit.

Run by ``benchmarks/benchmark.py`` through spark-submit with the same settings as
:class:`airflow_eo.submit.spark_submit.LocalSparkSubmit`, so both sides pay the same JVM start::

    AIRFLOW_EO_KAFKA_CONFIG='{"bootstrap.servers": "127.0.0.1:9092"}' \\
    spark-submit benchmarks/alo_job.py --ranges '[{"topic": "t", "partition": 0, "start": 0, "end": 10}]' \\
        --out /tmp/alo-out
"""

import argparse
import json
import sys
import time

from airflow_eo.attempt import Secrets
from airflow_eo.spec import DEFAULT_MAX_OFFSETS_PER_TASK
from airflow_eo.driver.direct import read_and_stage
from airflow_eo.driver.session import build_session
from airflow_eo.core.offsets import OffsetRange
from airflow_eo.table.storage import TableLocation


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="alo_job.py")
    parser.add_argument("--ranges", required=True, help="JSON list of offset ranges")
    parser.add_argument("--out", required=True, help="local directory for the Parquet output")
    parser.add_argument("--max-offsets-per-task", type=int, default=DEFAULT_MAX_OFFSETS_PER_TASK)
    args = parser.parse_args(argv)
    ranges = [OffsetRange(**r) for r in json.loads(args.ranges)]
    spark = build_session("airflow-eo benchmark at-least-once")
    try:
        ready = time.time()
        read_and_stage(spark, ranges, dict(Secrets.from_env().kafka_config), args.max_offsets_per_task,
                       TableLocation.of(args.out), args.out)
        print("AIRFLOW_EO_BENCH " + json.dumps({"session_ready": ready, "write_done": time.time()}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
