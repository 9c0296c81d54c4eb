"""Decoding values, and sending the records that cannot be decoded to the dead-letter table.

With ``value_schema`` (a Spark DDL string) set, each record's value is parsed as JSON
into the column ``data`` before the transform sees the view ``source``. A record whose
value is malformed, has the wrong types, is not a JSON object, is null or is larger
than ``max_value_bytes`` does not fail the batch: it goes to the dead-letter table
(``topic, partition, offset, timestamp, key, value, reason, ingest_id, batch``).

The main commit decides; the dead-letter table follows it. The attempt stages its dead
letters beside the dead-letter table (``b<batch>-…/``) and lists them in the *main*
commit's metadata (:meth:`DeadLetters.manifest`); only after that commit landed are they
committed to the dead-letter table (:func:`airflow_eo.table.commit.commit_dead_letters_of`),
once per batch. A run that loses the main commit's compare-and-set never touches the
dead-letter table. If the driver dies between the two commits, the next run of the ingest
(or the retry) rolls the dead-letter commit forward before it plans.

A threshold (``max_dead_letters`` records, or ``max_dead_letter_fraction`` of the batch)
fails the run before either commit when too many records are bad.

Example::

    >>> dead = DeadLetters.of(source, attempt, secrets)     # doctest: +SKIP
    >>> dead is None  # no decoding, no duplicates to dead letters   # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict

from airflow_eo.attempt import Attempt, DeadLetterSpec, DecodeSpec, Secrets
from airflow_eo.driver.avro import DATA_COLUMN_NAME, KEY_DATA_COLUMN_NAME, REASON_COLUMN
from airflow_eo.driver.session import for_session
from airflow_eo.errors import ConfigError, DeadLetterThresholdError
from airflow_eo.planning import BatchPlan
from airflow_eo.table.commit import ensure_table
from airflow_eo.table.staging import attempt_dir_name
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

DATA_COLUMN, KEY_DATA_COLUMN = DATA_COLUMN_NAME, KEY_DATA_COLUMN_NAME
CORRUPT_COLUMN = "_airflow_eo_corrupt"
DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value", "reason")


@contextlib.contextmanager
def functions_for(df):
    """``pyspark.sql.functions``, building columns for ``df``'s kind of session."""
    from pyspark.sql import functions

    with for_session(df):
        yield functions


def decode(source, spec: DecodeSpec):
    """Add ``data`` (the parsed value), ``key_data`` (a parsed key, if asked) and the
    dead-letter reason (null when decodable). JSON is parsed here by Spark; Avro columns were
    decoded by the read step's tasks (:class:`airflow_eo.driver.avro.AvroDecoder`), whose
    reasons come first."""
    with functions_for(source) as F:
        return _decode(source, spec, F)


def _decode(source, spec: DecodeSpec, F):
    checks = []  # (condition, reason), the first that holds names the record's reason
    if spec.value_format != "avro" and (spec.value_schema or spec.max_value_bytes):
        checks.append((F.col("value").isNull(), F.lit("value is null")))
        if spec.max_value_bytes:
            size = F.length(F.col("value"))
            checks.append((size > spec.max_value_bytes, F.concat(
                F.lit("value of "), size.cast("string"),
                F.lit(f" bytes exceeds max_value_bytes={spec.max_value_bytes}"))))
    out, finish = source, []
    if spec.value_schema:
        out = _parse_json(out, F, "value", DATA_COLUMN, spec.value_schema, "value_schema", checks, finish)
    if spec.key_format == "json":
        out = _parse_json(out, F, "key", KEY_DATA_COLUMN, spec.key_schema, "key_schema", checks, finish)
    reason = F.col(REASON_COLUMN) if REASON_COLUMN in source.columns else F.lit(None).cast("string")
    for condition, message in reversed(checks):
        reason = F.when(condition, message).otherwise(reason)
    out = out.withColumn(REASON_COLUMN, reason)
    for target, keep in finish:  # drop the corrupt-record field once the reason is computed
        out = out.withColumn(target, keep)
    return out


def _parse_json(out, F, column: str, target: str, ddl: str, option: str, checks: list, finish: list):
    # The DDL is parsed by the DataFrame's own session (classic or Spark Connect alike).
    parsed = F.from_json(F.col(column).cast("string"), f"{ddl}, {CORRUPT_COLUMN} STRING",
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN})
    out = out.withColumn(target, parsed)
    try:
        fields = [c for c in out.select(f"{target}.*").columns if c != CORRUPT_COLUMN]
    except Exception as exc:  # ParseException from Spark
        raise ConfigError(f"{option} {ddl!r} is not a Spark DDL schema "
                          f"({str(exc).strip().splitlines()[0]}); write it like 'id INT, name STRING'") from exc
    bad = F.col(target).isNull() | F.col(f"{target}.{CORRUPT_COLUMN}").isNotNull()
    if column == "key":  # a record without a key is not a bad record
        bad = F.col(column).isNotNull() & bad
    checks.append((bad, F.lit(f"{column} does not match {option} ({ddl}): malformed JSON, wrong types or "
                              "not a JSON object")))
    finish.append((target, F.when(F.col(target).isNull(), F.lit(None)).otherwise(
        F.struct(*[F.col(f"{target}.`{name}`").alias(name) for name in fields]))))
    return out


