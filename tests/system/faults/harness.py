"""The fault harness: data that keeps flowing, Spark jobs that get killed, and the check.

Shared by the CI fault module (``tests/system/faults/test_faults.py``) and the soak script
(``python -m tests.system.faults.soak``), so both prove the same thing:

* :class:`FlowingProducer` writes to every partition from a thread with an idempotent
  producer, plus a transactional producer whose transactions alternate between commit
  and abort (the aborted values are remembered: none may ever reach the table);
* :class:`KillingSubmit` is ``LocalSparkSubmit`` that gets killed in one *window*: a
  failpoint (the process SIGKILLs itself at a named step) or a real ``kill -9`` of the
  spark-submit process tree (JVM + Python driver + Python workers) from a timer thread;
* :func:`check_table` compares the table with what the broker holds (kafka-python,
  read_committed): every committed record below the committed offsets is present
  exactly once, nothing aborted or beyond the offsets is present.

Example::

    >>> with FlowingProducer(config, topic, partitions=3):              # doctest: +SKIP
    ...     Ingestion(cfg, KillingSubmit("after_stage")).run(RunIdentity("r1"))
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psutil
from confluent_kafka import KafkaException, Producer

from airflow_eo.core.errors import AirflowEoError
from airflow_eo.faults import ENV as FAILPOINTS_ENV
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.submit.spark_submit import LocalSparkSubmit
from airflow_eo.spec import Transform
from tests.helpers import broker_records, committed_offsets, read_table

log = logging.getLogger(__name__)

# Windows: failpoints (airflow_eo/faults.py) at the protocol's steps, real kill -9 of the process tree
# for the others. WINDOWS are CI's (tests/system/faults/test_faults.py); the soak kills at every step.
FAILPOINT_WINDOWS = {w: w for w in ("before_read", "after_stage", "before_commit", "during_commit", "after_commit",
                                     # a fan-out's, after each sink's commit but the last; a batch's with dead
                                     # letters, after its main commit and before theirs
                                     "between_sink_commits", "before_dead_letters")}
TREE_WINDOWS = ("reading", "random")
WINDOWS = ("reading", "after_stage", "during_commit", "random", "after_commit")
STEP_WINDOWS = ("before_read", "reading", "after_stage", "before_commit", "during_commit", "random", "after_commit")
TRANSFORM = Transform(sql="SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS value FROM source")
# C1-only JIT and the serial GC: a few seconds less JVM start per spark-submit; these
# jobs are too short for the optimising compiler to pay off.
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "512m",
              "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


class Flowing:
    """A thread that writes to Kafka from ``with`` until :meth:`stop` (subclasses write in ``_run``)."""

    name = "flowing"

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


class FlowingProducer(Flowing):
    """Writes to ``partitions`` partitions until stopped: idempotent records and transactions.

    Every 4th transaction is aborted (and its producer replaced); their values (``abort-…``) are kept
    in ``aborted``.
    Survives a broker restart: a transactional producer that errors is replaced, and a
    transaction whose outcome is unknown is neither counted committed nor aborted.
    """

    name = "flowing-producer"

    def __init__(self, config: dict, topic: str, partitions: int, rate: float = 150.0):
        self.config, self.topic, self.partitions, self.rate = config, topic, partitions, rate
        self.aborted: set[str] = set()
        self.sent = 0
        super().__init__()

    def _tx_producer(self) -> Producer | None:
        try:
            producer = Producer({**self.config, "transactional.id": f"fault-tx-{time.monotonic_ns()}",
                                 "transaction.timeout.ms": 20000})
            producer.init_transactions(20)
            return producer
        except KafkaException as exc:
            log.warning("transactional producer not ready (%s); retrying", exc)
            return None

    def _plain(self) -> Producer:
        return Producer({**self.config, "enable.idempotence": True, "linger.ms": 5})

    def _run(self) -> None:
        plain = self._plain()
        tx = None
        seq = 0
        while not self._stop.is_set():
            try:
                for _ in range(10):
                    plain.produce(self.topic, value=f"idem-{seq}".encode(), partition=seq % self.partitions)
                    seq += 1
                plain.poll(0)
            except KafkaException as exc:
                # noida-db forgets producer ids and sequences across a restart, which is fatal
                # to an idempotent producer (Kafka keeps them); unacknowledged records are simply
                # not in the broker, and the check reads the broker.
                log.warning("idempotent producer failed (%s); replacing it", exc)
                plain = self._plain()
            tx = tx or self._tx_producer()
            if tx is not None:
                tx = self._transaction(tx, seq)
                seq += 5
            self.sent = seq
            self._stop.wait(15 / self.rate)
        try:
            plain.flush(30)
        except KafkaException as exc:  # a restart just before the stop: as above, the check reads the broker
            log.warning("idempotent producer failed at its last flush (%s)", exc)

    def _transaction(self, tx: Producer, seq: int) -> Producer | None:
        abort = (seq // 5) % 4 == 3
        values = [f"{'abort' if abort else 'tx'}-{seq + i}" for i in range(5)]
        try:
            tx.begin_transaction()
            for i, v in enumerate(values):
                tx.produce(self.topic, value=v.encode(), partition=(seq + i) % self.partitions)
            if abort:
                # noida-db's read_committed fetch from an offset after an aborted transaction still lists
                # that transaction as aborted, so every client (librdkafka and kafka-python alike) skips the
                # same producer's later, committed records; Apache Kafka lists only aborted transactions
                # that end at or after the fetch offset. Not flushed first, the queued records are mostly
                # dropped by the abort, but on a loaded machine librdkafka sends them before the abort
                # (linger.ms): the producer that aborted is not used again, so no committed record of
                # this flow shares a producer id with an aborted one.
                tx.abort_transaction(20)
                self.aborted.update(values)
                return None
            tx.commit_transaction(20)
            return tx
        except KafkaException as exc:  # broker restarting: outcome unknown, start a new producer
            log.warning("transaction failed (%s); replacing the producer", exc)
            return None


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_tree(pid: int) -> bool:
    """``kill -9`` spark-submit and every process under it (JVM, Python driver, workers)."""
    procs = process_tree(pid)
    alive = False
    for p in procs:
        try:
            p.kill()
            alive = True
        except psutil.NoSuchProcess:
            pass
    return alive


def has_python_worker(pid: int) -> bool:
    """A Python task worker (``-m airflow_eo.driver.daemon pyspark.worker``, or pyspark's own
    ``-m pyspark.daemon pyspark.worker``, which reads Kafka) is up under spark-submit; the
    ``pyspark.sql.worker.*`` daemons only look up and plan a data source."""
    for p in process_tree(pid)[1:]:
        try:
            if p.cmdline()[-2:] in (["pyspark.daemon", "pyspark.worker"], ["airflow_eo.driver.daemon", "pyspark.worker"]):
                log.debug("python worker up: %s", " ".join(p.cmdline()))
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def driver_started(table_uri: str, attempt_id: str, pid: int | None = None) -> bool:
    """Whether the attempt's driver has started (its marker names a driver process; ``pid``: that one)."""
    from airflow_eo.table.staging import StagingArea
    from airflow_eo.table.storage import TableLocation

    try:
        marker = StagingArea(TableLocation.of(table_uri)).read_marker(attempt_id)
    except OSError:
        return False
    return marker is not None and marker.driver_pid != 0 and (pid is None or marker.driver_pid == pid)


