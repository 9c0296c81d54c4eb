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
        # the UI page is a plugin of its own entry point (airflow.plugins), not listed under
        # "plugins" here: Airflow would load it twice and report the second as an error
        "config": {
            "airflow_eo": {
                "description": "airflow-eo's page in the Airflow UI (Browse > Exactly-once tables).",
                "options": {
                    "ui_enabled": {
                        "description": "Serve the page and show its navigation entry (API server restart to apply).",
                        "version_added": "0.1.0", "type": "boolean", "example": "False", "default": "True",
                    },
                    "ui_storage_conn_id": {
                        "description": "An aws connection the page reads object-store tables with "
                                       "(empty: deltalake's defaults, e.g. the API server's instance role).",
                        "version_added": "0.1.0", "type": "string", "example": "aws_tables", "default": "",
                    },
                },
            },
        },
    }
