"""Change events (``cdc_format="debezium"``): Debezium's envelope unwrapped into the row it carries.

Debezium writes one event per change of a database row: ``{"before": row, "after": row,
"op": "c|u|d|r|t|m", "ts_ms": …, "source": …}``, as JSON with or without the
``{"schema": …, "payload": …}`` wrapper (``value.converter.schemas.enable``), or as Avro
through a Schema Registry. The decoder that runs for the value format does the decoding
(JSON through ``value_schema``, which names the *row's* columns; here the envelope's DDL is
built around it by :func:`decoding_spec`, both shapes at once), and this module works on
the decoded ``data`` column, whichever decoder filled it:

* the view the transform reads (``source``) holds the row's fields as columns, plus ``op``
  and ``ts_ms``, beside the Kafka columns (a row field named like a Kafka column replaces
  it; one named ``topic``, ``partition`` or ``offset`` is refused: those are provenance);
* ``c`` (insert), ``u`` (update) and ``r`` (a snapshot read) carry ``after``: upserts;
* ``d`` carries ``before``: a delete (the default ``delete_when`` is ``op = 'd'``); when
  ``before`` is null its fields come from the decoded Kafka key (``key_data``), which holds
  the primary key;
* the tombstone Debezium writes after a delete (a null value), truncate (``t``) and message
  (``m``) events are no-ops: their offsets are consumed, nothing changes;
* a value that decodes but is no change event (no known ``op``) is a dead letter.

Example::

    >>> envelope_ddl("id INT, name STRING")  # doctest: +NORMALIZE_WHITESPACE
    'payload STRUCT<before: STRUCT<id INT, name STRING>, after: STRUCT<id INT, name STRING>, op: STRING,
     ts_ms: BIGINT>, before STRUCT<id INT, name STRING>, after STRUCT<id INT, name STRING>, op STRING,
     ts_ms BIGINT'
    >>> change_of("u"), change_of("d"), change_of("t"), change_of(None)
    (<Change.UPSERT: 'upsert'>, <Change.DELETE: 'delete'>, <Change.NONE: 'none'>, None)
"""

from __future__ import annotations

import enum

from airflow_eo.attempt import Attempt
from airflow_eo.spec import KEY_COLUMNS, CdcFormat, IngestSpec
from airflow_eo.core.errors import ConfigError
from airflow_eo.spec.columns import REASON_COLUMN

DATA, KEY_DATA = "data", "key_data"  # the decoders' columns (airflow_eo.driver.decode)
OP, TS_MS = "op", "ts_ms"
ENVELOPE_FIELDS = ("before", "after", OP)


class Change(str, enum.Enum):
    """What a change event does to its key's row."""

    UPSERT = "upsert"
    DELETE = "delete"
    NONE = "none"  # consumed, changes nothing


OPS = {"c": Change.UPSERT, "u": Change.UPSERT, "r": Change.UPSERT, "d": Change.DELETE,
       "t": Change.NONE, "m": Change.NONE}


def change_of(op: str | None) -> Change | None:
    """What Debezium's ``op`` does (None: not a change event)."""
    return OPS.get(op) if op is not None else None


def envelope_ddl(row_ddl: str) -> str:
    """The Spark DDL of a Debezium JSON value whose row is ``row_ddl``: the envelope's fields at
    the top (``schemas.enable=false``) and inside ``payload`` (``schemas.enable=true``)."""
    row = f"STRUCT<{row_ddl.strip()}>"
    inner = f"before: {row}, after: {row}, op: STRING, ts_ms: BIGINT"
    return f"payload STRUCT<{inner}>, before {row}, after {row}, op STRING, ts_ms BIGINT"


def key_ddl(key_ddl_: str) -> str:
    """A Debezium JSON key of ``key_ddl_``, with or without the ``payload`` wrapper."""
    return f"payload STRUCT<{key_ddl_.strip()}>, {key_ddl_.strip()}"


def decoding_spec(spec: IngestSpec) -> IngestSpec:
    """The spec the decoders run with: for Debezium JSON, the envelope's DDL around the row's
    (``value_schema``) and the key's (``key_schema``)."""
    if spec.merge.cdc_format is not CdcFormat.DEBEZIUM:
        return spec
    changed = {}
    if spec.decode.value_format == "json" and spec.decode.value_schema:
        changed["value_schema"] = envelope_ddl(spec.decode.value_schema)
    if spec.decode.key_format == "json" and spec.decode.key_schema:
        changed["key_schema"] = key_ddl(spec.decode.key_schema)
    return spec.replace(**changed) if changed else spec


