"""Every use of a private API of pyspark or an Airflow provider, each behind one named function.

An upgrade of pyspark or of apache-airflow-providers-apache-kafka can change what these lean
on without a deprecation; ``tests/unit/test_compat.py`` pins each to the installed version and
fails loudly, naming the version, when one changes. Each docstring says what it leans on and
what the public alternative would be. Third-party objects come in as arguments and pyspark is
imported lazily, so the driver, the submitters and the hooks can all import this module (it
imports no Airflow: the driver must not).

Example::

    >>> with connect_mode(False):  # build a classic plan even if a Connect client ran here
    ...     pass
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from typing import Any, Iterator

from airflow_eo.attempt import Env

# --- apache-airflow-providers-apache-kafka --------------------------------------------------

MSK_IAM_CALLBACK_NAME = "_msk_iam_oauth_cb"  # airflow.providers.apache.kafka.hooks.base


def kafka_hook_config(hook: Any) -> dict[str, Any]:
    """The confluent-kafka config a ``KafkaBaseHook`` builds for its connection.

    Leans on the private ``KafkaBaseHook._build_config()`` (bootstrap check, allowlisted
    callbacks imported, Amazon MSK IAM detected). Public alternative: none returns the dict;
    ``get_conn`` builds a client from it, which cannot travel to the Spark job.
    """
    return hook._build_config()


def msk_iam_region(callback: Any) -> str | None:
    """The AWS region of the provider's Amazon MSK IAM token callback, or None for any other.

    Leans on ``_build_config`` setting ``oauth_cb`` to ``functools.partial(_msk_iam_oauth_cb,
    region)`` (matched by the private function's name, region as the first argument). Public
    alternative: none; the provider exposes no "this connection uses MSK IAM in region R".
    """
    if isinstance(callback, functools.partial) and getattr(callback.func, "__name__", "") == MSK_IAM_CALLBACK_NAME:
        return str(callback.args[0])
    return None


# --- pyspark: Spark <-> Arrow types --------------------------------------------------------


def arrow_schema_of(struct: Any) -> Any:
    """The Arrow schema Spark's own Arrow conversions use for a Spark ``StructType``
    (timestamps as microseconds in UTC, plain not large strings and binaries): what the staged
    Parquet and the Delta schema are built from.

    Leans on ``pyspark.sql.pandas.types.to_arrow_schema`` and its defaults
    (``timestamp_utc=True``, ``prefers_large_types=False``); the module is not in the API
    reference. Public alternative: none short of writing the type mapping ourselves.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct)


def arrow_type_of(data_type: Any) -> Any:
    """The Arrow type of one Spark ``DataType``, as :func:`arrow_schema_of` maps it.

    Leans on ``pyspark.sql.pandas.types.to_arrow_type`` (not in the API reference).
    """
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(data_type)