class KillingSubmit(LocalSparkSubmit):
    """spark-submit that dies in ``window``; ``killed`` says whether it really did.

    ``reading``: kill -9 of the tree moments after the reading starts — the first Python worker
    (Spark tasks read Kafka in Python workers), or, for a batch the driver reads itself
    (``driver_read_max_offsets``), the driver's start recorded in the attempt's marker;
    ``random``: kill -9 at a random time; the other windows are failpoints inside the driver.
    """

    # A random kill lands within the first 8 s: an idle 2-core machine runs a small job in
    # ~8-9 s (JVM start included), a loaded one slower, so the kill lands mid-job either way.
    def __init__(self, window: str | None, rng: random.Random | None = None, max_delay: float = 8.0):
        env = {FAILPOINTS_ENV: FAILPOINT_WINDOWS[window]} if window in FAILPOINT_WINDOWS else {}
        super().__init__(master="local[2]", conf=SPARK_CONF, extra_env=env, timeout=300)
        self.window, self.rng, self.max_delay = window, rng or random.Random(), max_delay
        self.killed = False
        self._done = threading.Event()
        self._attempt = None

    def submit(self, attempt, secrets) -> None:
        self._attempt = attempt
        # a JVM killed with -9 runs no shutdown hook and leaves its Spark scratch dirs behind:
        # this job's go in a directory of its own, removed once the job is gone
        scratch = tempfile.mkdtemp(prefix="airflow-eo-killed-")
        opts = " ".join(filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), f"-Djava.io.tmpdir={scratch}"]))
        self.extra_env = {**self.extra_env, "SPARK_LOCAL_DIRS": scratch, "SPARK_SUBMIT_OPTS": opts}
        timer = None
        if self.window in TREE_WINDOWS:
            timer = threading.Thread(target=self._killer, daemon=True)
            timer.start()
        try:
            super().submit(attempt, secrets)
        finally:
            self._done.set()
            if timer is not None:
                timer.join(5)
            code = self.process.returncode if self.process else None
            self.killed = self.killed or (self.window in FAILPOINT_WINDOWS and code not in (0, None))
            shutil.rmtree(scratch, ignore_errors=True)

    def _killer(self) -> None:
        while self.process is None and not self._done.is_set():
            time.sleep(0.05)
        pid = self.process.pid if self.process else None
        if pid is None:
            return
        if self.window == "reading":
            from airflow_eo.driver.tables import attempts_of, needs_spark

            in_driver = not needs_spark([a for a, _ in attempts_of(self._attempt)])
            while not self._done.is_set() and not (
                    driver_started(self._attempt.table_uri, self._attempt.attempt_id) if in_driver
                    else has_python_worker(pid)):
                time.sleep(0.02)
            delay = self.rng.uniform(0.0, 0.3 if in_driver else 0.6)  # a small batch reads in well under 1 s
        else:
            delay = self.rng.uniform(min(1.0, self.max_delay / 4), self.max_delay)
        if not self._done.wait(delay):
            self.killed = kill_tree(pid)


