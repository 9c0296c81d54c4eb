"""Real servers the scale tests start on 127.0.0.1 and stop by PID.

* :class:`MotoS3` — ``moto_server`` (moto[server] from PyPI) as a local S3 endpoint;
* :class:`SparkStandalone` — a Spark standalone master and one worker started with the
  installed pyspark's ``spark-class``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str, process: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            break
        if check():
            return
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not come up within {timeout}s\n{tail}")


def stop(process: subprocess.Popen | None, grace: float = 10.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class MotoS3:
    """``moto_server`` with one bucket, plus the deltalake storage options to reach it."""

    def __init__(self, workdir: Path, bucket: str = "airflow-eo-tables"):
        self.workdir = workdir
        self.bucket = bucket
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "MotoS3":
        log = self.workdir / "moto.log"
        self.process = subprocess.Popen(
            [str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log.open("w"), stderr=subprocess.STDOUT,
        )
        wait_for(self._up, 30, "moto_server", self.process, log)
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="test-key",
                     aws_secret_access_key="test-secret", region_name="us-east-1").create_bucket(Bucket=self.bucket)
        return self

    def _up(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=1).read()
            return True
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        stop(self.process)

    def connection_fields(self) -> tuple[str, str, dict]:
        """What a user puts in an Airflow ``aws`` connection: login, password, extras."""
        return "test-key", "test-secret", {"endpoint_url": self.endpoint, "region_name": "us-east-1",
                                            "conditional_put": "etag"}


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
