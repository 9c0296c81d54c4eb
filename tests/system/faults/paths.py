"""The soak's four ways a batch runs, each with its own table, its kills and its check.

* ``driver`` — spark-submit whose driver reads a small batch itself (``driver_read_max_offsets``,
  a projection of the Kafka columns): no SparkContext, no Python worker;
* ``spark`` — spark-submit whose Spark tasks read (a transform Spark must run);
* ``connect`` — ``airflow-eo ingest --remote`` against a warm Spark Connect server started here:
  the client process is the attempt's driver (it plans, commits, verifies), the server's tasks read
  and stage; it is killed with ``kill -9``, at failpoints (``before_submit`` too: the client is a
  process of its own) and by killing the server mid-read, which is then started again;
* ``merge`` — a merge table (``write_mode="merge"``) through spark-submit, fed by a flowing producer
  of upserts and tombstones (committed and aborted transactions among them), checked against the
  plain-Python model of the broker's records (tests/changes.py).

The three append paths read one flowing topic (:class:`~tests.system.faults.harness.FlowingProducer`)
into tables of their own; each table is compared with the broker after every run.

Example::

    >>> path = spark_submit_path("spark", config, checker)            # doctest: +SKIP
    >>> kill_chain(path.run, "soak-1", ["reading", "after_commit"], rng, path.tally, path.check)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from confluent_kafka import KafkaException

from airflow_eo.attempt import Env
from airflow_eo.faults import ENV as FAILPOINTS_ENV
from airflow_eo.submit.connect_server import ConnectServer
from tests.changes import ChangeProducer, assert_model_holds
from tests.helpers import visible_records
from tests.system.faults.harness import (
    FAILPOINT_WINDOWS, STEP_WINDOWS, Check, Flowing, Outcome, Tally, driver_started, kill_tree, run_once,
)

log = logging.getLogger(__name__)

AIRFLOW_EO = os.path.join(os.path.dirname(sys.executable), "airflow-eo")
# a projection of the Kafka columns: the direct path (the reading task writes the Parquet itself)
PROJECTION = "SELECT topic, partition, offset, timestamp, value FROM source"
CONNECT_WINDOWS = ("before_submit", *STEP_WINDOWS, "server")


@dataclass
class Path:
    """One way a batch runs: how a run is made (and killed), its windows, its table's check."""

    name: str
    run: Callable[[str, str | None, random.Random], Outcome]
    windows: tuple[str, ...]
    check: Callable[[], Check | "ModelCheck"]
    tally: Tally = field(default_factory=Tally)
    final: object = None  # the check after the drain run

    def chain_windows(self, rng: random.Random) -> list[str]:
        """This trial's windows: every one once, the windows killed least so far first (a trial ends
        at the first run that commits: a kill that came too late), then ``random`` (the one kill that
        can come too late: it ends the trial, so it goes where it skips the least), after_commit last
        (its rerun must then find the batch committed without starting Spark)."""
        middle = [w for w in self.windows if w not in ("random", "after_commit")]
        rng.shuffle(middle)
        middle.sort(key=lambda w: self.tally.kills[w])  # stable: a random order among equals
        return [*middle, *(["random"] if "random" in self.windows else []), "after_commit"]


def spark_submit_path(name: str, config, check: Callable[[], Check], max_delay: float = 8.0) -> Path:
    """A path through spark-submit; ``max_delay``: when a random kill lands at the latest (a job that
    reads a small batch in its driver is over in ~3 s on an idle machine, one with Spark tasks in ~10 s)."""
    return Path(name, lambda key, window, rng: run_once(config, key, window, rng, max_delay), STEP_WINDOWS, check)


@dataclass
class CliResult:
    """What ``airflow-eo ingest --json`` printed."""

    status: str
    rows: int


