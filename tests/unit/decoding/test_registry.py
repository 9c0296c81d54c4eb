"""The Schema Registry client's answers and failures. The registry's HTTP client is the boundary:
a fake answers in its place, with confluent-kafka's own schema and error types."""

from __future__ import annotations

import json
import pickle

import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from airflow_eo.decoding.registry import RegisteredSchema, SchemaRegistry, public_url
from airflow_eo.core.errors import ConfigError, SchemaRegistryUnavailableError
from tests.unit.decoding.fake_registry import V1, V2, registry


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