@dataclass
class Check:
    """One comparison of the table with the broker."""

    visible: int  # committed records the broker holds
    expected: int  # of those, below the table's committed offsets
    in_table: int
    lost: list = field(default_factory=list)
    duplicated: dict = field(default_factory=dict)
    beyond_offsets: list = field(default_factory=list)  # in the table at/after committed offsets
    not_in_broker: list = field(default_factory=list)  # aborted or phantom rows
    aborted_in_table: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.beyond_offsets or self.not_in_broker
                    or self.aborted_in_table)

    def summary(self) -> str:
        return (f"expected={self.expected} in_table={self.in_table} lost={len(self.lost)} "
                f"duplicated={len(self.duplicated)} beyond={self.beyond_offsets[:5]} "
                f"not_in_broker={self.not_in_broker[:5]} aborted={self.aborted_in_table[:5]}")


def check_table(table_uri: str, ingest_id: str, topic: str, partitions: int, bootstrap: str,
                aborted: set[str]) -> Check:
    """Table vs broker. Offsets equal highest present + 1 "respecting gaps" follows from
    lost == [] and beyond_offsets == []: no visible record lies between the two."""
    visible = broker_records(bootstrap, topic)
    if not os.path.isdir(os.path.join(table_uri, "_delta_log")) or not os.listdir(os.path.join(table_uri, "_delta_log")):
        return Check(visible=len(visible), expected=0, in_table=0)  # no commit yet
    committed = committed_offsets(table_uri, ingest_id, topic, partitions)
    table = read_table(table_uri, ["topic", "partition", "offset", "value"])
    rows = list(zip(table["topic"].to_pylist(), table["partition"].to_pylist(),
                    table["offset"].to_pylist(), table["value"].to_pylist()))
    counts = Counter((t, p, o) for t, p, o, _ in rows)
    below = {k for k in visible if committed.get(k[1]) is not None and k[2] < committed[k[1]]}
    return Check(
        visible=len(visible), expected=len(below), in_table=len(rows),
        lost=sorted(below - set(counts)),
        duplicated={k: n for k, n in counts.items() if n > 1},
        beyond_offsets=sorted(k for k in counts if committed.get(k[1]) is None or k[2] >= committed[k[1]]),
        not_in_broker=sorted(k for t, p, o, v in rows if (k := (t, p, o)) not in visible
                             or visible[k].decode() != _text(v)),
        aborted_in_table=sorted(_text(v) for *_, v in rows if _text(v) in aborted),
    )