class ConnectClients:
    """``airflow-eo ingest --remote`` runs against a Spark Connect server of this object's own,
    killed in a window: ``kill -9`` of the client while the server reads (``reading``, once the
    attempt's marker names the client as its driver) or at a random moment (``random``), a
    failpoint in the client, or ``server``: the server killed while it reads for the client, then
    started again (on the same port) for the next run."""

    def __init__(self, table_uri: str, ingest_id: str, topic: str, kafka_config: dict, log_dir: str):
        self.table_uri, self.ingest_id, self.topic, self.kafka_config = table_uri, ingest_id, topic, kafka_config
        self.log_dir = log_dir
        self.server: ConnectServer | None = None
        self.server_kills = 0

    def start_server(self, port: int | None = None) -> None:
        # started from the soak's main thread: the JVM dies with the thread that forked it
        self.server = ConnectServer(port=port, master="local[2]", conf={"spark.sql.shuffle.partitions": "2"},
                                    log_file=os.path.join(self.log_dir, "connect-server.log")).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def _command(self, run_key: str) -> list[str]:
        return [AIRFLOW_EO, "ingest", "--table", self.table_uri, "--ingest-id", self.ingest_id, "--topics", self.topic,
                "--remote", self.server.url, "--run-key", run_key, "--transform-sql", PROJECTION, "--json",
                "--driver-read-max-offsets", "0"]  # the server's tasks read: the warm path itself

    def __call__(self, run_key: str, window: str | None, rng: random.Random) -> Outcome:
        env = {**os.environ, Env.KAFKA_CONFIG: json.dumps(self.kafka_config)}
        if window in FAILPOINT_WINDOWS or window == "before_submit":
            env[FAILPOINTS_ENV] = window
        started = time.monotonic()
        proc = subprocess.Popen(self._command(run_key), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        killed = False
        if window in ("reading", "server", "random"):
            killed = self._kill(proc, window, rng)
        out, err = proc.communicate(timeout=900)
        if window in FAILPOINT_WINDOWS or window == "before_submit":
            killed = proc.returncode == -9
        if window == "server" and killed:
            self.start_server(self.server.port)  # the next run finds a server again, warm
        result = error = None
        if proc.returncode == 0:
            summary = json.loads(out.strip().splitlines()[-1])
            result = CliResult(summary["status"], summary.get("rows") or 0)
        else:
            error = RuntimeError((err.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300])
        return Outcome(window, killed, result, error, time.monotonic() - started)

    def _kill(self, proc: subprocess.Popen, window: str, rng: random.Random) -> bool:
        if window == "random":  # a warm client's whole small batch takes ~1-2 s, start-up included
            deadline = time.monotonic() + rng.uniform(0.2, 1.2)
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        else:  # the client's attempt has started: the server is reading for it
            attempts = os.path.join(self.table_uri, "_airflow_eo", "attempts")
            while proc.poll() is None and not any(driver_started(self.table_uri, name.split(".")[0], proc.pid)
                                                  for name in (os.listdir(attempts) if os.path.isdir(attempts) else [])):
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.4 if window == "server" else 0.8))  # a small batch reads in ~1 s
        if proc.poll() is not None:
            return False
        if window == "server":
            self.server.kill()
            self.server_kills += 1
            return True
        return kill_tree(proc.pid)


class ChangeFlow(Flowing):
    """Upserts and tombstones of keys 0..``keys`` written until stopped, with a transaction every few
    rounds (every other one aborted); survives a broker restart (a failed producer is replaced)."""

    name = "flowing-changes"

    def __init__(self, config: dict, topic: str, keys: int = 400, rate: float = 4.0):
        self.config, self.topic, self.keys, self.rate = config, topic, keys, rate
        self.changes = ChangeProducer(config, topic)
        super().__init__()

    def _run(self) -> None:
        rng, n = random.Random(11), 0
        while not self._stop.is_set():
            n += 1
            try:
                self.changes.write(rng.sample(range(self.keys), 12))
                if n % 3 == 0:
                    self.changes.delete(rng.sample(range(self.keys), 3))
                if n % 5 == 0:
                    self.changes.transaction(writes=rng.sample(range(self.keys), 5), deletes=rng.sample(range(self.keys), 2),
                                             abort=n % 10 == 0)
                self.changes.flush()
            except KafkaException as exc:  # broker restarting; the model reads what the broker holds
                log.warning("change producer failed (%s); replacing it", exc)
                clock, counter = self.changes.clock, self.changes.n
                self.changes = ChangeProducer(self.config, self.topic)
                self.changes.clock, self.changes.n = clock, counter
            self._stop.wait(1 / self.rate)
        self.changes.flush()


@dataclass
class ModelCheck:
    """A merge table against the model of the broker's change records (tests/changes.py)."""

    visible: int  # change records the broker holds
    keys: int  # rows (one per key) in the table
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem

    def summary(self) -> str:
        return f"records={self.visible} keys={self.keys} {self.problem or 'model holds'}"


def check_model(table_uri: str, ingest_id: str, bootstrap: str, topic: str) -> ModelCheck:
    visible = sum(1 for _ in visible_records(bootstrap, topic))
    if not os.path.isdir(os.path.join(table_uri, "_delta_log")):
        return ModelCheck(visible, 0)  # no commit yet
    try:
        return ModelCheck(visible, assert_model_holds(table_uri, ingest_id, bootstrap, topic))
    except AssertionError as exc:
        return ModelCheck(visible, 0, str(exc)[:500] or "the table differs from the model")
