"""The warm path's faults: the client killed mid-batch, the server killed mid-batch, two clients
racing, a server on another version, and `airflow-eo connect-server` itself (real broker, real
Spark Connect servers, real Delta tables)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
from pyspark.sql import SparkSession

from airflow_eo.attempt import Env
from airflow_eo.compat import release_server_session
from airflow_eo.core.errors import ConfigError, SparkJobError, SparkUnavailableError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.submit.connect import ConnectSubmitter, check_version, detach
from airflow_eo.submit.connect_server import ConnectServer, free_port
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.storage import TableLocation
from tests.helpers import assert_exactly_once, duplicates, new_topic, produce, read_table

AIRFLOW_EO = os.path.join(os.path.dirname(sys.executable), "airflow-eo")


def port_to_serve_again() -> int:
    """A free port below the kernel's ephemeral range, for a test that kills a server and starts the
    next on its port: no other process's ``bind(0)`` or outgoing connection takes it in between
    (seen with tests side by side: another worker's Spark listened on the freed port, the next
    server could not bind it)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for port in random.sample(range(10_000, low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in 10000..{low}")
SQL = "SELECT topic, partition, offset, value FROM source"


def cli_ingest(url: str, table_uri: str, topic: str, kafka_config: dict, run_key: str) -> subprocess.Popen:
    """A client whose batch the server reads and stages (a batch this small would be read by the
    client itself otherwise: its death then stops its read, tests/integration/test_killed_attempts.py)."""
    return subprocess.Popen(
        [AIRFLOW_EO, "ingest", "--table", table_uri, "--ingest-id", "warm", "--topics", topic,
         "--remote", url, "--run-key", run_key, "--transform-sql", SQL, "--json", "--driver-read-max-offsets", "0"],
        env={**os.environ, Env.KAFKA_CONFIG: f'{{"bootstrap.servers": "{kafka_config["bootstrap.servers"]}"}}'},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_driver(table_uri: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until the attempt marker names ``proc`` as the attempt's driver (or ``proc`` ended)."""
    attempts = os.path.join(table_uri, "_airflow_eo", "attempts")
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        for name in os.listdir(attempts) if os.path.isdir(attempts) else []:
            try:
                with open(os.path.join(attempts, name)) as f:
                    if f'"driver_pid": {proc.pid}' in f.read():
                        return
            except OSError:
                continue
        time.sleep(0.02)


def staged_dirs(table_uri: str) -> set[str]:
    loc = TableLocation.of(table_uri)
    return {d.base_name for d in loc.list_dirs(table_uri) if d.base_name.startswith("b")}


def test_client_killed_mid_batch_ten_times_under_live_produce(broker, kafka_config, connect_server, table_uri):
    topic = new_topic(kafka_config, 3)
    stop, produced = threading.Event(), []

    def keep_producing():
        n = 0
        while not stop.is_set():
            produce(kafka_config, topic, 300, partitions=3, start=n)
            n += 300
            produced.append(n)
            time.sleep(0.2)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    rng, kills = random.Random(7), 0
    try:
        for i in range(10):
            proc = cli_ingest(connect_server.url, table_uri, topic, kafka_config, f"warm-{i}")
            wait_for_driver(table_uri, proc)  # the client is inside its attempt: reading, staging or committing
            time.sleep(rng.uniform(0.0, 0.25))  # a client commits a batch this small within ~0.3 s of recording its attempt
            if proc.poll() is None:
                proc.kill()  # kill -9 of the client: the attempt's driver
                kills += 1
            proc.wait()
            again = cli_ingest(connect_server.url, table_uri, topic, kafka_config, f"warm-{i}")  # the retry
            out, err = again.communicate(timeout=300)
            assert again.returncode == 0, err[-2000:]
    finally:
        stop.set()
        producer.join()
    assert kills >= 5, f"only {kills} of 10 clients were still running when killed: the test did not test"
    table = read_table(table_uri, ["topic", "partition", "offset", "value"])
    assert duplicates(table) == {}
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic], ingest_id="warm") == table.num_rows
    # the killed clients' staged files are gone: only directories the table references remain
    final = cli_ingest(connect_server.url, table_uri, topic, kafka_config, "warm-final")
    final.communicate(timeout=300)
    assert final.returncode == 0
    referenced = {path.split("/", 1)[0] for path in Ledger.open(table_uri).file_paths()}
    assert staged_dirs(table_uri) <= referenced


def test_server_killed_mid_batch_fails_fast_and_the_retry_commits_once(broker, kafka_config, tmp_path):
    topic = new_topic(kafka_config, 2)
    for start in range(0, 200_000, 50_000):  # in chunks: the producer's local queue holds 100k
        produce(kafka_config, topic, 50_000, partitions=2, start=start)
    port, table_uri = port_to_serve_again(), str(tmp_path / "table")
    config = IngestConfig(table_uri=table_uri, ingest_id="warm", topics=[topic], kafka_config=kafka_config,
                          max_offsets_per_task=20_000)
    server = ConnectServer(port=port, master="local[2]", log_file=str(tmp_path / "server1.log")).start()
    scratch = server.scratch_dir
    errors: list[BaseException] = []

    def run():
        try:
            Ingestion(config, ConnectSubmitter(server.url)).run(RunIdentity("server-dies"))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    # the read is running on the server once its first task writes: 10 tasks of 20,000 offsets on
    # two cores, so the kill lands with most of them still to run (a fixed sleep raced a fast batch)
    deadline = time.monotonic() + 120
    while not (os.path.isdir(table_uri) and staged_dirs(table_uri)) and worker.is_alive():
        assert time.monotonic() < deadline, "the batch never started writing"
        time.sleep(0.05)
    assert worker.is_alive(), f"the batch ended before the server could be killed: {errors}"
    # Spark's own scratch is inside the server's directory, so the kill leaves none in /tmp
    assert any(n.startswith("blockmgr-") for n in os.listdir(os.path.join(scratch, "local")))
    killed_at = time.monotonic()
    server.kill()
    worker.join(120)
    assert not worker.is_alive(), "the client hung after the server died"
    took = time.monotonic() - killed_at
    assert len(errors) == 1 and isinstance(errors[0], SparkUnavailableError), errors
    assert took < 30, f"the server's death surfaced only after {took:.0f}s"
    assert "Retry when the server is back" in str(errors[0])
    assert not os.path.exists(os.path.join(table_uri, "_delta_log")), "nothing may be committed"
    assert scratch and not os.path.exists(scratch), "the killed server's scratch directory is left behind"

    with ConnectServer(port=port, master="local[2]", log_file=str(tmp_path / "server2.log")) as again:
        result = Ingestion(config, ConnectSubmitter(again.url)).run(RunIdentity("server-dies"))
        assert result.status == "committed" and result.rows == 200_000
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic], ingest_id="warm") == 200_000


