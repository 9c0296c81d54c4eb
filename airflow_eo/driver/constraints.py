"""The table's rules on the rows a batch writes: CHECK constraints, invariants, NOT NULL columns and
generated columns (:class:`airflow_eo.table.features.TableFeatures`), evaluated by Spark.

The expressions are Spark SQL (the language other engines wrote them in), so they run where the
rows are: in the same pass that writes them. A generated column the transform leaves out is
computed (``expr`` of its generation expression, cast to the column's type as delta-spark's write
stores it); one it gives must equal it (``<=>``, as the protocol says). Each row gets the reason of the first rule it breaks, or null:

* the protocol's NULL semantics: a CHECK constraint passes only when it is **true** ("must return
  true"; delta-spark fails a null too), an invariant fails on false or null, a NOT NULL column on
  null, a given generated column unless ``(value <=> expression) IS TRUE``;
* with a dead-letter table, a violating record goes there (reason ``violates CHECK constraint
  <name>: <expr>``…), joined back to its Kafka key and value by source offset; the others are
  written. Such records do not count toward the undecodable-record threshold;
* without one, the rows are written as they come and the violations counted by the write itself
  (Spark's observed metrics: no second pass when there are none); :meth:`Enforced.raise_if_violated`
  then fails the batch before its commit, naming the rule and the first offending record (lowest
  topic, partition, offset; found by one more pass, on this failing path only):
  :class:`~airflow_eo.core.errors.ConstraintViolationError`, no retry, nothing committed (the staged
  files are orphans the next run collects).

The driver's own read (the direct path, no Spark) has no SQL engine, so a table with rules takes
the Spark path (:meth:`airflow_eo.driver.direct.DirectStage.of`): the same records give the same
result on every path.

Example::

    >>> out, enforced = enforce(out, features, attempt, dead)              # doctest: +SKIP
    >>> stage(out, ...); enforced.raise_if_violated()                       # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from airflow_eo.attempt import Attempt
from airflow_eo.spec import KEY_COLUMNS
from airflow_eo.spec.columns import REASON_COLUMN
from airflow_eo.driver.decode import functions_for
from airflow_eo.driver.dedup import observed_metrics
from airflow_eo.core.errors import ConfigError, ConstraintViolationError
from airflow_eo.table.features import Constraint, ConstraintKind, TableFeatures

log = logging.getLogger(__name__)

VIOLATION_COLUMN = "_airflow_eo_violation"


@dataclass(frozen=True)
class Enforced:
    """What :func:`enforce` did: the rules checked and how a violation surfaces."""

    rules: tuple[Constraint, ...] = ()
    observation: object = None  # the write's observed violations (no dead-letter table)
    violations: object = None  # DataFrame of violating rows, to count again when no metrics arrived
    batch: int = 0
    ingest_id: str = ""

    def raise_if_violated(self) -> None:
        """Fail the batch (before its commit) when a written row broke a rule."""
        if self.violations is None:
            return
        # the write's metrics; none within dedup's wait (or a stage retry that counted twice): count again
        count = observed_metrics(self.observation).get("violations")
        if count == 0:
            return
        # violations (or no metrics): one more pass finds the first offender, only on this failing path
        with functions_for(self.violations) as F:  # a warm session's process may be marked for Connect
            row = self.violations.orderBy(*[F.col(c) for c in KEY_COLUMNS]).limit(1).collect()
        if not row:
            return
        count, first = count or 1, row[0]
        topic, partition, offset, reason = (first[k] for k in ("topic", "partition", "offset", VIOLATION_COLUMN))
        raise ConstraintViolationError(
            f"batch {self.batch} of {self.ingest_id}: record {topic}[{partition}]@{offset} {reason}"
            f"{f' ({count} violating record(s) in all)' if count > 1 else ''}; a Delta writer must not add it. "
            "Nothing was committed; fix the transform or the data, or set dead_letter_table_uri to send such "
            "records there")


def enforce(out, features: TableFeatures, attempt: Attempt, dead=None, deleted=None):
    """``out`` (the transform's output) with the table's generated columns and its rows checked.

    ``dead``: the attempt's :class:`~airflow_eo.driver.dead_letters.DeadLetters` (violating
    records go there) or None (a violation fails the batch once written). ``deleted``: a column
    that marks rows that delete (merge): they write no row, so no rule applies to them.
    Returns (the rows to write, :class:`Enforced`)."""
    if not features.enforced:
        return out, Enforced()
    with functions_for(out) as F:
        rules = list(features.constraints)
        for column in features.generated:
            if column.name in out.columns:  # given: it must be what the expression computes
                rules.append(Constraint(ConstraintKind.GENERATED, column.name,
                                        f"`{column.name}` <=> ({column.expression})"))
            else:  # stored in the column's type, as delta-spark's write casts it (e.g. a BIGINT expression, INT column)
                out = out.withColumn(column.name, _expression(F, column.expression, column.name, "generated column")
                                     .cast(_spark_type(column.type)))
        reason = None
        for rule in reversed(rules):  # the first rule broken names the row's reason
            passes = F.coalesce(_expression(F, rule.expression, rule.name, rule.kind.value), F.lit(False))
            reason = F.when(~passes, F.lit(rule.reason)).otherwise(reason if reason is not None else F.lit(None))
        if reason is None:
            return out, Enforced()
        if deleted is not None:
            reason = F.when(deleted, F.lit(None)).otherwise(reason)
        checked = out.withColumn(VIOLATION_COLUMN, reason.cast("string"))
        try:
            _ = checked.columns  # an expression over a column the output lacks fails here (Connect: lazily)
        except Exception as exc:
            raise ConfigError(f"the table's rules cannot be evaluated on the transform's output ({_first_line(exc)}): "
                              "produce every column they name; nothing was committed") from exc
        violation = F.col(VIOLATION_COLUMN)
        log.info("batch %s: checking %d table rule(s): %s", attempt.plan.batch, len(rules),
                 "; ".join(f"{r.kind.value} {r.name}" for r in rules))
        if dead is not None:
            bad = checked.where(violation.isNotNull()).select(*KEY_COLUMNS, violation.alias(REASON_COLUMN))
            records = dead.decoded.select(*KEY_COLUMNS, "timestamp", "key", "value")
            dead.add(records.join(bad, on=list(KEY_COLUMNS), how="inner"))
            return checked.where(violation.isNull()).drop(VIOLATION_COLUMN), Enforced(tuple(rules))
        from pyspark.sql import Observation

        observation = Observation(f"airflow_eo_rules_{uuid.uuid4().hex[:12]}")
        # only a count rides along the write (a min over a struct per row costs several % more)
        observed = checked.observe(observation, F.count(violation).alias("violations"))
        return observed.drop(VIOLATION_COLUMN), Enforced(
            tuple(rules), observation, checked.where(violation.isNotNull()).select(*KEY_COLUMNS, violation),
            attempt.plan.batch, attempt.plan.ingest_id)


def _spark_type(delta_type: str):
    """A Delta type (its schema JSON) as Spark's: Delta's schema serialisation is Spark's."""
    from pyspark.sql.types import StructField

    return StructField.fromJson({"name": "c", "type": json.loads(delta_type), "nullable": True, "metadata": {}}).dataType


def _expression(F, text: str, name: str, kind: str):
    try:
        return F.expr(text)
    except Exception as exc:  # a parse error (classic parses here)
        raise ConfigError(f"the table's {kind} {name} ({text}) is not a Spark SQL expression airflow-eo can evaluate "
                          f"({_first_line(exc)}); nothing was committed") from exc


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
