"""A local Spark Connect server: the warm Spark that ``--remote`` and ``spark_connect`` connections use.

``airflow-eo connect-server`` starts the server that ships with pyspark (no download),
bound to 127.0.0.1, with this environment's Python on its workers (they import airflow_eo
to read Kafka) and Spark's own log at WARN, and stops it (by PID, its whole process group) on
SIGTERM or Ctrl-C. The server's JVM also ends when the process that started it dies, however it
dies (Linux: ``PR_SET_PDEATHSIG``), and the next server started removes the scratch directory it left.

**Ready** means a batch would run at full speed: the server has run a warm-up of what a batch
runs (:meth:`ConnectServer.warm_up`). Its port serves before that (the warm-up is a client of
it), so readiness is said three ways, all at the same moment:

* the command prints the ``sc://`` URL on stdout (its only line there);
* ``--ready-file PATH`` is created (removed at start and when the server stops): what a
  supervisor's health check tests, e.g. the compose service's;
* the server holds the global temp view :data:`READY_VIEW`, and declares
  ``spark.airflow_eo.announces_ready`` from its start: an airflow-eo client that arrives earlier
  waits for the view (bounded, :func:`airflow_eo.submit.connect.wait_until_ready`) before it runs
  a Spark job, instead of paying the warm-up's share of two cores.

Example::

    >>> with ConnectServer(port=15002, master="local[2]") as server:   # doctest: +SKIP
    ...     Ingestion(config, ConnectSubmitter(server.url)).run(run)
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict

from airflow_eo import __version__
from airflow_eo.attempt import SPARK_DEFAULTS, SPARK_WORKER_DEFAULTS, Env
from airflow_eo.core.errors import ConfigError, SparkUnavailableError
# how a client learns that the server is warm: a static conf declared from the start, and a global
# temp view (seen by every session) made at ready
from airflow_eo.submit.connect import ANNOUNCES_READY_CONF, READY_VIEW
from airflow_eo.submit.spark_submit import spark_submit_binary
from airflow_eo.table.liveness import ProcessId, ProcessState

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
DIR_PREFIX = "airflow-eo-connect-"
OWNER_FILE = "owner.json"  # the ProcessId of the process that started the server
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # Spark's own: the server and pyspark clients read it
WARM_UP_TIMEOUT = 300.0  # a warm-up still running then is interrupted; the server is ready anyway
_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n
logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.connect.level = info
"""


def die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child (spark-submit, which ``exec``s the JVM: the setting
    survives ``exec``) get SIGKILL when this process dies, however it dies: a JVM in a session of
    its own would otherwise outlive a SIGKILLed parent and keep serving on its port. Linux only
    (``prctl(PR_SET_PDEATHSIG)``); elsewhere stop() is the only way the server ends. Linux counts
    the *thread* that forked as the parent: start the child from a thread that outlives it."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before the setting took hold
            os._exit(1)

    return preexec