def decoding_attempt(attempt: Attempt) -> Attempt:
    """``attempt`` with :func:`decoding_spec`'s spec (what the dead-letter side decodes with)."""
    from dataclasses import replace

    spec = decoding_spec(attempt.spec)
    return attempt if spec is attempt.spec else replace(attempt, spec=spec)


def _fields(data_type) -> list[str]:
    return list(data_type.fieldNames()) if hasattr(data_type, "fieldNames") else []


def unwrap(df):
    """The Debezium events of ``df`` (decoded, with ``data``) as rows, and the records that are
    no change events: ``(events, not_events)``, the latter with their dead-letter reason
    (:data:`~airflow_eo.spec.columns.REASON_COLUMN`).

    ``events`` has the Kafka columns (but ``value`` and ``data``), the row's fields, ``op`` and
    ``ts_ms``; no-op events (tombstones, ``t``, ``m``) are in neither."""
    from airflow_eo.driver.decode import functions_for

    with functions_for(df) as F:
        return _unwrap(df, F)


def _unwrap(df, F):
    data_type = df.schema[DATA].dataType
    top = _fields(data_type)
    if "payload" in top:  # JSON: with or without the schema/payload wrapper
        inner = F.struct(*[F.col(f"{DATA}.{f}").alias(f) for f in top if f != "payload"])
        envelope = F.when(F.col(f"{DATA}.payload").isNotNull(), F.col(f"{DATA}.payload")).otherwise(inner)
        fields = _fields(data_type["payload"].dataType)
    else:  # Avro: the envelope record itself
        envelope, fields = F.col(DATA), top
    missing = [f for f in ENVELOPE_FIELDS if f not in fields]
    if missing:
        raise ConfigError(f"cdc_format='debezium' but the values decode to a struct without {missing} (fields: "
                          f"{fields}): point value_subject / value_schema at Debezium's envelope; nothing was committed")
    row_type = (data_type["payload"].dataType if "payload" in top else data_type)["after"].dataType
    row_fields = _fields(row_type)
    provenance = sorted(set(row_fields) & set(KEY_COLUMNS))
    if provenance:
        raise ConfigError(f"cdc_format='debezium': the row has column(s) {provenance}, which name the Kafka record "
                          "a row came from (provenance) in every table; rename them in the source database's "
                          "connector (e.g. a Debezium column.rename transform); nothing was committed")
    op = envelope[OP]
    before, after = envelope["before"], envelope["after"]
    from_key = _key_fields(df, F)  # a delete without `before`: its key's fields from the Kafka key
    columns = []
    for name in row_fields:
        deleted = F.when(before.isNull(), from_key[name]).otherwise(before[name]) if name in from_key else before[name]
        columns.append(F.when(op == "d", deleted).otherwise(after[name]).alias(name))
    ts = envelope[TS_MS] if TS_MS in fields else F.lit(None).cast("long")
    kept = [c for c in df.columns if c not in ("value", DATA) and c not in row_fields and c not in (OP, TS_MS)]
    known = F.col("value").isNotNull() & op.isin(*OPS)
    events = df.where(known & op.isin(*[o for o, c in OPS.items() if c is not Change.NONE]))
    events = events.select(*[F.col(c) for c in kept], *columns, op.alias(OP), ts.alias(TS_MS))
    not_events = df.where(F.col("value").isNotNull() & ~F.coalesce(op.isin(*OPS), F.lit(False))).withColumn(
        REASON_COLUMN, F.concat(F.lit("value is not a Debezium change event (op "),
                           F.coalesce(F.concat(F.lit("'"), op, F.lit("'")), F.lit("missing")),
                           F.lit("; expected c, u, d, r, t or m)")))
    return events, not_events


def _key_fields(df, F) -> dict:
    """The decoded Kafka key's fields (``key_data``, unwrapped from ``payload``), name → column;
    empty without a decoded struct key."""
    if KEY_DATA not in df.columns:
        return {}
    key_type = df.schema[KEY_DATA].dataType
    top = _fields(key_type)
    if "payload" not in top:
        return {name: F.col(f"{KEY_DATA}.{name}") for name in top}
    return {name: F.coalesce(F.col(f"{KEY_DATA}.payload.{name}"),
                             F.col(f"{KEY_DATA}.{name}") if name in top else F.lit(None))
            for name in _fields(key_type["payload"].dataType)}
