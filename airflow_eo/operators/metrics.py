"""Metrics of an ingest run through Airflow's ``Stats`` (StatsD or OpenTelemetry, as configured).

Every metric is emitted twice, as Airflow's own metrics are: tagged (``table``,
``ingest_id``, ``status``) under ``airflow_eo.<metric>``, and untagged under
``airflow_eo.<ingest_id>.<metric>`` for StatsD without tags.

======================================  =======  ==========================================
metric                                  kind     value
======================================  =======  ==========================================
``records_committed``                   counter  rows the run committed
``bytes_committed``                     counter  bytes of the data files it added
``dead_letters``                        counter  records sent to the dead-letter table
``late_records``                        counter  interval mode: records that arrived after their interval
``dropped_duplicates``                  counter  dedup_key: records dropped as duplicates of a stored key
``rows_inserted``                       counter  write_mode=merge: rows of new keys
``rows_updated``                        counter  write_mode=merge: rows replaced by their key's new row
``rows_deleted``                        counter  write_mode=merge: rows removed by their key's delete
``files_rewritten``                     counter  write_mode=merge: table files replaced by copies without changed keys
``batch_duration``                      timer    the run's wall time, planning to verified commit
``lag``                                 gauge    offsets Kafka holds beyond the table (all partitions)
``runs``                                counter  one per run, tagged with its ``status``
======================================  =======  ==========================================

Example::

    >>> emit_run_metrics(summary)      # doctest: +SKIP
"""

from __future__ import annotations

from datetime import timedelta

from airflow_eo.core.outcomes import RunStatus

PREFIX = "airflow_eo"


def _stats():
    from airflow.providers.common.compat.sdk import Stats

    return Stats


def emit_run_metrics(summary: dict) -> None:
    """Emit the metrics of one run from its summary (the operator's XCom)."""
    stats, ingest_id = _stats(), summary["ingest_id"]
    tags = {"table": summary["table_uri"], "ingest_id": ingest_id, "status": summary["status"]}

    def each(kind: str, metric: str, value) -> None:
        getattr(stats, kind)(f"{PREFIX}.{metric}", value, tags=tags)
        getattr(stats, kind)(f"{PREFIX}.{ingest_id}.{metric}", value)

    each("incr", "runs", 1)
    if RunStatus(summary["status"]).wrote_commit:
        each("incr", "records_committed", int(summary.get("rows") or 0))
        each("incr", "bytes_committed", int(summary.get("bytes") or 0))
        each("incr", "dead_letters", int(summary.get("dead_letters") or 0))
        if summary.get("duplicates"):
            each("incr", "dropped_duplicates", int(summary["duplicates"]))
        if summary.get("interval"):
            each("incr", "late_records", int(summary.get("late_records") or 0))
        from airflow_eo.sinks import recorded_sink  # at run time: a DAG file's import stays light

        for metric, value in recorded_sink(summary.get("write_mode") or "append").count_metrics(summary):
            each("incr", metric, value)
    if summary.get("seconds"):
        each("timing", "batch_duration", timedelta(seconds=float(summary["seconds"])))
    if summary.get("lag"):
        each("gauge", "lag", sum(summary["lag"].values()))
