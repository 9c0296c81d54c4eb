"""Spark sessions in the driver: a classic session for spark-submit, and building columns and
plans for the session a DataFrame belongs to, classic or Spark Connect.

pyspark chooses between classic and Spark Connect objects (columns, UDFs, ``mapInArrow``) by
a process-wide environment mark that opening any Spark Connect session sets (a private API:
:func:`airflow_eo.compat.connect_mode`). A process that
holds both kinds — the test suite, an Airflow worker that ran a warm batch before a local
one, a spark-submit job started from a Connect client — must build each plan for its own
session's kind: :func:`for_session`.

Example::

    >>> with for_session(df):                                  # doctest: +SKIP
    ...     out = df.mapInArrow(read, schema)
"""

from __future__ import annotations

import contextlib

from airflow_eo.attempt import SPARK_APP_DEFAULTS
from airflow_eo.compat import connect_mode, forget_connect_mode


def is_connect(spark_or_df) -> bool:
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return isinstance(spark_or_df, (ConnectSession, ConnectDataFrame))


@contextlib.contextmanager
def for_session(spark_or_df):
    """Within the block, pyspark builds objects for ``spark_or_df``'s kind of session.

    Hold it only while building a plan, not while running one: other threads wait for it.
    """
    with connect_mode(is_connect(spark_or_df)):
        yield


def classic_process() -> None:
    """Forget an inherited Spark Connect mark: this process (a spark-submit job) is classic."""
    forget_connect_mode()


def build_session(app_name: str, extra_conf: dict | None = None):
    """A classic SparkSession with the settings the commit relies on (:data:`SPARK_DEFAULTS`)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in {**SPARK_APP_DEFAULTS, **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    with for_session(None):  # None is no Connect session: build a classic one
        return builder.getOrCreate()
