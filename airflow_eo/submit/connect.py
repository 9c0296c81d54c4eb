"""Spark Connect: run each attempt on a long-lived (warm) Spark server, from this process.

The attempt's driver logic (:func:`airflow_eo.driver.main.run_attempt`) runs here, in the
Airflow worker or the CLI, as a Spark Connect client: the server reads the planned ranges
and writes the staged Parquet; the compare-and-set Delta commit happens here, as it does in
a spark-submit driver. A batch then costs seconds instead of a JVM start.

All clients of one airflow-eo version attach to one shared server-side session (a
well-known session id, :func:`shared_session_id`): the server keeps Python worker daemons
per session and does not reap them when a session is released (measured: ~7 processes and
~180 MB per released session), so a session per batch would grow without bound. Within the
shared session each attempt leaves nothing behind (its own temp view, dropped; cached rows
unpersisted), and its operations carry a tag with the attempt id:
:meth:`ConnectSubmitter.kill` interrupts exactly those (``interruptTag``), so a killed task
stops using the cluster. A server on another airflow-eo version is refused before anything
runs. A batch that needs a Spark job on a server still warming up waits until it is ready
(:func:`wait_until_ready`, bounded): it would otherwise share the server's cores with the warm-up.

Example::

    >>> Ingestion(config, ConnectSubmitter("sc://127.0.0.1:15002")).run(run)   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

from airflow_eo import __version__
from airflow_eo.attempt import Attempt, Secrets
from airflow_eo.compat import client_closed, close_client_once, limit_client_retries
from airflow_eo.driver.batch import features_of
from airflow_eo.driver.tables import attempts_of, needs_spark
from airflow_eo.driver.main import run_attempt
from airflow_eo.core.errors import ConfigError, SparkUnavailableError

log = logging.getLogger(__name__)

TAG_PREFIX = "airflow-eo-"
RETRIES = 4  # ~3 s of backoff before "the server went away" is reported
SESSION_SLOTS = 20  # shared session ids to try when the server has closed earlier ones
VERSION_CONF = "spark.airflow_eo.version"  # set by `airflow-eo connect-server`
_verified: set[str] = set()  # servers whose airflow-eo version matched, per process
_ready: set[str] = set()  # servers seen ready (warmed up), per process
READY_WAIT = 300.0  # seconds a client waits for a server's warm-up before it runs its job anyway
# set by `airflow-eo connect-server` (airflow_eo.submit.connect_server says when)
ANNOUNCES_READY_CONF = "spark.airflow_eo.announces_ready"
READY_VIEW = "airflow_eo_ready"
_clients: dict[str, object] = {}  # one client per server URL and process, reused by every attempt
_clients_lock = threading.Lock()


def detach(spark) -> None:
    """Close a Connect client once (:func:`airflow_eo.compat.close_client_once`): a second
    close at garbage collection can deadlock a gRPC call running then."""
    close_client_once(spark)


def close_clients() -> None:
    """Close this process's clients (their pending release calls are sent); the server-side
    shared session stays for the next batch."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for spark in clients:
        detach(spark)


def server_version(spark) -> str:
    """The airflow-eo version of the server's Python workers (the ones that read Kafka)."""
    declared = spark.conf.get(VERSION_CONF, None)
    if declared:
        return declared
    from pyspark.sql.functions import udf

    def installed(_):
        import airflow_eo

        return airflow_eo.__version__

    return spark.range(1).select(udf(installed, "string")("id").alias("v")).first()["v"]


def check_version(spark, url: str) -> None:
    if url in _verified:
        return
    theirs = server_version(spark)
    if theirs != __version__:
        raise ConfigError(f"the Spark Connect server at {redact_url(url)} runs airflow-eo {theirs}, this client "
                          f"runs {__version__}: install the same airflow-eo version on both")
    _verified.add(url)


def server_ready(spark) -> bool:
    """Whether the server has finished its warm-up (its global temp view :data:`READY_VIEW` exists)."""
    return bool(spark.catalog.tableExists(f"global_temp.{READY_VIEW}"))


