"""Applying a transform: how Kafka records become the table's columns, in the driver.

A transform (:class:`airflow_eo.spec.Transform`) is either a Spark SQL statement over
the view ``source`` (the Kafka columns ``topic, partition, offset, timestamp,
timestampType, key, value, headers``) or a Python callable named
``"package.module:function"`` that takes and returns a DataFrame. Either way the output
must keep ``topic``, ``partition`` and ``offset``: the table is keyed by source offset,
which is what makes replays and reprocessing exact.

Example::

    >>> out = apply_transform(Transform(sql="SELECT topic, partition, offset, "
    ...                       "CAST(value AS STRING) AS body FROM source"), df)    # doctest: +SKIP
"""

from __future__ import annotations

import importlib

from airflow_eo.spec import KEY_COLUMNS, Transform
from airflow_eo.core.errors import ConfigError

SOURCE_VIEW = "source"


def load_callable(transform: Transform):
    module_name, _, func_name = transform.callable.partition(":")
    try:
        return getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"transform {transform.callable!r} cannot be imported ({exc}): make the module importable "
            "on the Spark driver and executors (e.g. --py-files) and check the name"
        ) from exc


def apply_transform(transform: Transform, df, view: str = SOURCE_VIEW, partition_by: tuple[str, ...] = ()):
    """Apply to the source DataFrame and check the key columns survived and the table's
    partition columns (``partition_by``) are there.

    The SQL reads ``source``; the DataFrame is registered under ``view`` and named ``source``
    in a CTE around the query, so attempts sharing one Spark session (the warm path) never
    see each other's records. The caller drops ``view`` once the output is written.
    """
    if transform.sql:
        df.createOrReplaceTempView(view)
        query = transform.sql.strip().rstrip(";")
        if view != SOURCE_VIEW:
            query = f"WITH {SOURCE_VIEW} AS (SELECT * FROM {view}) SELECT * FROM ({query})"
        try:
            out = df.sparkSession.sql(query)
            _ = out.columns  # analysis errors surface here on Spark Connect, which analyses lazily
        except Exception as exc:  # AnalysisException, ParseException: user's SQL
            raise ConfigError(
                f"transform_sql failed: {_first_line(exc)}. Fix the SQL (it reads the view "
                f"'{SOURCE_VIEW}'); nothing was committed"
            ) from exc
    elif transform.callable:
        func = load_callable(transform)
        try:
            out = func(df)
        except Exception as exc:  # the user's function: name it, and say nothing landed
            raise ConfigError(
                f"transform {transform.callable!r} raised {exc.__class__.__name__}: {_first_line(exc)}. "
                "Fix the function (it takes and returns a DataFrame); nothing was committed"
            ) from exc
    else:
        out = df
    missing = [c for c in KEY_COLUMNS if c not in out.columns]
    if missing:
        raise ConfigError(
            f"the transform's output lacks the key column(s) {missing}: keep topic, partition "
            "and offset in the output (the table is keyed by source offset); nothing was committed"
        )
    missing = [c for c in partition_by if c not in out.columns]
    if missing:
        raise ConfigError(
            f"the transform's output lacks the partition column(s) {missing} of partition_by={list(partition_by)}: "
            "derive them in the transform, e.g. SELECT *, to_date(timestamp) AS date FROM source; nothing was committed"
        )
    return out


def keep(condition: str | None, df):
    """The records of ``df`` the sink's ``filter`` keeps (all without one): a Spark SQL condition
    over the decoded source's columns."""
    if not condition:
        return df
    try:
        out = df.where(condition)
        _ = out.schema  # analysis errors surface here on Spark Connect, which analyses lazily
    except Exception as exc:  # AnalysisException, ParseException: the user's SQL
        raise ConfigError(f"filter {condition!r} failed: {_first_line(exc)}. Fix the condition (it reads the "
                          f"columns of '{SOURCE_VIEW}'); nothing was committed") from exc
    return out


def join_by_offset(out, extra, columns: tuple[str, ...]):
    """``out`` with ``columns`` of ``extra`` (a DataFrame with the key columns too), matched by
    source offset: for a column the transform left out (a left join, one more shuffle)."""
    from airflow_eo.driver.decode import functions_for

    with functions_for(out) as F:
        right = extra.select(*[F.col(c).alias(f"_k_{c}") for c in KEY_COLUMNS], *[F.col(c) for c in columns])
        condition = None
        for c in KEY_COLUMNS:
            match = F.col(c) == F.col(f"_k_{c}")
            condition = match if condition is None else condition & match
        return out.join(right, on=condition, how="left").drop(*[f"_k_{c}" for c in KEY_COLUMNS])


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
