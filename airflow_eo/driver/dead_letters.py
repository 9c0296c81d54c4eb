"""Dead letters: the records that cannot be decoded (or were dropped as duplicates) go to their own Delta table.

A record whose reason is set (:mod:`airflow_eo.driver.decode`: not decodable, null, larger than
``max_value_bytes``) does not fail the batch: it goes to the dead-letter table
(``topic, partition, offset, timestamp, key, value, reason, ingest_id, batch``).

The main commit decides; the dead-letter table follows it. The attempt stages its dead
letters beside the dead-letter table (``b<batch>-…/``) and lists them in the *main*
commit's metadata (:meth:`DeadLetters.manifest`); only after that commit landed are they
committed to the dead-letter table (:func:`airflow_eo.sinks.dead_letters.commit_dead_letters_of`),
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

import logging
from dataclasses import asdict

from airflow_eo.attempt import Attempt, Secrets
from airflow_eo.spec import DeadLetterSpec
from airflow_eo.spec.columns import REASON_COLUMN
from airflow_eo.driver.decode import decode, functions_for
from airflow_eo.core.errors import DeadLetterThresholdError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.sinks.dead_letters import ensure_table
from airflow_eo.table.staging import attempt_dir_name
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value", "reason")


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
    def of(cls, source, attempt: Attempt, secrets: Secrets, checked: bool = False,
           sent: bool = False) -> "DeadLetters | None":
        """None unless the attempt decodes keys or values, or its sink sends records here (``sent``:
        dropped duplicates, :attr:`airflow_eo.sinks.base.Sink.sends_dead_letters`), or (``checked``: the
        table has rules for new rows) has a dead-letter table for the records that break them."""
        if attempt.decode.enabled:
            return cls(decode(source, attempt.decode.columns), attempt, secrets.storage_options)
        if sent or (checked and attempt.dead_letters.table_uri):
            with functions_for(source) as F:
                return cls(source.withColumn(REASON_COLUMN, F.lit(None).cast("string")), attempt,
                           secrets.storage_options)
        return None

    def add(self, rows) -> None:
        """Also send ``rows`` (source columns and their :data:`REASON_COLUMN`, e.g. dropped
        duplicates) to the dead-letter table; they do not count toward the undecodable-record threshold."""
        with functions_for(rows) as F:
            extra = rows.select(*DEAD_LETTER_COLUMNS[:-1], F.col(REASON_COLUMN).alias("reason"),
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
        uri = self.spec.table_uri
        assert uri is not None, "dead letters without a dead-letter table"  # the spec refuses that combination
        location = TableLocation.of(uri, self.storage_options)
        self.arrow_schema = arrow_schema_of(self.bad.schema)
        target = location.join(attempt_dir_name(self.plan))
        self.staged = stage_fn(self.bad.coalesce(1), location, target, self.storage_options, self.arrow_schema)
        ensure_table(uri, self.arrow_schema, self.storage_options)
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
