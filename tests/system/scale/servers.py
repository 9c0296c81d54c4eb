"""Real servers the scale tests start on 127.0.0.1 and stop by PID.

* ``MotoS3`` — ``moto_server`` as a local S3 endpoint: the pytest plugin's (airflow_eo/testing/s3.py);
* :class:`SparkStandalone` — a Spark standalone master and one worker started with the
  installed pyspark's ``spark-class``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_eo.submit.connect_server import free_port
from airflow_eo.testing.s3 import stop, wait_for

VENV_BIN = Path(sys.executable).parent


class SparkStandalone:
    """A standalone master + one worker (1 core, 1 GB) from the installed pyspark."""

    def __init__(self, workdir: Path):
        import pyspark

        self.spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        self.workdir = workdir
        self.port = free_port()
        self.webui = free_port()
        self.worker_webui = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.master: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None

    def env(self) -> dict:
        return {
            **os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(self.workdir / "work"),
            "SPARK_LOG_DIR": str(self.workdir / "logs"), "PYSPARK_PYTHON": sys.executable,
            # the master's REST submission server would take the fixed port 6066
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }

    def __enter__(self) -> "SparkStandalone":
        master_log, worker_log = self.workdir / "master.log", self.workdir / "worker.log"
        self.master = subprocess.Popen(
            [str(self.spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(self.webui)],
            env=self.env(), stdout=master_log.open("w"), stderr=subprocess.STDOUT,
        )
        # the worker retries until the master is up: start both JVMs at once
        self.worker = subprocess.Popen(
            [str(self.spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--cores", "1", "--memory", "1g", "--webui-port", str(self.worker_webui), self.master_url],
            env=self.env(), stdout=worker_log.open("w"), stderr=subprocess.STDOUT,
        )
        wait_for(lambda: "Successfully registered with master" in worker_log.read_text(), 90,
                 "spark worker", self.worker, worker_log)
        return self

    def __exit__(self, *exc) -> None:
        stop(self.worker)
        stop(self.master)

    def executor_logs(self) -> str:
        """stdout + stderr of every executor the worker ran."""
        work = self.workdir / "work"
        return "\n".join(p.read_text(errors="replace") for p in sorted(work.rglob("std*")) if p.is_file())
