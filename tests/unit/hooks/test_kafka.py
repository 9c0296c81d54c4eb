"""KafkaConfigHook: the Kafka provider builds the config; callbacks become importable paths.

The connections are real Airflow connections (environment variables); only the MSK token
signer, an AWS SDK call, is stubbed at its module boundary.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
from confluent_kafka import Producer

from airflow_eo import kafka
from airflow_eo.core.errors import ConfigError
from airflow_eo.hooks.kafka import KafkaConfigHook

CALLS: list[str] = []


def oauth_cb(config_str: str) -> tuple[str, float]:
    """An allowlisted OAUTHBEARER callback, as a user would write one."""
    CALLS.append(config_str)
    return "token-from-idp", 4_102_444_800.0


def connect(monkeypatch, conn_id: str, extra: dict) -> dict:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kafka", "extra": extra}))
    config = KafkaConfigHook(conn_id).client_config()
    json.dumps(config)  # it travels to the Spark job as JSON
    return config


def test_sasl_scram_connection_passes_through_and_builds_a_client(monkeypatch):
    extra = {"bootstrap.servers": "broker-1:9096,broker-2:9096", "security.protocol": "SASL_SSL",
             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ingest", "sasl.password": "s3cr3t-scram"}
    config = connect(monkeypatch, "kafka_scram", extra)
    assert config == extra
    Producer(kafka.client_config(config))  # librdkafka accepts it (no connection is made)


def test_allowlisted_oauth_callback_travels_as_its_path(monkeypatch):
    path = f"{__name__}.oauth_cb"
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", path)
    config = connect(monkeypatch, "kafka_oauth", {"bootstrap.servers": "broker:9093",
                                                  "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                                                  "sasl.oauthbearer.config": "scope=ingest", "oauth_cb": path})
    assert config["oauth_cb"] == path
    resolved = kafka.client_config(config)  # what the Spark side does
    assert resolved["oauth_cb"] is oauth_cb
    assert resolved["oauth_cb"]("scope=ingest") == ("token-from-idp", 4_102_444_800.0) and CALLS[-1] == "scope=ingest"


def test_a_callback_not_in_the_allowlist_is_a_config_error(monkeypatch):
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", "some.other.cb")
    with pytest.raises(ConfigError, match=r"Kafka connection 'kafka_evil'.*not in the \[apache_kafka\] callback_allowlist"):
        connect(monkeypatch, "kafka_evil", {"bootstrap.servers": "broker:9093", "oauth_cb": "os.system"})


def test_msk_iam_is_detected_by_the_provider_and_signed_where_the_client_runs(monkeypatch):
    signed: list[str] = []
    signer = types.ModuleType("aws_msk_iam_sasl_signer")

    class MSKAuthTokenProvider:  # the AWS SDK call: stubbed at its boundary
        @staticmethod
        def generate_auth_token(region):
            signed.append(region)
            return f"msk-token-{region}", 1_900_000_000_000

    signer.MSKAuthTokenProvider = MSKAuthTokenProvider
    monkeypatch.setitem(sys.modules, "aws_msk_iam_sasl_signer", signer)
    config = connect(monkeypatch, "kafka_msk", {
        "bootstrap.servers": "b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9098",
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"})
    assert config["oauth_cb"] == kafka.MSK_IAM_CALLBACK and config[kafka.MSK_IAM_REGION] == "eu-west-1"
    resolved = kafka.client_config(config)
    assert kafka.MSK_IAM_REGION not in resolved  # ours, not librdkafka's
    assert resolved["oauth_cb"]("") == ("msk-token-eu-west-1", 1_900_000_000.0) and signed == ["eu-west-1"]
    Producer(resolved)


def test_kafka_connection_without_bootstrap_is_refused(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EMPTY", json.dumps({"conn_type": "kafka", "extra": {}}))
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        KafkaConfigHook("kafka_empty").client_config()
