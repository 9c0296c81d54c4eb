"""Reader schemas of registry columns: resolved once when a batch is planned, pinned in its plan, replayed from there.

"Read with the latest version of the subject" is a nondeterministic choice, like "read up to the
end offset": a retry after a new version was registered would decode the same records with
another reader schema. So the subject's version is resolved when the batch is planned
(:func:`pin`: one registry call per registry column), logged with the plan
(:attr:`airflow_eo.core.planning.BatchPlan.reader_schemas`) and recorded in the batch's commit
(:class:`airflow_eo.table.metadata.BatchFindings`); every attempt of that plan — a retry, a
clear, a reprocess months later — reads the pinned schema by its id (:func:`reader_schemas`).

A plan an earlier version logged has no pins: its attempt resolves the version when it starts,
as that version did, and says so in its log. So does an attempt whose spec now asks for another
subject or version than the plan pinned (a deliberate change, not a replay).

Example::

    >>> pins = pin(spec.decode.columns, {"url": "http://registry:8081"})          # doctest: +SKIP
    >>> pins                                                                         # doctest: +SKIP
    (ReaderSchema(column='value', subject='orders-value', version=3, schema_id=17, requested='latest'),)
"""

from __future__ import annotations

import logging
from typing import Mapping

from airflow_eo.decoding.formats import check_type, decoder_of, registry_format
from airflow_eo.decoding.registry import FoundSchema, SchemaRegistry
from airflow_eo.core.errors import ConfigError
from airflow_eo.core.planning import BatchPlan, ReaderSchema
from airflow_eo.spec.columns import ColumnSpec, RegistryColumn, Source, require_registry

log = logging.getLogger(__name__)


def pin(columns: tuple[ColumnSpec, ...], registry_config: Mapping[str, object] | None) -> tuple[ReaderSchema, ...]:
    """The reader schema version each registry column of ``columns`` reads (plan time), each checked
    (its type is the column's format, it maps to columns, a Protobuf ``message_name`` is in it)."""
    wanted = [c for c in columns if isinstance(c, RegistryColumn)]
    if not wanted:
        return ()
    require_registry(columns, registry_config is not None)
    registry = SchemaRegistry(dict(registry_config or {}))
    pins = []
    for column in wanted:
        pinned, found = _resolve(registry, column)
        decoder_of(column, registry, pinned, found)  # refused now, before the plan is logged
        pins.append(pinned)
    return tuple(pins)


def _resolve(registry: SchemaRegistry, column: RegistryColumn) -> tuple[ReaderSchema, FoundSchema]:
    if not column.subject:
        raise ConfigError(f"{column.source.option('value_subject')} is not set: name the registry subject of the "
                          f"{column.source.value}s' reader schema")
    found = registry.version(column.subject, column.requested, fmt=registry_format(column))
    pinned = ReaderSchema(column.source.value, found.subject, found.version, found.schema_id, column.requested)
    check_type(column, found.found, str(pinned))
    return pinned, found.found


def pinned_for(column: RegistryColumn, pins: tuple[ReaderSchema, ...] | None) -> ReaderSchema | None:
    """The pin of ``column`` among ``pins``: same column, subject and requested version."""
    return next((p for p in pins or () if (p.column, p.subject, p.requested) ==
                 (column.source.value, column.subject, column.requested)), None)


def reader_schemas(columns: tuple[ColumnSpec, ...], registry: SchemaRegistry | None,
                   plan: BatchPlan) -> dict[Source, tuple[ReaderSchema, FoundSchema]]:
    """The reader schema and the schema itself of each registry column an attempt of ``plan`` decodes
    (attempt time): the plan's pin, fetched by its schema id; resolved now where it has none."""
    found: dict[Source, tuple[ReaderSchema, FoundSchema]] = {}
    for column in columns:
        if not isinstance(column, RegistryColumn) or registry is None:
            continue
        pinned = pinned_for(column, plan.reader_schemas)
        if pinned is None:
            found[column.source] = _resolve(registry, column)
            why = ("its plan was logged without reader schema versions (by an earlier version of airflow-eo)"
                   if plan.reader_schemas is None else "the spec asks for another subject or version than its plan "
                   "pinned")
            log.info("batch %s: %s; the %s reader schema (%s %s) is resolved now: %s", plan.batch, why,
                     column.source.value, column.subject, column.requested, found[column.source][0])
            continue
        schema = registry.schema(pinned.schema_id, fmt=registry_format(column))  # an id never changes its schema
        if schema is None:
            raise ConfigError(
                f"the {column.source.value} reader schema pinned in the plan of batch {plan.batch}, {pinned}, is no "
                f"longer in the Schema Registry at {registry.url}: register it again (nothing was committed)")
        log.info("batch %s: the %s reader schema is %s, pinned in its plan", plan.batch, column.source.value, pinned)
        found[column.source] = (pinned, schema)
    return found