def spark_schema_of(arrow_schema: Any) -> Any:
    """The Spark ``StructType`` of an Arrow schema (UTC timestamps as Spark ``timestamp``).

    Leans on ``pyspark.sql.pandas.types.from_arrow_schema`` (not in the API reference).
    Public alternative: a DDL string, which is what Spark's readers take anyway.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


# --- pyspark: classic Observation -----------------------------------------------------------


def observation_pending(observation: Any, wait_seconds: float = 0.0) -> bool:
    """Whether a classic ``Observation`` is attached but has no metrics after ``wait_seconds``,
    so that ``observation.get`` would block, forever if no action runs (Spark Connect's never
    reports pending: False). The metrics arrive through Spark's listener bus shortly *after*
    the action returns, hence the wait.

    Leans on the private ``Observation._jo`` (the JVM ``org.apache.spark.sql.Observation``)
    and its ``future().isCompleted()``. Public alternative: none; ``Observation.get`` waits.
    """
    jvm_observation = getattr(observation, "_jo", None)
    if jvm_observation is None:
        return False
    deadline = time.monotonic() + wait_seconds
    while not jvm_observation.future().isCompleted():
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.01)
    return False


# --- pyspark: the Spark Connect client ------------------------------------------------------


def close_client_once(spark: Any) -> None:
    """Close a Spark Connect session's client once, and disarm the close its ``__del__`` would
    do again: that second close shuts down pyspark's process-wide release pool and can
    deadlock a gRPC call running at garbage-collection time (seen here).

    Leans on ``SparkSession.client`` (documented "only relevant for testing"), the client's
    ``close`` and the session's ``__del__`` calling ``self.client.close()``; it replaces
    ``close`` on the instance. Public alternative: ``SparkSession.stop()``, which also
    releases the server-side session every airflow-eo client shares.
    """
    try:
        spark.client.close()
    except Exception:  # best effort: the server may be gone
        pass
    spark.client.close = lambda: None


def client_closed(spark: Any) -> bool:
    """Whether a Spark Connect session's client channel was closed (by :func:`close_client_once`
    or ``stop()``).

    Leans on Spark Connect's ``SparkSession.is_stopped``, which is ``client.is_closed`` and
    which the classic session and the API reference lack. Public alternative: none documented.
    """
    return bool(spark.is_stopped)


def release_server_session(spark: Any) -> None:
    """Release the session on the Spark Connect server without closing the client.

    Leans on ``SparkSession.client.release_session()``. Public alternative: ``stop()``, which
    also closes the channel (and with it pyspark's process-wide release pool).
    """
    spark.client.release_session()


def limit_client_retries(spark: Any, max_retries: int, initial_backoff_ms: int, backoff_multiplier: float,
                         max_backoff_ms: int) -> None:
    """Make a Spark Connect client give up within seconds when the server is gone (pyspark's
    default retries for up to 10 minutes).

    Leans on ``SparkConnectClient.set_retry_policies`` and
    ``pyspark.sql.connect.client.retries.DefaultPolicy``'s keyword arguments. Public
    alternative: none; the ``spark.connect.*`` retry confs are the server's, not the client's.
    """
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark.client.set_retry_policies([DefaultPolicy(max_retries=max_retries, initial_backoff=initial_backoff_ms,
                                                   backoff_multiplier=backoff_multiplier,
                                                   max_backoff=max_backoff_ms)])


# --- pyspark: the process-wide Spark Connect mark -------------------------------------------

CONNECT_MODE_MARK = Env.CONNECT_CLIENT[0]  # SPARK_CONNECT_MODE_ENABLED, read by pyspark.sql.utils.is_remote

# The mark is process-wide, so two threads building plans (racing attempts in one worker)
# must take turns, or one restores the mark while the other is still building.
_MARK_LOCK = threading.RLock()


@contextlib.contextmanager
def connect_mode(connect: bool) -> Iterator[None]:
    """Within the block pyspark builds Spark Connect objects (columns, UDFs, ``mapInArrow``)
    when ``connect``, classic ones otherwise; the mark is restored after. Threads take turns.

    Leans on the private environment mark ``SPARK_CONNECT_MODE_ENABLED`` that
    ``pyspark.sql.utils.is_remote()`` reads (opening any Connect session sets it). Public
    alternative: none for a process holding both kinds of session.
    """
    with _MARK_LOCK:
        saved = os.environ.get(CONNECT_MODE_MARK)
        if connect:
            os.environ[CONNECT_MODE_MARK] = "1"
        else:
            os.environ.pop(CONNECT_MODE_MARK, None)
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(CONNECT_MODE_MARK, None)
            else:
                os.environ[CONNECT_MODE_MARK] = saved


def forget_connect_mode() -> None:
    """Make this process classic for good: drop the Connect mark and the ``SPARK_REMOTE`` /
    ``SPARK_LOCAL_REMOTE`` a Connect client that started it may have passed on.

    Leans on the same private mark as :func:`connect_mode`.
    """
    for name in Env.CONNECT_CLIENT:
        os.environ.pop(name, None)


# --- pyspark: a flag on a session object ----------------------------------------------------


def session_flagged(spark: Any, flag: str) -> bool:
    """Whether :func:`flag_session` set ``flag`` on this session object.

    Leans on SparkSession objects (classic and Connect) taking attributes of ours. Public
    alternative: a ``weakref.WeakSet`` of sessions, if they stay weak-referenceable and hashable.
    """
    return bool(getattr(spark, flag, False))


def flag_session(spark: Any, flag: str) -> None:
    """Set ``flag`` on this session object (see :func:`session_flagged`)."""
    setattr(spark, flag, True)
