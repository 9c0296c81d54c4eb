"""Provider metadata for Airflow's providers manager (``airflow providers list``).

``package-name`` must equal the normalised distribution name (``airflow-eo``) or the
providers manager rejects the entry. The ``kafka`` connection type belongs to
apache-airflow-providers-apache-kafka: it is reused, not redefined, so users' existing
Kafka connections work unchanged.

Example::

    >>> provider_info()["package-name"]
    'airflow-eo'
"""

from __future__ import annotations


def provider_info() -> dict:
    from airflow_eo import __version__

    return {
        "package-name": "airflow-eo",
        "name": "airflow-eo",
        "description": "Exactly-once batch ingestion from Kafka into Delta Lake tables on Spark.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "airflow-eo",
                "external-doc-url": "https://github.com/airflow-eo/airflow-eo",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {"integration-name": "airflow-eo",
             "python-modules": ["airflow_eo.hooks.kafka", "airflow_eo.hooks.spark", "airflow_eo.hooks.storage"]},
        ],
        "operators": [
            {"integration-name": "airflow-eo",
             "python-modules": ["airflow_eo.operators.kafka_to_delta", "airflow_eo.operators.delta_maintenance",
                                   "airflow_eo.operators.delta_kafka_audit"]},
        ],
        "sensors": [
            {"integration-name": "airflow-eo", "python-modules": ["airflow_eo.sensors.kafka_backlog"]},
        ],
        "triggers": [
            {"integration-name": "airflow-eo", "python-modules": ["airflow_eo.triggers.kafka_backlog"]},
        ],
        "extra-links": ["airflow_eo.operators.kafka_to_delta.DeltaBatchLink"],
    }
