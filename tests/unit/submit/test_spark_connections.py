"""The `spark` connection examples of the README ("Running at scale"), read by Airflow's
own SparkSubmitHook: each resolves to the master, deploy mode, queue and namespace the
README promises. (YARN and Kubernetes clusters are not available here: this checks the
connections, not a run on those clusters.)"""

from __future__ import annotations

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

EXAMPLES = {
    "standalone": (
        '{"conn_type": "spark", "host": "spark://spark-master", "port": 7077, '
        '"extra": {"deploy-mode": "client", "spark-binary": "spark-submit"}}',
        {"master": "spark://spark-master:7077", "deploy_mode": "client"},
    ),
    "yarn": (
        '{"conn_type": "spark", "host": "yarn", '
        '"extra": {"deploy-mode": "cluster", "queue": "ingest", "spark-binary": "spark-submit"}}',
        {"master": "yarn", "deploy_mode": "cluster", "queue": "ingest"},
    ),
    "kubernetes": (
        '{"conn_type": "spark", "host": "k8s://https://k8s-api.example.com", "port": 6443, '
        '"extra": {"deploy-mode": "cluster", "namespace": "spark-jobs", "spark-binary": "spark-submit"}}',
        {"master": "k8s://https://k8s-api.example.com:6443", "deploy_mode": "cluster", "namespace": "spark-jobs"},
    ),
    "local": ('{"conn_type": "spark", "host": "local[2]"}', {"master": "local[2]", "deploy_mode": None}),
}


def resolve_without_k8s_client(conn_id: str) -> dict:
    """The hook's own connection parsing, without its constructor's check for the
    Kubernetes client (the cncf.kubernetes extra, not installed here)."""
    hook = SparkSubmitHook.__new__(SparkSubmitHook)
    hook._conn_id, hook.spark_binary, hook._yarn_queue, hook._deploy_mode = conn_id, None, None, None
    hook._principal = hook._keytab = None
    hook._conf = {}
    return hook._resolve_connection()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_readme_spark_connection_resolves(name, monkeypatch):
    value, expected = EXAMPLES[name]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", value)
    if name == "kubernetes":
        conn = resolve_without_k8s_client("spark_default")
    else:
        conn = SparkSubmitHook(conn_id="spark_default")._connection
    assert {k: conn[k] for k in expected} == expected
    assert conn["spark_binary"] == "spark-submit"


def test_kubernetes_masters_need_the_cncf_kubernetes_extra(monkeypatch):
    """What the README tells K8s users to install: without it the hook cannot start."""
    try:
        import airflow.providers.cncf.kubernetes.kube_client  # noqa: F401
        installed = True
    except ImportError:
        installed = False
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", EXAMPLES["kubernetes"][0])
    if installed:
        assert SparkSubmitHook(conn_id="spark_default")._is_kubernetes
    else:
        with pytest.raises((RuntimeError, NameError)):
            SparkSubmitHook(conn_id="spark_default")
