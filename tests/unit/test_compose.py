"""docker-compose.yml: valid against the Compose Specification (its JSON schema, checked with
check-jsonschema from PyPI, no Docker engine or docker-compose binary), every service the
example DAG needs is there and wired the way the DAG reads it, every image pinned, every
published port bound to 127.0.0.1, the stateful services health-checked. No Docker engine
runs here, so the stack itself is not started by this test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest
import yaml

from airflow_eo.attempt import Env

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
TABLES_VOLUME = "delta-tables"


def test_the_file_is_valid_for_the_compose_specification():
    """The official Compose Specification schema (vendored in check-jsonschema), offline."""
    check = subprocess.run([str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema",
                            "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture(scope="module")
def resolved() -> dict:
    """The file as Compose resolves it: anchors and ``<<`` merges applied (YAML does both),
    extension fields (``x-…``) dropped. It sets no ``${VAR}`` interpolation, checked here."""
    text = COMPOSE.read_text()
    assert "${" not in text, "interpolation is not resolved by this test: keep values literal"
    raw = yaml.safe_load(text)
    return {k: v for k, v in raw.items() if not k.startswith("x-")}


def test_published_ports_bind_loopback_and_stateful_services_are_health_checked(resolved):
    for name, svc in resolved["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
    for name in ("kafka", "postgres", "schema-registry"):
        assert resolved["services"][name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name in AIRFLOW_SERVICES:  # Airflow starts only after what it needs is healthy
        depends = resolved["services"][name]["depends_on"]
        assert depends["kafka"]["condition"] == depends["postgres"]["condition"] == "service_healthy"


def dockerfile_bases(path: Path) -> list[str]:
    """Base images of a Dockerfile, with ``ARG`` defaults substituted."""
    args, bases = {}, []
    for line in path.read_text().splitlines():
        if m := re.match(r"\s*ARG\s+(\w+)=(\S+)", line):
            args[m[1]] = m[2]
        elif m := re.match(r"\s*FROM\s+(\S+)", line, re.I):
            bases.append(re.sub(r"\$\{?(\w+)\}?", lambda a: args.get(a[1], a[0]), m[1]))
    return bases


def pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    return bool(tag) and tag != "latest" and "$" not in image


def test_every_image_and_base_image_is_pinned(resolved):
    images = {s: svc["image"] for s, svc in resolved["services"].items()}
    assert all(pinned(i) for i in images.values()), images
    for svc in resolved["services"].values():
        if "build" in svc:
            bases = dockerfile_bases(ROOT / svc["build"]["dockerfile"])
            assert bases and all(pinned(b) for b in bases), bases


def test_versions_match_the_project(resolved):
    """Airflow 3.3.2 and Spark = the pyspark the driver runs; one Python minor everywhere
    (PySpark refuses executors whose Python differs from the driver's)."""
    airflow_base = dockerfile_bases(ROOT / "docker/airflow/Dockerfile")[0]
    spark_base = dockerfile_bases(ROOT / "docker/spark/Dockerfile")[0]
    assert airflow_base == "apache/airflow:3.3.2-python3.11"
    assert spark_base.startswith(f"apache/spark:{pyspark.__version__}-")
    assert "python3.11 -m venv" in (ROOT / "docker/spark/Dockerfile").read_text()
    kafka = resolved["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    roles = kafka["environment"]["KAFKA_PROCESS_ROLES"]
    assert "controller" in roles and "broker" in roles  # KRaft: no ZooKeeper anywhere
    assert not any("zookeeper" in s for s in resolved["services"])


def dag_sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "dags").glob("*.py")))


def env_read_by(source: str) -> set[str]:
    """Environment variables the DAG files read, spelled out or through ``Env.NAME``."""
    names = set(re.findall(r"os\.environ(?:\.get)?[\[(]\s*[\"'](\w+)[\"']", source))
    return names | {getattr(Env, n) for n in re.findall(r"os\.environ(?:\.get)?[\[(]\s*Env\.(\w+)", source)}