def split(decoded, plan: BatchPlan):
    """(good rows without the reason column, dead letters in the dead-letter table's columns)."""
    with functions_for(decoded) as F:
        return _split(decoded, plan, F)


def _split(decoded, plan: BatchPlan, F):
    good = decoded.where(F.col(REASON_COLUMN).isNull()).drop(REASON_COLUMN)
    bad = decoded.where(F.col(REASON_COLUMN).isNotNull()).select(
        *DEAD_LETTER_COLUMNS[:-1], F.col(REASON_COLUMN).alias("reason"),
        F.lit(plan.ingest_id).alias("ingest_id"), F.lit(plan.batch).cast("long").alias("batch"))
    return good, bad


class DeadLetters:
    """The dead-letter side of one attempt (used by :func:`airflow_eo.driver.main.run_attempt`)."""

    def __init__(self, decoded, attempt: Attempt, storage_options):
        from pyspark import StorageLevel

        # Kept for two actions (dead letters, then good rows): read Kafka once.
        self.decoded = decoded.persist(StorageLevel.MEMORY_AND_DISK)
        self.spec: DeadLetterSpec = attempt.dead_letters
        self.plan, self.storage_options = attempt.plan, storage_options
        self.good, self.bad = split(self.decoded, self.plan)
        self.staged: list = []
        self.arrow_schema = None

    @classmethod
    def of(cls, source, attempt: Attempt, secrets: Secrets) -> "DeadLetters | None":
        """None unless the attempt decodes keys or values, or sends dropped duplicates here."""
        if attempt.decode.enabled:
            return cls(decode(source, attempt.decode), attempt, secrets.storage_options)
        if attempt.dedup.to_dead_letters:
            with functions_for(source) as F:
                return cls(source.withColumn(REASON_COLUMN, F.lit(None).cast("string")), attempt,
                           secrets.storage_options)
        return None

    def add(self, rows) -> None:
        """Also send ``rows`` (source columns and a ``reason`` column, e.g. dropped duplicates) to
        the dead-letter table; they do not count toward the undecodable-record threshold."""
        with functions_for(rows) as F:
            extra = rows.select(*DEAD_LETTER_COLUMNS[:-1], F.col("reason"),
                                F.lit(self.plan.ingest_id).alias("ingest_id"),
                                F.lit(self.plan.batch).cast("long").alias("batch"))
        self.bad = self.bad.unionByName(extra)

    def stage(self, stage_fn) -> int:
        """Count, check the threshold, and stage the dead letters; returns how many there are."""
        from airflow_eo.compat import arrow_schema_of

        with functions_for(self.decoded) as F:
            totals = self.decoded.agg(F.count(F.lit(1)).alias("n"), F.count(F.col(REASON_COLUMN)).alias("bad"))
        counts = totals.collect()[0]
        check_threshold(self.spec, counts["bad"], counts["n"], self.plan)
        location = TableLocation.of(self.spec.table_uri, self.storage_options)
        self.arrow_schema = arrow_schema_of(self.bad.schema)
        target = location.join(attempt_dir_name(self.plan))
        self.staged = stage_fn(self.bad.coalesce(1), location, target, self.storage_options, self.arrow_schema)
        ensure_table(self.spec.table_uri, self.arrow_schema, self.storage_options)
        log.info("batch %s: %s of %s records could not be decoded", self.plan.batch, counts["bad"], counts["n"])
        return counts["bad"]

    def release(self) -> None:
        """Drop the cached decoded rows (a warm Spark server must not keep them)."""
        self.decoded.unpersist()

    def manifest(self) -> dict:
        """What the main commit records so the dead-letter commit can follow it (no secrets)."""
        return {"uri": self.spec.table_uri, "files": [asdict(f) for f in self.staged if f.num_records]}


def check_threshold(spec: DeadLetterSpec, bad: int, total: int, plan: BatchPlan) -> None:
    too_many = (spec.max_count is not None and bad > spec.max_count) or (
        spec.max_fraction is not None and total and bad / total > spec.max_fraction)
    if too_many:
        raise DeadLetterThresholdError(
            f"batch {plan.batch} of {plan.ingest_id}: {bad} of {total} records could not be decoded, "
            f"more than allowed (max_dead_letters={spec.max_count}, max_dead_letter_fraction="
            f"{spec.max_fraction}). Nothing was committed; fix the producer or value_schema, "
            "or raise the threshold"
        )
