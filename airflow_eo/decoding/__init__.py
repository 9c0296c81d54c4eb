"""Decoding Kafka keys and values: Avro, Protobuf, JSON Schema (inline or through a Schema Registry), and the checks every decoded column gets.

What a column is decoded as is the spec's (:mod:`airflow_eo.spec.columns`: one typed spec per
column, built once from the options). This package does it, without Spark:

- :mod:`.decoder` — the one decoder interface (a column in, the decoded column and a dead-letter
  reason per record out), the checks before decoding, and the read step's :class:`.decoder.RecordDecoder`;
- :mod:`.avro` — Avro's decoder (fastavro), :mod:`.avro_columns` its logical types in Arrow,
  :mod:`.avro_types` Avro schemas → column types;
- :mod:`.protobuf` — Protobuf's decoder (Google's runtime), :mod:`.protobuf_types` descriptors → columns,
  :mod:`.protobuf_schemas` descriptors from the registry or protoc;
- :mod:`.json_schema` — JSON Schema's decoder (fastjsonschema, jsonschema), :mod:`.json_schema_types`
  schemas → columns;
- :mod:`.formats` — the decoder of a column spec; :mod:`.shared` what the decoders share;
- :mod:`.registry` — the Schema Registry client; :mod:`.reader_schemas` the reader schema
  versions resolved when a batch is planned and pinned in its plan.

The Spark glue — JSON parsed by ``from_json``, the dead-letter split — stays in the driver
(:mod:`airflow_eo.driver.decode`, :mod:`airflow_eo.driver.dead_letters`).
"""
