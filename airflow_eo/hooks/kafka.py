"""Kafka client config from an Airflow connection of type ``kafka``.

The ``kafka`` connection type is the one apache-airflow-providers-apache-kafka defines
(bootstrap servers and librdkafka settings in the extras, e.g.
``{"bootstrap.servers": "broker:9092", "security.protocol": "SASL_SSL", ...}``), so
users' existing Kafka connections work unchanged, SASL/SCRAM, OAUTHBEARER callbacks and
Amazon MSK IAM included. This hook turns one into the plain dict that airflow-eo hands to
its Kafka clients and, through an environment variable, to the Spark job.

Example::

    >>> config = KafkaConfigHook("kafka_default").client_config()     # doctest: +SKIP
    >>> config["bootstrap.servers"]                                    # doctest: +SKIP
    'broker:9092'
"""

from __future__ import annotations

import json
from typing import Any

from airflow.providers.apache.kafka.hooks.base import CALLBACK_CONFIG_KEYS, KafkaBaseHook

from airflow_eo.compat import kafka_hook_config, msk_iam_region
from airflow_eo.core.errors import ConfigError
from airflow_eo.kafka import MSK_IAM_CALLBACK, MSK_IAM_REGION, SECRET_HINTS


def mask_config(config: dict[str, Any]) -> None:
    """Register the config's secrets with Airflow's log masker (task logs, rendered fields).

    The whole JSON form is masked too: it is what travels to the Spark job.
    """
    from airflow_eo.version_compat import mask_secret

    for key, value in config.items():
        if any(h in key.lower() for h in SECRET_HINTS) and value:
            mask_secret(str(value), key)
    if any(any(h in k.lower() for h in SECRET_HINTS) for k in config):
        mask_secret(json.dumps(config))


class KafkaConfigHook(KafkaBaseHook):
    """Reads a ``kafka`` connection (apache-airflow-providers-apache-kafka's type).

    The config is built by the provider's own ``KafkaBaseHook`` (bootstrap check, callbacks
    allowed by ``[apache_kafka] callback_allowlist``, Amazon MSK IAM detection), then made
    portable: it travels to the Spark job as JSON, so a callback becomes its importable path.
    """

    hook_name = "Apache Kafka (airflow-eo)"

    def __init__(self, kafka_config_id: str = KafkaBaseHook.default_conn_name):
        super().__init__(kafka_config_id=kafka_config_id)

    def client_config(self) -> dict[str, Any]:
        """The connection's client config, JSON-serialisable, secrets registered for masking."""
        original = dict(self.get_connection(self.kafka_config_id).extra_dejson)
        if not original.get("bootstrap.servers"):
            raise ConfigError(
                f"Kafka connection {self.kafka_config_id!r} has no 'bootstrap.servers' in its extra: set "
                'e.g. {"bootstrap.servers": "broker:9092"}'
            )
        try:
            built = kafka_hook_config(self)
        except Exception as exc:  # the provider's refusals: ValueError, missing optional feature
            raise ConfigError(f"Kafka connection {self.kafka_config_id!r}: {exc}") from exc
        config: dict[str, Any] = {}
        for key, value in built.items():
            if key in CALLBACK_CONFIG_KEYS and callable(value):
                config.update(self._portable_callback(key, value, original.get(key)))
            else:
                config[key] = value
        mask_config(config)
        return config

    def _portable_callback(self, key: str, value: Any, original: Any) -> dict[str, Any]:
        if isinstance(original, str):  # an allowlisted path: the Spark side imports the same one
            return {key: original}
        region = msk_iam_region(value)
        if region is not None:
            return {key: MSK_IAM_CALLBACK, MSK_IAM_REGION: region}
        raise ConfigError(
            f"Kafka connection {self.kafka_config_id!r} sets callback {key} to a Python object, which "
            "cannot be passed to the Spark job: give it as an importable path listed in "
            "[apache_kafka] callback_allowlist"
        )


def kafka_config_of(conn_id: str) -> dict[str, Any]:
    """The client config of the ``kafka`` connection ``conn_id`` (secrets masked in logs)."""
    return KafkaConfigHook(conn_id).client_config()