def test_the_example_dag_finds_everything_it_reads(resolved):
    services = resolved["services"]
    for name in (*AIRFLOW_SERVICES, "kafka", "spark-master", "spark-worker", "spark-connect", "postgres"):
        assert name in services, f"service {name} missing"
    source = dag_sources()
    assert "KafkaToDeltaOperator" in source
    env_read = env_read_by(source)
    assert {Env.EXAMPLE_TABLE_URI, Env.EXAMPLE_TOPIC} <= env_read
    conn_ids = set(re.findall(r"_conn_id\s*=\s*[\"'](\w+)[\"']", source)) | {"kafka_default", "spark_default"}
    for name in AIRFLOW_SERVICES:
        svc = services[name]
        env = svc["environment"]
        assert env_read <= set(env), f"{name} lacks {env_read - set(env)}"
        for conn_id in conn_ids:
            assert f"AIRFLOW_CONN_{conn_id.upper()}" in env, f"{name} lacks connection {conn_id}"
        assert any(v.endswith(":/opt/airflow/dags:ro") or "/opt/airflow/dags" in v for v in svc["volumes"])

    scheduler = services["airflow-scheduler"]["environment"]
    kafka = json.loads(scheduler["AIRFLOW_CONN_KAFKA_DEFAULT"])
    host, port = kafka["extra"]["bootstrap.servers"].split(":")
    assert host in services and f"PLAINTEXT://{host}:{port}" in services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]

    # the table lives on the shared volume, at the same path for the driver and the executors
    table = scheduler["AIRFLOW_EO_TABLE_URI"]
    for name in ("airflow-scheduler", "spark-worker"):
        mounts = [v for v in services[name]["volumes"] if v.startswith(f"{TABLES_VOLUME}:")]
        assert mounts and table.startswith(mounts[0].split(":")[1] + "/"), (name, mounts)
    assert TABLES_VOLUME in resolved["volumes"]
    # the executors' interpreter is the same path on the driver and the workers
    assert scheduler["PYSPARK_PYTHON"] == services["spark-worker"]["environment"]["PYSPARK_PYTHON"]