def remove_abandoned_dirs() -> list[str]:
    """Remove the scratch directories of servers whose starting process is gone (a SIGKILLed
    ``airflow-eo connect-server`` leaves its directory; its JVM died with it)."""
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), DIR_PREFIX + "*")):
        try:
            with open(os.path.join(path, OWNER_FILE)) as f:
                owner = ProcessId(**json.load(f))
        except (OSError, ValueError, TypeError):
            continue  # not one of ours, or being created
        if owner.state() is ProcessState.GONE:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def read_or_create_token(path: str) -> str:
    """The token in ``path``, or a new random one written there (mode 0600) when it does not exist."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path) as f:
            token = f.read().strip()
        if not token:
            raise ConfigError(f"the token file {path} is empty: write a token into it, or remove it to get a new "
                              "one") from None
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConnectServer:
    """A Spark Connect server process on 127.0.0.1, started and stopped by this object."""

    def __init__(self, port: int | None = None, master: str = "local[*]", conf: dict | None = None,
                 log_level: str = "WARN", log_file: str | None = None, token_file: str | None = None,
                 authenticate: bool = False, warm: bool = True, ready_file: str | None = None):
        """``authenticate``: clients must send the token in ``token_file`` (created with a new random
        token, mode 0600, when it does not exist; default: ``token`` in the scratch directory).
        ``warm``: :meth:`start` returns once a batch would run at full speed (:meth:`warm_up`), and
        clients that arrive earlier wait for that. ``ready_file``: created then, removed by
        :meth:`stop` (and at start, when a killed server left it)."""
        self.port = port or free_port()
        self.master = master
        self.conf = dict(conf or {})
        self.log_level = log_level
        self.log_file = log_file
        self.authenticate = authenticate or token_file is not None
        self.token_file = token_file
        self.warm = warm
        self.ready_file = ready_file
        self.warm_up_seconds: float | None = None  # how long the warm-up took (None: none ran)
        self.process: subprocess.Popen | None = None
        self._dir: str | None = None  # log4j config and warehouse; lives from start() to stop()
        self._token: str | None = None

    @property
    def scratch_dir(self) -> str | None:
        """The server's log4j config and warehouse while it runs (removed by stop/kill)."""
        return self._dir

    @property
    def url(self) -> str:
        # pyspark sends a token in plaintext only to "localhost" (local channel credentials); to
        # any other host name, 127.0.0.1 included, it insists on TLS, which this server has not
        return f"sc://{'localhost' if self.authenticate else '127.0.0.1'}:{self.port}"

    def command(self) -> list[str]:
        if self._dir is None:
            remove_abandoned_dirs()
            self._dir = tempfile.mkdtemp(prefix=DIR_PREFIX)
            with open(os.path.join(self._dir, OWNER_FILE), "w") as f:  # who removes it: see remove_abandoned_dirs
                json.dump(asdict(ProcessId.current()), f)
        log4j = os.path.join(self._dir, "log4j2.properties")
        with open(log4j, "w") as f:
            f.write(_LOG4J.format(level=self.log_level.lower()))
        conf = {
            **SPARK_DEFAULTS, **SPARK_WORKER_DEFAULTS, "spark.connect.grpc.binding.port": str(self.port),
            "spark.connect.grpc.binding.address": "127.0.0.1", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false",
            "spark.sql.warehouse.dir": os.path.join(self._dir, "warehouse"),
            # Spark's own scratch (spark-*, blockmgr-*) too: a killed JVM runs no shutdown hook,
            # and stop()/kill() remove this directory
            "spark.local.dir": os.path.join(self._dir, "local"),
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j} "
                                             f"-Djava.io.tmpdir={self._dir}",
            "spark.airflow_eo.version": __version__, **self.conf,
        }
        if self.warm:  # clients wait for READY_VIEW (a server started without the warm-up is ready at once)
            conf[ANNOUNCES_READY_CONF] = "true"
        cmd = [spark_submit_binary(), "--class", SERVER_CLASS, "--master", self.master]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd + ["--name", "airflow-eo connect server"]

    def start(self, timeout: float = 120.0) -> "ConnectServer":
        """Start the server; return once it is ready (served, warmed up, announced)."""
        if self.ready_file:
            _remove(self.ready_file)  # a killed server's: not this one's readiness
        command = self.command()
        env = {**os.environ, Env.SPARK_LOCAL_IP: "127.0.0.1",
               Env.PYSPARK_PYTHON: os.environ.get(Env.PYSPARK_PYTHON, sys.executable)}
        env.pop(TOKEN_ENV, None)  # a client's token in this environment is not the server's
        if self.authenticate:  # the JVM reads it from its environment: never on a command line
            if self.token_file is None:
                self.token_file = os.path.join(self._dir or "", "token")
            self._token = env[TOKEN_ENV] = read_or_create_token(self.token_file)
        out = open(self.log_file, "ab") if self.log_file else None  # None: this process's stderr
        self.process = subprocess.Popen(command, env=env, stdout=out or sys.stderr, stderr=subprocess.STDOUT,
                                        start_new_session=True,  # its own process group: stopped whole
                                        preexec_fn=die_with_parent(os.getpid()))
        if out is not None:
            out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SparkUnavailableError(f"the Spark Connect server exited with code {self.process.returncode} "
                                            f"before it served (see {self.log_file or 'its output'})")
            if self._serves():
                if self.warm:
                    self.warm_up_seconds = self.warm_up()
                    self._announce_ready()
                if self.ready_file:
                    _write_atomically(self.ready_file, self.url + "\n")
                return self
            time.sleep(0.5)
        self.stop()
        raise SparkUnavailableError(f"the Spark Connect server did not serve on {self.url} within {timeout:.0f}s")

    def _in_process_url(self) -> str:
        return f"{self.url}/;token={self._token}" if self._token else self.url  # never printed or logged

    def _in_a_session(self, work: Callable) -> None:
        """Run ``work(spark)`` in a session of its own, released after."""
        from pyspark.sql import SparkSession

        from airflow_eo.compat import limit_client_retries, release_server_session
        from airflow_eo.submit.connect import detach

        spark = SparkSession.builder.remote(self._in_process_url()).create()
        # a few quick retries: while it starts, another process may hold the port (a server that
        # cannot bind it exits; pyspark's default retries would wait up to 10 minutes first)
        limit_client_retries(spark, max_retries=3, initial_backoff_ms=200, backoff_multiplier=2.0, max_backoff_ms=1000)
        try:
            work(spark)
        finally:
            release_server_session(spark)
            detach(spark)

    def _serves(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.5).close()
        except OSError:
            return False
        try:
            self._in_a_session(lambda spark: spark.range(1).count())
            return True
        except Exception:
            return False

    def _announce_ready(self) -> None:
        """Make :data:`READY_VIEW`: the clients waiting for it go ahead (a global temp view is seen
        by every session of the server and lives as long as the server)."""
        try:
            self._in_a_session(lambda spark: spark.range(0).createOrReplaceGlobalTempView(READY_VIEW))
        except Exception as exc:
            self.stop()
            raise SparkUnavailableError(f"the Spark Connect server on {self.url} stopped answering at the end of "
                                        f"its warm-up ({exc.__class__.__name__}; see {self.log_file or 'its output'})"
                                        ) from exc

    def parallelism(self) -> int:
        """Tasks the server runs at once: N of ``local[N]``, the cores of ``local[*]``;
        ``spark.default.parallelism`` (or 2) on a cluster."""
        if self.master == "local":
            return 1
        if self.master.startswith("local["):
            n = self.master[len("local["):].split(",")[0].rstrip("]")
            return (os.cpu_count() or 2) if n == "*" else max(1, int(n))
        return max(1, int(self.conf.get("spark.default.parallelism", 2)))

    def warm_up(self, timeout: float = WARM_UP_TIMEOUT) -> float:
        """Run a direct batch's read tasks without Kafka in the session every airflow-eo client
        shares (:func:`airflow_eo.driver.direct.warm_up`): that session's Python worker daemon
        started and its workers forked with what a read task loads, the JVM's code for the job
        compiled. Measured, the first 1M-record batch on a new server otherwise took ~2× a steady
        one. Returns the seconds it took; a failure (or a warm-up past ``timeout``, interrupted) is
        reported on stderr and the server serves anyway (a batch would report the same failure)."""
        import threading

        from airflow_eo.driver.direct import warm_up
        from airflow_eo.submit.connect import ConnectSubmitter, detach

        started = time.monotonic()
        try:
            spark = ConnectSubmitter(self._in_process_url()).attach()
            spark.addTag("airflow-eo-warm-up")
            timer = threading.Timer(timeout, lambda: spark.interruptTag("airflow-eo-warm-up"))
            timer.start()
            try:
                warm_up(spark, self.parallelism())
            finally:
                timer.cancel()
                spark.removeTag("airflow-eo-warm-up")
                detach(spark)  # the shared session stays, with its warm Python workers
        except Exception as exc:
            print(f"airflow-eo connect-server: the warm-up failed ({exc.__class__.__name__}: "
                  f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); serving anyway", file=sys.stderr)
        return time.monotonic() - started

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group (JVM and Python workers), SIGKILL if it lingers;
        then remove its scratch directory."""
        try:
            if self.process is not None and self.process.poll() is None:
                try:
                    os.killpg(self.process.pid, signal.SIGTERM)
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait()
                except ProcessLookupError:
                    pass
        finally:
            if self.ready_file:
                _remove(self.ready_file)
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None

    def kill(self) -> None:
        """SIGKILL the whole server (a crash, for tests)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.stop()  # the process is gone: only its scratch directory is left to remove

    def __enter__(self) -> "ConnectServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _write_atomically(path: str, text: str) -> None:
    """``path`` appears whole or not at all (a check that sees it may read it)."""
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, path)


def serve(port: int | None = None, master: str = "local[*]", conf: dict | None = None, log_level: str = "WARN",
          token_file: str | None = None, ready_file: str | None = None) -> int:
    """``airflow-eo connect-server``: run a server until SIGTERM/SIGINT, then stop it. Clients must
    send the token in ``token_file`` (default: a new one in the server's scratch directory). Once it is
    ready (see the module) it prints its URL on stdout and creates ``ready_file``."""
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    server = ConnectServer(port=port or DEFAULT_PORT, master=master, conf=conf, log_level=log_level,
                           token_file=token_file, authenticate=True, ready_file=ready_file)
    try:
        started = time.monotonic()
        server.start()
        print(server.url, flush=True)  # the ready line
        warm = f" (warm-up {server.warm_up_seconds:.1f} s)" if server.warm_up_seconds is not None else ""
        print(f"airflow-eo connect-server: ready after {time.monotonic() - started:.1f} s{warm}; clients "
              f"authenticate with the token in {server.token_file}: export {TOKEN_ENV}=\"$(cat {server.token_file})\"",
              file=sys.stderr, flush=True)
        while not stopping and server.process.poll() is None:
            time.sleep(0.5)
        return 0 if stopping else (server.process.returncode or 1)
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
