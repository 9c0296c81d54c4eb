"""Kafka client config from an Airflow connection of type ``kafka``.

The ``kafka`` connection type is the one apache-airflow-providers-apache-kafka defines
(bootstrap servers and librdkafka settings in the extras, e.g.
``{"bootstrap.servers": "broker:9092", "security.protocol": "SASL_SSL", ...}``), so
users' existing Kafka connections work unchanged. This hook only turns one into the
plain dict that airflow-eo hands to its Kafka clients and, through an environment
variable, to the Spark job.

Example::

    >>> config = KafkaConfigHook("kafka_default").client_config()     # doctest: +SKIP
    >>> config["bootstrap.servers"]                                    # doctest: +SKIP
    'broker:9092'
"""

from __future__ import annotations

import json
from typing import Any

from airflow.providers.apache.kafka.hooks.base import CALLBACK_CONFIG_KEYS, KafkaBaseHook

from airflow_eo.errors import ConfigError
from airflow_eo.kafka import SECRET_HINTS


def mask_config(config: dict[str, Any]) -> None:
    """Register the config's secrets with Airflow's log masker (task logs, rendered fields).

    The whole JSON form is masked too: it is what travels to the Spark job.
    """
    from airflow.sdk.log import mask_secret

    for key, value in config.items():
        if any(h in key.lower() for h in SECRET_HINTS) and value:
            mask_secret(str(value), key)
    if any(any(h in k.lower() for h in SECRET_HINTS) for k in config):
        mask_secret(json.dumps(config))


class KafkaConfigHook(KafkaBaseHook):
    """Reads a ``kafka`` connection (apache-airflow-providers-apache-kafka's type)."""

    hook_name = "Apache Kafka (airflow-eo)"

    def __init__(self, kafka_config_id: str = KafkaBaseHook.default_conn_name):
        super().__init__(kafka_config_id=kafka_config_id)

    def client_config(self) -> dict[str, Any]:
        """The connection's client config, JSON-serialisable, secrets registered for masking.

        Callback options (``oauth_cb``, ``error_cb``, …) are Python callables that cannot
        travel to the Spark job: they are refused with a message instead of dropped silently.
        """
        extra = dict(self.get_connection(self.kafka_config_id).extra_dejson)
        callbacks = sorted(k for k in CALLBACK_CONFIG_KEYS if k in extra)
        if callbacks:
            raise ConfigError(
                f"Kafka connection {self.kafka_config_id!r} sets callback option(s) {callbacks}, which "
                "cannot be passed to the Spark job: use SASL/SSL settings that are plain values"
            )
        if not extra.get("bootstrap.servers"):
            raise ConfigError(
                f"Kafka connection {self.kafka_config_id!r} has no 'bootstrap.servers' in its extra: set "
                'e.g. {"bootstrap.servers": "broker:9092"}'
            )
        mask_config(extra)
        return extra


def kafka_config_of(conn_id: str) -> dict[str, Any]:
    """The client config of the ``kafka`` connection ``conn_id`` (secrets masked in logs)."""
    return KafkaConfigHook(conn_id).client_config()
