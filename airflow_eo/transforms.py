"""Transforms: how Kafka records become the table's columns.

A transform is either a Spark SQL statement over the view ``source`` (the Kafka columns
``topic, partition, offset, timestamp, timestampType, key, value, headers``) or a Python
callable named ``"package.module:function"`` that takes and returns a DataFrame. Either
way the output must keep ``topic``, ``partition`` and ``offset``: the table is keyed by
source offset, which is what makes replays and reprocessing exact.

Example::

    >>> t = Transform(sql="SELECT topic, partition, offset, timestamp, "
    ...                   "CAST(value AS STRING) AS body FROM source")
    >>> t.describe()
    'sql'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from airflow_eo.errors import ConfigError

SOURCE_VIEW = "source"
KEY_COLUMNS = ("topic", "partition", "offset")


@dataclass(frozen=True)
class Transform:
    sql: str | None = None
    callable: str | None = None

    def __post_init__(self):
        if self.sql and self.callable:
            raise ConfigError("give either transform_sql or transform (a 'module:function'), not both")
        if self.callable and ":" not in self.callable:
            raise ConfigError(
                f"transform {self.callable!r} must name a function as 'package.module:function'"
            )

    def describe(self) -> str:
        return "sql" if self.sql else ("callable " + self.callable if self.callable else "identity")

    def load_callable(self):
        module_name, _, func_name = self.callable.partition(":")
        try:
            return getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"transform {self.callable!r} cannot be imported ({exc}): make the module importable "
                "on the Spark driver and executors (e.g. --py-files) and check the name"
            ) from exc

    def apply(self, df):
        """Apply to the source DataFrame and check the key columns survived."""
        if self.sql:
            df.createOrReplaceTempView(SOURCE_VIEW)
            try:
                out = df.sparkSession.sql(self.sql)
            except Exception as exc:  # AnalysisException, ParseException: user's SQL
                raise ConfigError(
                    f"transform_sql failed: {_first_line(exc)}. Fix the SQL (it reads the view "
                    f"'{SOURCE_VIEW}'); nothing was committed"
                ) from exc
        elif self.callable:
            func = self.load_callable()
            try:
                out = func(df)
            except Exception as exc:  # the user's function: name it, and say nothing landed
                raise ConfigError(
                    f"transform {self.callable!r} raised {exc.__class__.__name__}: {_first_line(exc)}. "
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
        return out


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
