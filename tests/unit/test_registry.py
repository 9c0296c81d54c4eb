"""The Schema Registry client's answers and failures, and Avro values decoded from bytes in the
Confluent wire format. The registry's HTTP client is the boundary: a fake answers in its place,
with confluent-kafka's own schema and error types."""

from __future__ import annotations

import io
import json
import pickle

import fastavro
import pytest
from confluent_kafka.schema_registry import RegisteredSchema as ClientRegisteredSchema
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from airflow_eo.driver.avro import AvroColumn
from airflow_eo.errors import ConfigError, IncompatibleSchemaError, SchemaRegistryUnavailableError
from airflow_eo.registry import RegisteredSchema, SchemaRegistry, public_url

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

    def get_schema(self, schema_id: int) -> Schema:
        self._answer(("get_schema", schema_id))
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        schema = self.schemas[schema_id]
        return Schema(json.dumps(schema), "PROTOBUF" if schema.get("protobuf") else "AVRO")

    def _registered(self, subject: str, version: int) -> ClientRegisteredSchema:
        schema_id = self.subjects[subject][version - 1]
        return ClientRegisteredSchema(subject, version, schema_id, None, Schema(json.dumps(self.schemas[schema_id])))

    def get_latest_version(self, subject: str) -> ClientRegisteredSchema:
        self._answer(("get_latest_version", subject))
        if subject not in self.subjects:
            raise SchemaRegistryError(404, 40401, "Subject not found")
        return self._registered(subject, len(self.subjects[subject]))

    def get_version(self, subject: str, version: int) -> ClientRegisteredSchema:
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


def test_writer_schemas_are_fetched_once_per_id():
    reg = registry()
    assert json.loads(reg.writer_schema(1)) == V1 and json.loads(reg.writer_schema(1)) == V1
    assert reg.writer_schema(404) is None and reg.writer_schema(404) is None
    assert reg.fake.calls == [("get_schema", 1), ("get_schema", 404)]


def test_reader_schemas_by_subject_version():
    reg = registry()
    assert reg.version("orders-value") == RegisteredSchema("orders-value", 2, 2, json.dumps(V2))
    assert reg.version("orders-value", "1").schema_id == 1
    with pytest.raises(ConfigError, match="has no version 3 of subject 'orders-value'"):
        reg.version("orders-value", 3)
    with pytest.raises(ConfigError, match="has no version latest of subject 'payments-value'"):
        reg.version("payments-value")


def test_a_schema_that_is_not_avro_is_a_config_error():
    with pytest.raises(ConfigError, match="schema id 9 at http://registry:8081 is PROTOBUF, not Avro"):
        registry().writer_schema(9)


@pytest.mark.parametrize("failure, error, message", [
    (SchemaRegistryError(401, 40101, "Unauthorized"), ConfigError, "refused schema id 1 \\(401\\).*credentials"),
    (SchemaRegistryError(503, 50003, "Unavailable"), SchemaRegistryUnavailableError, "failed on schema id 1"),
    (SchemaRegistryError(422, 42201, "Invalid schema"), ConfigError, "rejected schema id 1: Invalid schema"),
    (ConnectionRefusedError("refused"), SchemaRegistryUnavailableError, "is not reachable \\(ConnectionRefusedError"),
])
def test_registry_failures_are_typed_and_never_show_credentials(failure, error, message):
    with pytest.raises(error, match=message) as err:
        registry(failure).writer_schema(1)
    assert "user" not in str(err.value) and "pw" not in str(err.value)
    assert err.type.retryable == (error is SchemaRegistryUnavailableError)


def test_urls_in_messages_have_no_user_info_and_a_registry_needs_one():
    assert public_url("https://key:secret@a.example.com:8081,http://b.example.com") == \
        "https://a.example.com:8081,http://b.example.com"
    with pytest.raises(ConfigError, match="has no 'url'"):
        SchemaRegistry({})


def test_a_registry_pickles_without_its_client_and_cache():
    reg = SchemaRegistry({"url": "http://registry:8081", "basic.auth.user.info": "u:p"})
    back = pickle.loads(pickle.dumps(reg))
    assert back.config == reg.config and back.url == "http://registry:8081" and back.config["timeout"] == 10


def column(reader: dict, reg=None, **kw) -> AvroColumn:
    return AvroColumn("value", "data", json.dumps(reader), registry=reg, **kw)


def test_each_record_is_read_with_its_writer_schema_and_resolved_to_the_reader():
    reg = registry()
    values = [wire(1, V1, {"id": 1, "item": "pen"}), wire(2, V2, {"id": 2, "item": "ink", "note": "blue"})]
    records, reasons = column(V2, reg).decode(values)
    assert records == [{"id": 1, "item": "pen", "note": None}, {"id": 2, "item": "ink", "note": "blue"}]
    assert reasons == [None, None]
    assert [c for c in reg.fake.calls if c[0] == "get_schema"] == [("get_schema", 1), ("get_schema", 2)]


def test_undecodable_values_become_dead_letters_with_their_reason():
    good = wire(1, V1, {"id": 1, "item": "pen"})
    values = [None, b"\x01abc", b"\x00\x00", wire(77, V1, {"id": 1, "item": "x"}), good[:-2], good + b"\x00\x00",
              good]
    records, reasons = column(V1, registry(), max_bytes=40).decode(values)
    assert records[:-1] == [None] * 6 and records[-1] == {"id": 1, "item": "pen"}
    assert reasons[0] == "value is null"
    assert "not in the Confluent wire format" in reasons[1] and "got first byte 1" in reasons[1]
    assert "not in the Confluent wire format" in reasons[2]
    assert reasons[3] == "unknown schema id 77 (not in the Schema Registry http://registry:8081)"
    assert reasons[4].startswith("value is not decodable as Avro (writer schema id 1)")
    assert reasons[5] == "value has 2 bytes after its Avro record (writer schema id 1)"
    assert reasons[6] is None
    too_big = column(V1, registry(), max_bytes=4).decode([good])[1]
    assert too_big == [f"value of {len(good)} bytes exceeds max_value_bytes=4"]


def test_a_writer_schema_the_reader_cannot_resolve_fails_the_batch():
    with pytest.raises(IncompatibleSchemaError, match="writer schema id 3 cannot be read as orders-value v2"):
        column(V1, registry(), reader_name="orders-value v2").decode([wire(3, INCOMPATIBLE, {"id": "x"})])


def test_inline_schemas_read_plain_avro_and_a_null_key_may_be_allowed():
    col = column(V1, null_is_bad=False)
    records, reasons = col.decode([avro(V1, {"id": 5, "item": "cup"}), None])
    assert records == [{"id": 5, "item": "cup"}, None] and reasons == [None, None]