def _text(value) -> str:
    """A table's value column as text: a cast string, or the Kafka bytes a projection keeps."""
    return value.decode() if isinstance(value, (bytes, bytearray)) else value


@dataclass
class Outcome:
    window: str | None
    killed: bool
    result: Any  # IngestResult; a fan-out's FanOutResult; a CLI run's summary (paths.CliResult); None if it failed
    error: BaseException | None
    seconds: float


def run_once(config: IngestConfig | None, run_key: str, window: str | None, rng: random.Random,
             max_delay: float = 8.0, loop=None) -> Outcome:
    """One ingestion run whose Spark job is killed in ``window`` (None: not killed; ``random``: within
    ``max_delay`` seconds of its start). ``loop(submitter)``: what runs instead of ``Ingestion(config, …)``
    (a fan-out's loop)."""
    submit = KillingSubmit(window, rng, max_delay=max_delay)
    started = time.monotonic()
    try:
        runner = loop(submit) if loop is not None else Ingestion(config, submit)
        result, error = runner.run(RunIdentity(run_key=run_key)), None
    except AirflowEoError as exc:
        result, error = None, exc
    return Outcome(window, submit.killed, result, error, time.monotonic() - started)


def ingest_config(table_uri: str, ingest_id: str, topic: str, bootstrap: str) -> IngestConfig:
    return IngestConfig(table_uri=table_uri, ingest_id=ingest_id, topics=[topic],
                        kafka_config={"bootstrap.servers": bootstrap}, transform=TRANSFORM)


@dataclass
class Tally:
    """Kills per window and the last check, for the soak's table."""

    trials: int = 0
    kills: Counter = field(default_factory=Counter)
    runs: int = 0
    failures: list = field(default_factory=list)

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())


def kill_chain(config, run_key: str, windows: list[str], rng: random.Random,
               tally: Tally, checker, until_committed: bool = False) -> list[Outcome]:
    """Retry one run key, killing each attempt in the next window, then once more unharmed.

    ``config``: an :class:`IngestConfig` run through spark-submit (:func:`run_once`), or any
    ``run(run_key, window, rng) -> Outcome`` (another way a batch runs). After every run the table
    is checked (``checker() -> Check``). The last window is normally ``after_commit``, so the
    final rerun must find the batch committed without starting Spark. ``until_committed``: the
    windows after a run that committed (a kill that came too late) are left for another run key —
    they would only find the batch committed.
    """
    run = config if callable(config) else (lambda key, window, r: run_once(config, key, window, r))
    outcomes: list[Outcome] = []
    for window in [*windows, None]:
        if until_committed and window is not None and outcomes and outcomes[-1].result is not None \
                and outcomes[-1].result.status in ("committed", "already_committed"):
            continue
        outcome = run(run_key, window, rng)
        tally.runs += 1
        if outcome.killed:
            tally.kills[window] += 1
        outcomes.append(outcome)
        check = checker()
        log.info("run %s window=%s killed=%s status=%s error=%s %.1fs | %s", run_key, window, outcome.killed,
                 outcome.result.status if outcome.result else None,
                 type(outcome.error).__name__ if outcome.error else None, outcome.seconds, check.summary())
        if not check.ok:
            tally.failures.append((run_key, window, check.summary()))
    tally.trials += 1
    return outcomes