def wait_until_ready(spark, url: str, timeout: float = READY_WAIT, poll: float = 0.5) -> float:
    """Wait until the server at ``url`` is ready — warmed up, so a batch runs at full speed — when it
    says it warms up (``airflow-eo connect-server`` does; another server is taken as ready); the
    seconds waited. Past ``timeout`` the caller goes ahead anyway, slower, with a warning: a warm-up
    that cannot finish is the server's problem, not a reason to fail the batch. Asked once per
    server and process."""
    if url in _ready:
        return 0.0
    started = time.monotonic()
    if spark.conf.get(ANNOUNCES_READY_CONF, "false") == "true" and not server_ready(spark):
        log.info("the Spark Connect server %s is still warming up: waiting until it is ready (at most %.0fs)",
                 redact_url(url), timeout)
        while not server_ready(spark):
            if time.monotonic() - started > timeout:
                log.warning("the Spark Connect server %s is not ready after %.0fs: running the batch anyway (the "
                            "warm-up's failure, if any, is in the server's output)", redact_url(url), timeout)
                break
            time.sleep(poll)
        else:
            log.info("the Spark Connect server %s is ready (waited %.1fs)", redact_url(url), time.monotonic() - started)
    _ready.add(url)
    return time.monotonic() - started


def shared_session_id(slot: int = 0) -> str:
    """The server-side session every client of this airflow-eo version attaches to. A server
    remembers closed sessions (e.g. expired after its idle timeout): then the next slot."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"airflow-eo/{__version__}/{slot}"))


def with_session_id(url: str, session_id: str) -> str:
    return f"{url};session_id={session_id}" if ";" in url else f"{url.rstrip('/')}/;session_id={session_id}"


def redact_url(url: str) -> str:
    """An ``sc://`` URL without its parameters (they may hold a token)."""
    return url.split(";", 1)[0].split("/;", 1)[0]


