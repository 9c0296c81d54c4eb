"""The embedded broker: noida-db, a Kafka-protocol broker in one binary from PyPI.

For the demo and the tests only; production runs Apache Kafka (see docker-compose.yml).
It is started as its own process on 127.0.0.1 with a fresh data directory and stopped
by PID (SIGTERM, which makes it save state; SIGKILL after a timeout). The ``noida-db``
Python wrapper is bypassed on purpose: it does not forward SIGTERM and would orphan the
broker.

Example::

    >>> with EmbeddedBroker() as broker:                 # doctest: +SKIP
    ...     broker.bootstrap_servers
    '127.0.0.1:40123'
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from airflow_eo.submit.connect_server import die_with_parent, free_port


def broker_binary() -> str:
    try:
        import noida_db
    except ImportError:
        raise FileNotFoundError("the embedded broker needs the demo extra: pip install 'airflow-eo[demo]'") from None

    path = os.path.join(os.path.dirname(noida_db.__file__), "noida-db")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"the noida-db binary is missing at {path}: pip install noida-db")
    return path


class EmbeddedBroker:
    """A noida-db broker bound to 127.0.0.1 on a free port."""

    def __init__(self, data_dir: str | None = None, port: int | None = None):
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="airflow-eo-broker-")
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap_servers}

    def start(self, timeout: float = 20.0) -> "EmbeddedBroker":
        if self.process is not None and self.process.poll() is None:
            return self  # already running: a second process would be orphaned when this one stops
        log_file = open(os.path.join(self.data_dir, "broker.log"), "ab")
        self.process = subprocess.Popen(
            [broker_binary(), "start", "--data-dir", self.data_dir, "--host", "127.0.0.1",
             "--only", "kafka", "--kafka-port", str(self.port)],
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent(os.getpid()),  # a killed parent (test run, demo) takes it along
        )
        log_file.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"noida-db exited with {self.process.returncode}; see {self.data_dir}/broker.log")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"noida-db did not listen on {self.bootstrap_servers} within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID (the broker saves its state), SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
