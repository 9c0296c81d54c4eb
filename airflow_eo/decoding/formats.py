"""Which column decoder decodes a column spec: one place that knows every format's decoder.

The read step's :class:`~airflow_eo.decoding.decoder.RecordDecoder` takes any
:class:`~airflow_eo.decoding.decoder.ColumnDecoder`; this module builds the one of a column spec —
Avro (:class:`~airflow_eo.decoding.avro.AvroColumn`), Protobuf
(:class:`~airflow_eo.decoding.protobuf.ProtobufColumn`), JSON Schema
(:class:`~airflow_eo.decoding.json_schema.JsonSchemaColumn`) — from its inline schema or from the
registry reader schema pinned for it, and checks it (the schema maps to columns, a Protobuf
``message_name`` is in its schema) before any Spark task starts: when an ingest is configured
(inline schemas), when a batch is planned and again when an attempt starts (registry schemas).

Example::

    >>> decoder_of(InlineAvro(source=Source.VALUE, schema='"long"')).spark_type().simpleString()
    'bigint'
"""

from __future__ import annotations

from airflow_eo.core.errors import ConfigError
from airflow_eo.core.planning import ReaderSchema
from airflow_eo.decoding.registry import SERIALIZED, FoundSchema, SchemaRegistry
from airflow_eo.spec.columns import (  # noqa: F401 - Source: the example
    ColumnSpec, InlineAvro, InlineJsonSchema, InlineProtobuf, RegistryAvro, RegistryColumn, RegistryJsonSchema,
    RegistryProtobuf, Source,
)


def registry_format(column: RegistryColumn) -> str | None:
    """The ``format`` a registry column asks its schemas in (Protobuf's serialized form)."""
    return SERIALIZED if isinstance(column, RegistryProtobuf) else None


def check_type(column: RegistryColumn, found: FoundSchema, which: str) -> None:
    """A subject of another schema type than the column's format is refused in one line."""
    if found.schema_type != column.schema_type:
        fmt, subject = column.source.option("value_format"), column.source.option("value_subject")
        raise ConfigError(f"{which} is a {found.schema_type} schema, not {column.format_name}: {fmt}="
                          f"{column.format!r} reads {column.format_name} subjects; set {fmt} to the subject's format, "
                          f"or {subject} to a {column.format_name} subject (nothing was committed)")


def decoder_of(column: ColumnSpec, registry: SchemaRegistry | None = None, pinned: ReaderSchema | None = None,
               found: FoundSchema | None = None):
    """The checked :class:`~airflow_eo.decoding.decoder.ColumnDecoder` of ``column``, or None when it is
    not decoded in the read step (raw, JSON + DDL); a registry column needs its ``pinned`` reader
    schema and that schema (``found``)."""
    from airflow_eo.decoding.avro import AvroColumn
    from airflow_eo.decoding.avro_types import check_schema

    decoder: object
    if isinstance(column, InlineAvro):
        check_schema(column.schema)
        return AvroColumn(column, column.schema, None, f"the inline {column.source.value} schema")
    if isinstance(column, InlineProtobuf):
        from airflow_eo.decoding.protobuf import ProtobufColumn
        from airflow_eo.decoding.protobuf_schemas import compile_proto

        schema = compile_proto(column.schema, where=f"the inline {column.source.value} schema "
                                                    f"({column.inline_option})")
        decoder = ProtobufColumn(column, schema, column.message_name)
    elif isinstance(column, InlineJsonSchema):
        from airflow_eo.decoding.json_schema import JsonSchemaColumn

        decoder = JsonSchemaColumn(column, column.schema, None, f"the inline {column.source.value} schema",
                                   validate=column.validate)
    elif isinstance(column, RegistryColumn):
        if pinned is None or found is None or registry is None:
            raise ConfigError(f"the {column.source.value} reader schema of {column.subject!r} was not resolved")
        check_type(column, found, str(pinned))
        if isinstance(column, RegistryAvro):
            check_schema(found.text)
            return AvroColumn(column, found.text, registry, str(pinned))
        if isinstance(column, RegistryProtobuf):
            from airflow_eo.decoding.protobuf import ProtobufColumn
            from airflow_eo.decoding.protobuf_schemas import registry_schema

            decoder = ProtobufColumn(column, registry_schema(found, registry, str(pinned)), column.message_name,
                                     registry, str(pinned), pinned.schema_id)
        elif isinstance(column, RegistryJsonSchema):
            from airflow_eo.decoding.json_schema import JsonSchemaColumn

            decoder = JsonSchemaColumn(column, found.text, registry, str(pinned), pinned.schema_id, column.validate)
        else:
            raise ConfigError(f"{column.format_name} through a Schema Registry is not supported")
    else:
        return None
    decoder.check()  # type: ignore[attr-defined]
    return decoder
