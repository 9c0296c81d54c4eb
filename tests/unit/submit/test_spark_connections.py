"""The `spark` connection examples of docs/how-to/scale.md ("Running at scale"), as Airflow's own
SparkSubmitHook turns them into a spark-submit command line (a recording spark-submit:
tests/unit/submit/conftest.py): each gives the master, deploy mode, queue and namespace the
docs promise. (YARN and Kubernetes clusters are not available here: this checks the
connections, not a run on those clusters.)"""

from __future__ import annotations

import json

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.common.compat.sdk import BaseHook

EXAMPLES = {
    "standalone": (
        '{"conn_type": "spark", "host": "spark://spark-master", "port": 7077, '
        '"extra": {"deploy-mode": "client", "spark-binary": "spark-submit"}}',
        {"--master": "spark://spark-master:7077", "--deploy-mode": "client"},
    ),
    "yarn": (
        '{"conn_type": "spark", "host": "yarn", '
        '"extra": {"deploy-mode": "cluster", "queue": "ingest", "spark-binary": "spark-submit"}}',
        {"--master": "yarn", "--deploy-mode": "cluster", "--queue": "ingest"},
    ),
    "local": ('{"conn_type": "spark", "host": "local[2]"}', {"--master": "local[2]", "--deploy-mode": None}),
}
KUBERNETES = ('{"conn_type": "spark", "host": "k8s://https://k8s-api.example.com", "port": 6443, '
              '"extra": {"deploy-mode": "cluster", "namespace": "spark-jobs", "spark-binary": "spark-submit"}}')


def kubernetes_provider_installed() -> bool:
    try:
        import airflow.providers.cncf.kubernetes.kube_client  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_readme_spark_connection_becomes_the_promised_command(name, monkeypatch, spark_submit):
    value, expected = EXAMPLES[name]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", value)
    SparkSubmitHook(conn_id="spark_default", name="readme-example").submit("job.py")
    [call] = spark_submit.calls()
    assert {flag: call.value_of(flag) for flag in expected} == expected
    assert call.argv[-1] == "job.py" and call.value_of("--name") == "readme-example"


def test_the_kubernetes_example_names_the_api_server_namespace_and_cluster_mode(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", KUBERNETES)
    conn = BaseHook.get_connection("spark_default")
    assert (conn.host, conn.port) == ("k8s://https://k8s-api.example.com", 6443)
    assert conn.extra_dejson == json.loads(KUBERNETES)["extra"]


def test_kubernetes_masters_need_the_cncf_kubernetes_extra(monkeypatch):
    """What the docs tell K8s users to install: without it the hook cannot start."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", KUBERNETES)
    if kubernetes_provider_installed():
        SparkSubmitHook(conn_id="spark_default")
    else:
        with pytest.raises((RuntimeError, NameError)):
            SparkSubmitHook(conn_id="spark_default")