def test_a_server_on_another_version_is_refused_before_anything_runs(connect_server):
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(connect_server.url).create()
    try:
        check_version(spark, connect_server.url + "/;other")  # this server: the same version, accepted
        spark.conf.set("spark.airflow_eo.version", "0.0.1")  # as a server of another release declares it
        with pytest.raises(ConfigError, match="runs airflow-eo 0.0.1, this client runs"):
            check_version(spark, connect_server.url + "/;older")
    finally:
        release_server_session(spark)
        detach(spark)


def test_an_unreachable_server_is_a_retryable_error_within_seconds(kafka_config, tmp_path):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 10, partitions=1)
    # a batch this small is read by the client itself (driver_read_max_offsets), which attaches to the server first
    config = IngestConfig(table_uri=str(tmp_path / "t"), ingest_id="warm", topics=[topic], kafka_config=kafka_config)
    started = time.monotonic()
    with pytest.raises(SparkUnavailableError, match="Spark Connect server sc://127.0.0.1"):
        Ingestion(config, ConnectSubmitter(f"sc://127.0.0.1:{free_port()}")).run(RunIdentity("nobody-home"))
    assert time.monotonic() - started < 30
    assert Ledger.open(str(tmp_path / "t")).exists is False


def test_connect_server_command_binds_loopback_and_stops_on_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen([AIRFLOW_EO, "connect-server", "--port", str(port), "--master", "local[1]"],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "server.log", "w"), text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == f"sc://localhost:{port}"  # with a token: see ConnectServer.url
        tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        listening = [c for pid in tree for c in psutil.Process(pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert any(c.laddr.port == port for c in listening)
        assert all(c.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1") for c in listening), listening
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        time.sleep(1)
        assert [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"] == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)



def test_connect_server_killed_with_sigkill_takes_its_jvm_along_and_the_port_serves_again(tmp_path, monkeypatch):
    """SIGKILL of `airflow-eo connect-server` alone (not its group): its JVM runs in a session of
    its own, so only the parent-death signal ends it; the port is free again within seconds and
    the next server on it removes the killed one's scratch directory. Both servers keep their
    scratch in a temp directory of this test's own: any server started on the machine removes
    abandoned ones (seen: another checkout's test server removed it before the second one here)."""
    import tempfile

    from airflow_eo.submit.connect_server import DIR_PREFIX

    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    port = port_to_serve_again()
    proc = subprocess.Popen([AIRFLOW_EO, "connect-server", "--port", str(port), "--master", "local[1]"],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "server.log", "w"), text=True,
                            env={**os.environ, "TMPDIR": str(private_tmp)})
    jvm = None
    try:
        assert proc.stdout.readline().strip() == f"sc://localhost:{port}"
        (jvm,) = [c for c in psutil.Process(proc.pid).children() if "java" in c.name()]
        (scratch,) = {a.split("=", 1)[1] for a in " ".join(jvm.cmdline()).split() if a.startswith("-Djava.io.tmpdir=")}
        assert os.path.dirname(scratch) == str(private_tmp) and os.path.basename(scratch).startswith(DIR_PREFIX)
        assert os.path.isdir(scratch)
        proc.kill()  # the parent only: as the OOM killer would
        proc.wait(10)
        killed_at = time.monotonic()
        jvm.wait(15)  # raises psutil.TimeoutExpired if the JVM outlives its parent
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
            except OSError:
                break
            assert time.monotonic() - killed_at < 10, "the port still serves after the server was killed"
            time.sleep(0.2)
        assert os.path.isdir(scratch)  # left by the killed server ...
        with ConnectServer(port=port, master="local[1]", log_file=str(tmp_path / "again.log")) as again:
            assert not os.path.exists(scratch)  # ... and removed when the next one started
            session = SparkSession.builder.remote(again.url).create()
            try:
                assert session.range(3).count() == 3
            finally:
                detach(session)
    finally:
        if proc.poll() is None:
            proc.kill()
        if jvm is not None and jvm.is_running():
            jvm.kill()


def test_a_server_with_a_token_refuses_clients_without_it_and_serves_those_with_it(kafka_config, tmp_path):
    token_file = tmp_path / "token"
    server = ConnectServer(master="local[1]", token_file=str(token_file), log_file=str(tmp_path / "server.log"))
    with server:
        token = token_file.read_text().strip()
        assert len(token) >= 32 and oct(token_file.stat().st_mode & 0o777) == "0o600"
        jvm = [p for p in psutil.Process(server.process.pid).children(recursive=True) + [
            psutil.Process(server.process.pid)] if "java" in p.name()]
        assert jvm and all(token not in " ".join(p.cmdline()) for p in jvm)  # never on a command line
        topic = new_topic(kafka_config, 1)
        produce(kafka_config, topic, 5, partitions=1)
        config = IngestConfig(table_uri=str(tmp_path / "t"), ingest_id="auth", topics=[topic],
                              kafka_config=kafka_config)  # read by the client: the server is asked all the same
        os.environ.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)
        with pytest.raises(ConfigError, match="refused this client") as refused:
            Ingestion(config, ConnectSubmitter(f"sc://127.0.0.1:{server.port}")).run(RunIdentity("no-token"))
        assert "\n" not in str(refused.value) and token not in str(refused.value)
        with pytest.raises(ConfigError, match="refused this client"):
            Ingestion(config, ConnectSubmitter(f"sc://127.0.0.1:{server.port}/;token=wrong")).run(RunIdentity("bad"))
        assert Ledger.open(str(tmp_path / "t")).exists is False  # nothing ran, nothing committed
        done = subprocess.run(
            [AIRFLOW_EO, "ingest", "--table", str(tmp_path / "t"), "--ingest-id", "auth", "--topics", topic,
             "--remote", f"sc://127.0.0.1:{server.port}", "--bootstrap-servers", kafka_config["bootstrap.servers"],
             "--json"], env={**os.environ, "SPARK_CONNECT_AUTHENTICATE_TOKEN": token}, capture_output=True,
            text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        assert (result["status"], result["rows"]) == ("committed", 5)
        assert token not in done.stdout + done.stderr
    assert token not in (tmp_path / "server.log").read_text()


def test_kill_interrupts_the_attempts_operations_on_the_server(broker, kafka_config, connect_server, tmp_path):
    """on_kill / SIGTERM: the attempt's tagged operations stop on the server, nothing is committed."""
    topic = new_topic(kafka_config, 2)
    for start in range(0, 200_000, 50_000):
        produce(kafka_config, topic, 50_000, partitions=2, start=start)
    config = IngestConfig(table_uri=str(tmp_path / "t"), ingest_id="warm", topics=[topic], kafka_config=kafka_config,
                          max_offsets_per_task=10_000)
    submitter, errors = ConnectSubmitter(connect_server.url), []

    def run():
        try:
            Ingestion(config, submitter).run(RunIdentity("to-be-killed"))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    # the attempt is on the server once it is tagged and its first task wrote: 20 tasks of 10,000 offsets,
    # so the kill lands with most still to run (a fixed one-second sleep raced a batch a warm server ends sooner)
    table_uri, deadline = str(tmp_path / "t"), time.monotonic() + 120
    while not (submitter._tag is not None and os.path.isdir(table_uri) and staged_dirs(table_uri)) and worker.is_alive():
        assert time.monotonic() < deadline, "the batch never started writing"
        time.sleep(0.05)
    assert worker.is_alive(), f"the batch ended before it could be killed: {errors}"
    killed_at = time.monotonic()
    submitter.kill()
    worker.join(120)
    assert not worker.is_alive()
    assert time.monotonic() - killed_at < 20, "the interrupted attempt kept running"
    assert len(errors) == 1 and isinstance(errors[0], SparkJobError), errors
    assert "OPERATION_CANCELED" in str(errors[0]) and "without committing" in str(errors[0])
    assert not os.path.exists(os.path.join(str(tmp_path / "t"), "_delta_log")), "nothing may be committed"


def test_the_command_says_ready_on_stdout_and_with_its_ready_file_only_once_warm(tmp_path):
    """`--ready-file` (the compose service's health check tests it): a file a killed server left is
    removed at start, the file appears with the URL line once the server is warm, holding that URL,
    and goes when the server stops."""
    port, ready = free_port(), tmp_path / "ready"
    ready.write_text("left by a killed server\n")
    proc = subprocess.Popen([AIRFLOW_EO, "connect-server", "--port", str(port), "--master", "local[1]",
                             "--ready-file", str(ready)], stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "server.log", "w"), text=True, start_new_session=True)
    try:
        deadline, served_before_ready = time.monotonic() + 300, False
        while not ready.exists() or ready.read_text() == "left by a killed server\n":
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                served_before_ready = served_before_ready or not ready.exists()
            time.sleep(0.05)
        assert served_before_ready, "the port never served before ready: the test did not see the warm-up"
        line = proc.stdout.readline().strip()
        assert line == f"sc://localhost:{port}" and ready.read_text() == line + "\n"
        assert "ready after" in (tmp_path / "server.log").read_text()  # and how long the warm-up took
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not ready.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_client_that_arrives_during_the_warm_up_waits_for_ready(kafka_config, tmp_path, monkeypatch):
    """A batch that needs Spark, started while the server's port already serves but its warm-up runs,
    waits for ready before its job: its staged files are written after the ready file appeared. The
    warm-up is held until the client says it waits (on a fast machine it would be over first). The
    server starts in this thread: its JVM dies with the thread that forked it (PR_SET_PDEATHSIG)."""
    import airflow_eo.driver.direct as direct

    held, release = threading.Event(), threading.Event()
    real = direct.warm_up

    def held_warm_up(spark, tasks, **kwargs):
        held.set()
        release.wait(300)
        return real(spark, tasks, **kwargs)

    monkeypatch.setattr(direct, "warm_up", held_warm_up)
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 2000, partitions=2)
    ready, table_uri = tmp_path / "ready", str(tmp_path / "table")
    server = ConnectServer(master="local[2]", ready_file=str(ready), log_file=str(tmp_path / "server.log"))
    seen: dict = {}

    def early_client():
        try:
            assert held.wait(300), "the server never started its warm-up"
            client = seen["client"] = cli_ingest(server.url, table_uri, topic, kafka_config, "early")
            lines = seen["lines"] = []
            for line in client.stderr:
                lines.append(line)
                if "still warming up" in line:
                    seen["ready_then"] = ready.exists()
                    seen["table_then"] = os.path.exists(os.path.join(table_uri, "_delta_log"))
                    break
        finally:
            release.set()

    watcher = threading.Thread(target=early_client)
    watcher.start()
    try:
        server.start(timeout=300)
        watcher.join(300)
        client = seen["client"]
        out, err = client.communicate(timeout=300)
        assert "still warming up" in seen["lines"][-1], "".join(seen["lines"])[-3000:]
        assert seen["ready_then"] is False and seen["table_then"] is False
        assert client.returncode == 0, err[-3000:]
        assert "is ready (waited" in err
        ready_at = ready.stat().st_mtime
        staged = [os.path.join(d, f) for d, _, files in os.walk(table_uri) for f in files if f.endswith(".parquet")]
        assert staged and all(os.stat(f).st_mtime >= ready_at for f in staged), (ready_at, staged)
        assert assert_exactly_once(table_uri, kafka_config["bootstrap.servers"], [topic], ingest_id="warm") == 2000
    finally:
        release.set()
        watcher.join(300)
        if "client" in seen and seen["client"].poll() is None:
            seen["client"].kill()
        server.stop()
    assert not ready.exists()