def test_the_spark_connect_service_serves_the_warm_path(resolved, monkeypatch):
    """The spark_connect connection points at the spark-connect service: `airflow-eo connect-server`
    against the compose master (it declares this airflow-eo version itself), healthy only once its
    ready file exists, i.e. once it is warm. It shares the network namespace of the scheduler, where
    LocalExecutor runs the tasks, so they reach it as localhost."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from airflow_eo.cli import parser

    services = resolved["services"]
    service = services["spark-connect"]
    command = service["command"]
    assert command[:2] == ["airflow-eo", "connect-server"]
    args = parser().parse_args(command[1:])  # the command line this airflow-eo accepts
    assert args.master == "spark://spark-master:7077"
    port = args.port
    assert service["network_mode"] == "service:airflow-scheduler" and "airflow-scheduler" in service["depends_on"]
    assert services["airflow-scheduler"]["environment"]["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert f"127.0.0.1:{port}:{port}" in services["airflow-scheduler"]["ports"]
    # the executors on spark-worker reach the server's driver at the scheduler's name
    assert "spark.driver.host=airflow-scheduler" in args.conf and "spark.driver.bindAddress=0.0.0.0" in args.conf
    # healthy = ready: the health check tests the file the server creates once warm
    assert service["healthcheck"]["test"] == ["CMD", "test", "-f", args.ready_file]
    assert service["healthcheck"]["start_period"]  # the warm-up is not a failed check
    # the token file the command reads is the one the entrypoint writes from the environment
    assert args.token_file == service["environment"]["AIRFLOW_EO_CONNECT_TOKEN_FILE"]
    path = service["environment"]["PATH"].split(":")
    assert path[0] == os.path.dirname(services["spark-worker"]["environment"]["PYSPARK_PYTHON"])  # airflow-eo
    assert "/opt/spark/bin" in path  # spark-submit of the Spark distribution
    env = services["airflow-scheduler"]["environment"]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert SparkConnectHook("spark_connect_default").get_connection_url().startswith(f"sc://localhost:{port}")
    assert any(v.startswith(f"{TABLES_VOLUME}:") for v in service["volumes"])


def test_the_spark_image_holds_what_the_connect_server_command_imports():
    """The spark image's venv gets airflow-eo without its dependencies: what `airflow-eo
    connect-server` imports beyond the standard library must be installed there by name."""
    probe = ("import sys; before = set(sys.modules); import airflow_eo.cli, airflow_eo.submit.connect_server, "
             "pyspark.sql.connect.session; print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    third_party = {m for m in done.stdout.split() if m not in sys.stdlib_module_names and not m.startswith("_")}
    dockerfile = (ROOT / "docker" / "spark" / "Dockerfile").read_text()
    installed = set(re.search(r"constraints-3\.11\.txt \\\n\s+([^\\]+)\\", dockerfile).group(1).split())
    # imported under another name than installed, or brought by what is installed
    provided = {"pyspark": "pyspark-client", "confluent_kafka": "confluent-kafka", "google": "pyspark-client",
                "grpc": "pyspark-client", "grpc_status": "pyspark-client", "zstandard": "pyspark-client",
                "numpy": "pandas", "dateutil": "pandas", "pytz": "pandas", "yaml": "pyspark-client",
                "arro3": "deltalake", "typing_extensions": "deltalake", "six": "pandas", "airflow_eo": None,
                "py4j": None,  # this venv's full pyspark imports it, the image's pyspark-client does not
                "cython_runtime": None,  # a module Cython extensions register, not a package
                "grpc_tools": None}  # grpc imports it where it is installed (extra protobuf), never needs it
    missing = {m for m in third_party if provided.get(m, m) is not None and provided.get(m, m) not in installed}
    assert not missing, f"the spark image lacks {missing} (installed there: {installed})"


def test_the_spark_connect_service_takes_its_token_from_the_environment_and_refuses_to_start_without(
        resolved, tmp_path):
    """The server and the Airflow services that are its clients take SPARK_CONNECT_AUTHENTICATE_TOKEN
    from the environment of `docker compose up` (a key without a value: Compose passes the variable
    through; the file holds no token); the service's entrypoint exits with one line when it is unset,
    and otherwise writes it to the server's token file, readable by its owner only."""
    services = resolved["services"]
    token = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
    for name in ("spark-connect", *AIRFLOW_SERVICES):
        env = services[name]["environment"]
        assert token in env and env[token] is None, f"{name} must pass {token} through, not set it"
    entrypoint = services["spark-connect"]["entrypoint"]
    script = entrypoint[2].replace("$$", "$")  # Compose's escape of a literal $
    command = [sys.executable, "-c", "print('server started')"]
    token_file = tmp_path / "connect" / "token"
    env = {**{k: v for k, v in os.environ.items() if k != token}, "AIRFLOW_EO_CONNECT_TOKEN_FILE": str(token_file)}
    refused = subprocess.run([*entrypoint[:2], script, *entrypoint[3:], *command], env=env, capture_output=True,
                             text=True)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip() == ("spark-connect: set SPARK_CONNECT_AUTHENTICATE_TOKEN in the environment of "
                                      "docker compose up")
    assert not token_file.exists()
    started = subprocess.run([*entrypoint[:2], script, *entrypoint[3:], *command], env={**env, token: "t0k"},
                             capture_output=True, text=True)
    assert started.returncode == 0 and started.stdout == "server started\n", started.stderr
    assert token_file.read_text() == "t0k\n" and oct(token_file.stat().st_mode & 0o777) == "0o600"
    from airflow_eo.submit.connect_server import read_or_create_token

    assert read_or_create_token(str(token_file)) == "t0k"  # what the server then reads


def test_the_spark_connection_resolves_to_the_compose_master(resolved, monkeypatch):
    """Airflow's own SparkSubmitHook reads the connection exactly as set in the file."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    env = resolved["services"]["airflow-scheduler"]["environment"]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", env["AIRFLOW_CONN_SPARK_DEFAULT"])
    conn = SparkSubmitHook(conn_id="spark_default")._connection
    master = resolved["services"]["spark-master"]["command"]
    assert conn["master"] == f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    assert conn["deploy_mode"] == "client" and conn["spark_binary"] == "spark-submit"


def test_the_schema_registry_connection_points_at_the_registry_service(resolved, monkeypatch):
    """Avro DAGs' schema_registry_conn_id resolves to the schema-registry service, which stores
    its schemas in the compose Kafka."""
    from airflow_eo.hooks.schema_registry import schema_registry_config_of

    services = resolved["services"]
    registry = services["schema-registry"]
    listener_port = registry["environment"]["SCHEMA_REGISTRY_LISTENERS"].rsplit(":", 1)[1]
    assert registry["environment"]["SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS"] == "PLAINTEXT://kafka:9092"
    env = services["airflow-scheduler"]["environment"]
    monkeypatch.setenv("AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT", env["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])
    assert schema_registry_config_of("schema_registry_default")["url"] == f"http://schema-registry:{listener_port}"