def client_url(url: str, environ=os.environ) -> str:
    """``url`` as pyspark must be given it: with a token (in the URL or pyspark's
    ``$SPARK_CONNECT_AUTHENTICATE_TOKEN``) and no TLS, a loopback address becomes ``localhost``,
    the one host pyspark sends a token to in plaintext (else it insists on TLS).

    >>> client_url("sc://127.0.0.1:15002", {"SPARK_CONNECT_AUTHENTICATE_TOKEN": "t"})
    'sc://localhost:15002'
    >>> client_url("sc://127.0.0.1:15002/;use_ssl=true;token=t", {})
    'sc://127.0.0.1:15002/;use_ssl=true;token=t'
    """
    base, _, params = url.partition(";")
    options = dict(p.split("=", 1) for p in params.split(";") if "=" in p)
    if ("token" not in options and not environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")) or \
            options.get("use_ssl", "").lower() == "true":
        return url
    for loopback in ("//127.0.0.1:", "//[::1]:"):
        base = base.replace(loopback, "//localhost:", 1)
    return base + (";" + params if params else "")


def refused_token(exc: BaseException) -> bool:
    """Whether the server refused this client's token (or its lack of one): no retry helps."""
    return "UNAUTHENTICATED" in f"{exc.__class__.__name__} {exc}"


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server cannot be reached (retryable), not that the job failed."""
    text = f"{exc.__class__.__name__} {exc}"
    return any(s in text for s in ("UNAVAILABLE", "Connection refused", "failed to connect", "Socket closed",
                                   "DEADLINE_EXCEEDED", "RetriesExceeded", "SESSION_CLOSED",
                                   "INVALID_HANDLE.SESSION_NOT_FOUND"))


class ConnectSubmitter:
    """Runs attempts on the Spark Connect server at ``url`` (``sc://host:port[/;token=…]``)."""

    def __init__(self, url: str, conf: dict | None = None):
        if not url.startswith("sc://"):
            raise ConfigError(f"{redact_url(url)!r} is not a Spark Connect URL: use sc://host:port")
        self.url = url
        self.conf = dict(conf or {})
        self._lock = threading.Lock()
        self._session = None
        self._tag: str | None = None
        self._preparing: threading.Thread | None = None
        self.submissions = 0

    def prepare(self) -> None:
        """Start attaching this process's client in the background (pyspark's Connect client
        imports ~0.5 s of modules, then opens the channel and sets the session's conf), while the
        caller plans the batch; :meth:`session` waits for it. A failure here is left to
        :meth:`session` to raise. For a command that exits after one run, not for a task process
        that may fork (a thread inside an import or a gRPC call does not survive a fork)."""
        def attach() -> None:
            try:
                check_version(self._session_now(), self.url)
            except Exception:  # session() and submit() try again and raise what they find
                pass

        if self._preparing is None:
            self._preparing = threading.Thread(target=attach, name="airflow-eo-connect-attach")
            self._preparing.start()

    def session(self):
        """This process's client of the shared session on the server (made once, then reused)."""
        if self._preparing is not None:
            self._preparing.join()
        return self._session_now()

    def _session_now(self):
        with _clients_lock:
            spark = _clients.get(self.url)
            if spark is None or client_closed(spark):
                spark = _clients[self.url] = self.attach()
        for key, value in self.conf.items():
            spark.conf.set(key, value)
        return spark

    def attach(self):
        """A new client attached to the shared session, which gives up within seconds when the
        server is gone (pyspark's default retries for up to 10 minutes; a task retry is the
        better place to wait for a server that went away)."""
        from pyspark.sql import SparkSession

        from airflow_eo.attempt import SPARK_DEFAULTS

        last: Exception | None = None
        for slot in range(SESSION_SLOTS):
            spark = SparkSession.builder.remote(with_session_id(client_url(self.url), shared_session_id(slot))).create()
            limit_client_retries(spark, max_retries=RETRIES, initial_backoff_ms=200, backoff_multiplier=2.0,
                                 max_backoff_ms=2000)
            try:
                for key, value in SPARK_DEFAULTS.items():
                    spark.conf.set(key, value)
                return spark
            except Exception as exc:
                detach(spark)
                if "SESSION_CLOSED" not in str(exc):
                    raise
                last = exc
        raise SparkUnavailableError(f"the Spark Connect server {redact_url(self.url)} has closed all of "
                                    f"airflow-eo's {SESSION_SLOTS} shared sessions; restart it") from last

    def forget(self, spark) -> None:
        """Drop a client whose server went away: the next attempt attaches anew."""
        with _clients_lock:
            if _clients.get(self.url) is spark:
                del _clients[self.url]
        detach(spark)

    def submit(self, attempt: Attempt, secrets: Secrets) -> None:
        tag = TAG_PREFIX + attempt.attempt_id
        try:
            spark = self.session()
        except Exception as exc:
            if refused_token(exc):
                raise ConfigError(f"the Spark Connect server {redact_url(self.url)} refused this client: set "
                                  "$SPARK_CONNECT_AUTHENTICATE_TOKEN (or the spark_connect connection's password) to "
                                  "the token in the server's token file") from None
            raise SparkUnavailableError(f"cannot open a session on the Spark Connect server {redact_url(self.url)} "
                                        f"({exc.__class__.__name__}); is it running? Retry when it is") from exc
        with self._lock:
            self._session, self._tag = spark, tag
        self.submissions += 1
        spark.addTag(tag)  # first: the finally below removes it, whatever fails
        try:
            check_version(spark, self.url)
            attempts = [a for a, _ in attempts_of(attempt, secrets.storage_options)]
            if needs_spark(attempts, lambda a: features_of(a, secrets.storage_options)):  # else: the driver reads
                wait_until_ready(spark, self.url)
            run_attempt(spark, attempt, secrets)
        except Exception as exc:
            if is_unavailable(exc):
                self.forget(spark)
                raise SparkUnavailableError(
                    f"the Spark Connect server {redact_url(self.url)} went away during batch {attempt.plan.batch} "
                    f"({exc.__class__.__name__}); nothing was committed by this attempt unless the table says so. "
                    "Retry when the server is back: the retry replays the same offsets") from exc
            raise
        finally:
            with self._lock:
                self._session = self._tag = None
            spark.removeTag(tag)  # the client stays attached to the shared session for the next attempt

    def kill(self) -> None:
        """Interrupt the running attempt's operations on the server (``on_kill``, SIGTERM)."""
        with self._lock:
            spark, tag = self._session, self._tag
        if spark is not None and tag is not None:
            try:
                interrupted = spark.interruptTag(tag)
                log.info("interrupted %d Spark operation(s) of %s", len(interrupted), tag)
            except Exception as exc:  # the server may be gone already: nothing left to stop
                log.warning("could not interrupt %s on the Spark Connect server: %s", tag, exc)
