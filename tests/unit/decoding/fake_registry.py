"""A Schema Registry whose HTTP client is faked (confluent-kafka's own schema and error types),
and Avro test values: the registry logic runs for real without a server."""

from __future__ import annotations

import io
import json

import fastavro
from confluent_kafka.schema_registry import RegisteredSchema as ClientRegisteredSchema
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from airflow_eo.decoding.registry import SchemaRegistry

V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
INCOMPATIBLE = {**V1, "fields": [{"name": "id", "type": "string"}]}


class FakeClient:
    """Answers like confluent-kafka's SchemaRegistryClient for a few registered schemas."""

    def __init__(self, schemas: dict[int, dict], subjects: dict[str, list[int]], fail: Exception | None = None):
        self.schemas, self.subjects, self.fail = schemas, subjects, fail
        self.calls: list[tuple] = []

    def _answer(self, call: tuple):
        self.calls.append(call)
        if self.fail is not None:
            raise self.fail

    def get_schema(self, schema_id: int, subject_name=None, fmt=None) -> Schema:
        self._answer(("get_schema", schema_id))
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        schema = self.schemas[schema_id]
        return Schema(json.dumps(schema), "PROTOBUF" if schema.get("protobuf") else "AVRO")

    def _registered(self, subject: str, version: int) -> ClientRegisteredSchema:
        schema_id = self.subjects[subject][version - 1]
        return ClientRegisteredSchema(subject, version, schema_id, None, Schema(json.dumps(self.schemas[schema_id])))

    def get_latest_version(self, subject: str, fmt=None) -> ClientRegisteredSchema:
        self._answer(("get_latest_version", subject))
        if subject not in self.subjects:
            raise SchemaRegistryError(404, 40401, "Subject not found")
        return self._registered(subject, len(self.subjects[subject]))

    def get_version(self, subject: str, version: int, deleted=False, fmt=None) -> ClientRegisteredSchema:
        self._answer(("get_version", subject, version))
        if subject not in self.subjects or version > len(self.subjects[subject]):
            raise SchemaRegistryError(404, 40402, "Version not found")
        return self._registered(subject, version)


class FakeRegistry(SchemaRegistry):
    """The real registry logic over a fake HTTP client."""

    def __init__(self, client: FakeClient, url: str = "http://user:pw@registry:8081"):
        super().__init__({"url": url})
        self.fake = client

    @property
    def client(self):
        return self.fake


def registry(fail: Exception | None = None) -> FakeRegistry:
    return FakeRegistry(FakeClient({1: V1, 2: V2, 3: INCOMPATIBLE, 9: {"protobuf": True}},
                                   {"orders-value": [1, 2]}, fail))


def avro(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def wire(schema_id: int, schema: dict, record: dict) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + avro(schema, record)
