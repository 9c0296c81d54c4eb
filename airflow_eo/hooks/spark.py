"""Spark connections: which submitter a ``spark_conn_id`` means.

A connection of the Spark provider's ``spark`` type starts each attempt with spark-submit
through SparkSubmitHook (:mod:`airflow_eo.submit.spark_hook`); one of its ``spark_connect``
type runs each attempt on that warm Spark Connect server (:mod:`airflow_eo.submit.connect`),
with the URL, token and TLS option built by the provider's SparkConnectHook. A large audit
runs its Spark tasks on the same connection (:func:`audit_spark_for`): the Connect server, or
a session of the connection's master in the task's process (client mode).

Example::

    >>> submitter_for("spark_connect_default", conf={}, env_vars={}, name="airflow-eo orders")  # doctest: +SKIP
    <airflow_eo.submit.connect.ConnectSubmitter object at ...>
"""

from __future__ import annotations

from typing import Any

CONNECT_CONN_TYPE = "spark_connect"


def connection_type(conn_id: str) -> str | None:
    from airflow.providers.common.compat.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id).conn_type
    except Exception:  # an unknown connection: SparkSubmitHook's own default (yarn) applies
        return None


def connect_url(conn_id: str) -> str:
    """The ``sc://`` URL of a ``spark_connect`` connection; its token is masked in logs."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from airflow_eo.version_compat import mask_secret

    url = SparkConnectHook(conn_id=conn_id).get_connection_url()
    if ";" in url:
        mask_secret(url)
        for param in url.split(";")[1:]:
            if param.startswith("token="):
                mask_secret(param.split("=", 1)[1])
    return url


def submitter_for(conn_id: str, conf: dict[str, str], env_vars: dict[str, str], name: str,
                  hook_kwargs: dict[str, Any] | None = None):
    """A :class:`~airflow_eo.submit.connect.ConnectSubmitter` for a ``spark_connect`` connection,
    else a :class:`~airflow_eo.submit.spark_hook.SparkSubmitHookSubmitter`."""
    if connection_type(conn_id) == CONNECT_CONN_TYPE:
        from airflow_eo.submit.connect import ConnectSubmitter

        return ConnectSubmitter(connect_url(conn_id), conf=conf)
    from airflow_eo.submit.spark_hook import SparkSubmitHookSubmitter

    return SparkSubmitHookSubmitter(conn_id=conn_id, conf=conf, env_vars=env_vars, name=name,
                                    hook_kwargs=hook_kwargs)


def audit_spark_for(conn_id: str | None, conf: dict[str, str]):
    """Where a large audit's Spark tasks run (:class:`~airflow_eo.submit.audit.SparkSlices`), or
    None (every slice in process) without a connection. The master of a ``spark`` connection is
    built as SparkSubmitHook builds it (host, and port when set); the session runs in this process."""
    import logging

    from airflow.providers.common.compat.sdk import BaseHook

    from airflow_eo.submit.audit import SparkSlices

    if not conn_id:
        return None
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # no such connection: compare in process rather than guess a cluster
        logging.getLogger(__name__).info("no Spark connection %r: the audit compares every slice in this process",
                                         conn_id)
        return None
    if conn.conn_type == CONNECT_CONN_TYPE:
        return SparkSlices(remote=connect_url(conn_id), conf=conf)
    master = f"{conn.host}:{conn.port}" if conn.port else conn.host
    return SparkSlices(master=master or "local[*]", conf=conf)
