"""A local S3 stand-in for tests: ``moto_server`` (moto[server], from PyPI) on 127.0.0.1, one bucket.

The plugin's ``delta_table`` fixture puts an ``s3://`` table there when a test asks for one; the
deltalake storage options and the Airflow ``aws`` connection fields that reach it come with it.
Commits there are atomic through ``conditional_put=etag`` (moto answers conditional puts), as on S3.

Example::

    >>> with MotoS3(workdir) as s3:                                   # doctest: +SKIP
    ...     s3.storage_options()["AWS_ENDPOINT_URL"]
    'http://127.0.0.1:40217'
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from airflow_eo.submit.connect_server import die_with_parent, free_port

KEY, SECRET, REGION = "test-key", "test-secret", "us-east-1"  # moto accepts any: no real credential


def wait_for(check, timeout: float, what: str, process: subprocess.Popen | None = None, log: Path | None = None):
    """Poll ``check()`` until it is true; fail naming ``what`` (with the end of its ``log``)."""
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
    """SIGTERM by PID, SIGKILL after ``grace`` seconds."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def moto_server_binary() -> str:
    found = shutil.which("moto_server", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                              os.environ.get("PATH", "")]))
    if found is None:
        raise FileNotFoundError("moto_server is not installed: pip install 'airflow-eo[testing]' (moto[server])")
    return found


class MotoS3:
    """``moto_server`` with one bucket, plus the deltalake storage options to reach it."""

    def __init__(self, workdir: Path, bucket: str = "airflow-eo-tables"):
        self.workdir = Path(workdir)
        self.bucket = bucket
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "MotoS3":
        log = self.workdir / "moto.log"
        with log.open("w") as out:
            self.process = subprocess.Popen([moto_server_binary(), "-H", "127.0.0.1", "-p", str(self.port)],
                                            stdout=out, stderr=subprocess.STDOUT,
                                            preexec_fn=die_with_parent(os.getpid()))
        wait_for(self._up, 30, "moto_server", self.process, log)
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                     region_name=REGION).create_bucket(Bucket=self.bucket)
        return self

    def _up(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=1).read()
            return True
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        stop(self.process)

    def storage_options(self) -> dict[str, str]:
        """deltalake storage options of a table in the bucket (atomic commits: conditional put)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true", "conditional_put": "etag"}

    def connection_fields(self) -> tuple[str, str, dict]:
        """What a user puts in an Airflow ``aws`` connection: login, password, extras."""
        return KEY, SECRET, {"endpoint_url": self.endpoint, "region_name": REGION, "conditional_put": "etag"}
