"""Sinks: a table and what happens to a batch in it, one module per write mode behind one interface.

:mod:`~airflow_eo.sinks.base` the interface (:class:`~airflow_eo.sinks.base.Sink`), :mod:`~airflow_eo.sinks.append`,
:mod:`~airflow_eo.sinks.dedup`, :mod:`~airflow_eo.sinks.merge` the write modes, :mod:`~airflow_eo.sinks.dead_letters`
the dead-letter table, :mod:`~airflow_eo.sinks.registry` which sink writes a table (:func:`sink_of`).
"""

from airflow_eo.sinks.base import Sink
from airflow_eo.sinks.registry import kind_of, recorded_sink, sink_of, table_sink

__all__ = ["Sink", "kind_of", "recorded_sink", "sink_of", "table_sink"]
