"""Decoding's Spark glue: JSON keys and values parsed by Spark, and each record's one dead-letter reason.

Avro columns and the checks before decoding (a null value, a value over ``max_value_bytes``)
were applied by the read step, in the task that read each batch
(:class:`airflow_eo.decoding.decoder.RecordDecoder`). JSON is parsed here, by Spark's
``from_json`` with the column's DDL (``value_schema`` into ``data``, ``key_schema`` into
``key_data``): a value that is malformed, has the wrong types or is not a JSON object is a dead
letter (a missing key is not). A record's reason is the first found: the read step's, then the
value's JSON, then the key's (:data:`~airflow_eo.spec.columns.REASON_COLUMN`; null when it
decoded). Where the dead letters go: :mod:`airflow_eo.driver.dead_letters`.

Example::

    >>> decoded = decode(source, attempt.decode.columns)          # doctest: +SKIP
    >>> decoded.columns[-2:]                                      # doctest: +SKIP
    ['data', '_airflow_eo_reason']
"""

from __future__ import annotations

import contextlib

from airflow_eo.driver.session import for_session
from airflow_eo.core.errors import ConfigError
from airflow_eo.spec.columns import REASON_COLUMN, ColumnSpec, JsonColumn

CORRUPT_COLUMN = "_airflow_eo_corrupt"


@contextlib.contextmanager
def functions_for(df):
    """``pyspark.sql.functions``, building columns for ``df``'s kind of session."""
    from pyspark.sql import functions

    with for_session(df):
        yield functions


def decode(source, columns: tuple[ColumnSpec, ...]):
    """``source`` with each JSON column parsed into its struct column and the record's dead-letter
    reason in :data:`REASON_COLUMN` (the read step's first)."""
    with functions_for(source) as F:
        reasons = [F.col(REASON_COLUMN)] if REASON_COLUMN in source.columns else []
        out = source
        finish: list[tuple[str, object]] = []  # (target, its column without the corrupt-record field)
        for column in columns:
            if isinstance(column, JsonColumn):
                out, bad = _parse_json(out, F, column, finish)
                reasons.append(F.when(bad, F.lit(f"{column.source.value} does not match {column.ddl_option} "
                                                 f"({column.ddl}): malformed JSON, wrong types or not a JSON object")))
        reason = F.coalesce(*reasons) if reasons else F.lit(None).cast("string")
        out = out.withColumn(REASON_COLUMN, reason)
        for target, keep in finish:  # drop the corrupt-record field once the reason is computed
            out = out.withColumn(target, keep)
        return out


def _parse_json(out, F, column: JsonColumn, finish: list):
    """``out`` with ``column`` parsed into its target, and the condition that makes a record bad."""
    source, target = column.source.value, column.target
    # The DDL is parsed by the DataFrame's own session (classic or Spark Connect alike).
    parsed = F.from_json(F.col(source).cast("string"), f"{column.ddl}, {CORRUPT_COLUMN} STRING",
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN})
    out = out.withColumn(target, parsed)
    try:
        fields = [c for c in out.select(f"{target}.*").columns if c != CORRUPT_COLUMN]
    except Exception as exc:  # ParseException from Spark
        raise ConfigError(f"{column.ddl_option} {column.ddl!r} is not a Spark DDL schema "
                          f"({str(exc).strip().splitlines()[0]}); write it like 'id INT, name STRING'") from exc
    bad = F.col(target).isNull() | F.col(f"{target}.{CORRUPT_COLUMN}").isNotNull()
    if not column.null_is_bad:  # a record without a key is not a bad record
        bad = F.col(source).isNotNull() & bad
    finish.append((target, F.when(F.col(target).isNull(), F.lit(None)).otherwise(
        F.struct(*[F.col(f"{target}.`{name}`").alias(name) for name in fields]))))
    return out, bad
