"""Schema Registry client config from an Airflow connection (real connections via environment)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from airflow_eo.core.errors import ConfigError
from airflow_eo.hooks.schema_registry import schema_registry_config_of


def connection(monkeypatch, conn_id: str, **fields) -> dict:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    config = schema_registry_config_of(conn_id)
    SchemaRegistryClient(config)  # confluent-kafka accepts every key (it refuses unknown ones)
    return config


def test_basic_auth_and_tls_settings(monkeypatch):
    config = connection(monkeypatch, "registry_basic", conn_type="http", host="https://registry.example.com",
                        port=8081, login="api-key", password="api-secret",
                        extra={"ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt", "timeout": 5})
    assert config == {"url": "https://registry.example.com:8081", "basic.auth.user.info": "api-key:api-secret",
                      "ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt", "timeout": 5}


def test_scheme_from_the_schema_field_and_a_bearer_token(monkeypatch):
    config = connection(monkeypatch, "registry_bearer", conn_type="http", host="registry", schema="https",
                        extra={"bearer_token": "tok-123", "bearer.auth.logical.cluster": "lsrc-1",
                               "bearer.auth.identity.pool.id": "pool-1"})
    assert config["url"] == "https://registry"
    assert config["bearer.auth.credentials.source"] == "STATIC_TOKEN" and config["bearer.auth.token"] == "tok-123"
    assert "bearer_token" not in config


def test_a_connection_without_host_is_a_config_error(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_REGISTRY_EMPTY", json.dumps({"conn_type": "http"}))
    with pytest.raises(ConfigError, match="'registry_empty' has no host"):
        schema_registry_config_of("registry_empty")
