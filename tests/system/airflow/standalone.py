"""A real ``airflow standalone`` for end-to-end tests, and a small REST client for it.

The server gets a fresh AIRFLOW_HOME (SQLite metadata DB), listens on 127.0.0.1 on a free
port and runs with the environment given by the caller (connections, DAG settings). It is
started as the leader of a new session (``start_new_session=True``) and stopped by PID:
SIGTERM to its process group, then SIGTERM/SIGKILL to every process still in its session
(task processes run in process groups of their own, but never leave the session), never
by name. Nothing here imports airflow: the test process keeps its own Airflow home.

Example::

    server = StandaloneAirflow(dags_dir, extra_env={...}).start()
    try:
        server.wait_ready()
        api = server.client()
        api.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False})
    finally:
        server.stop()
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import requests

from airflow_eo.demo.broker import free_port

VENV_BIN = os.path.dirname(sys.executable)
TERMINAL_RUN_STATES = {"success", "failed"}
FINISHED_TI_STATES = {"success", "failed", "skipped", "upstream_failed", "removed"}


class StandaloneError(AssertionError):
    pass


def session_pids(sid: int) -> list[int]:
    """PIDs of the live (non-zombie) processes whose session id is ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry))
    return found


def _signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class StandaloneAirflow:
    """``airflow standalone`` in a throw-away home, bound to 127.0.0.1."""

    def __init__(self, dags_dir: str, extra_env: dict[str, str] | None = None, home: str | None = None):
        self.home = home or tempfile.mkdtemp(prefix="airflow-eo-standalone-")
        self.dags_dir = dags_dir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(self.home, "standalone.log")
        self.process: subprocess.Popen | None = None
        self.env = self._environment(extra_env or {})

    def _environment(self, extra: dict[str, str]) -> dict[str, str]:
        # start from the test process's environment without any Airflow setting of its own
        # (tests/conftest.py points AIRFLOW_HOME and the connections elsewhere)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update({
            "AIRFLOW_HOME": self.home,
            "AIRFLOW__CORE__DAGS_FOLDER": self.dags_dir,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home}/airflow.db",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # the log servers of the scheduler (LocalExecutor) and the triggerer: free ports
            # (Airflow 3.3 binds them on all interfaces; their host is not configurable)
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(extra)
        return env

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "StandaloneAirflow":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [os.path.join(VENV_BIN, "airflow"), "standalone"], cwd=self.home, env=self.env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Until the API answers, the scheduler, triggerer and DAG processor heartbeat and the
        admin password is written."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise StandaloneError(f"airflow standalone exited with {self.process.returncode}\n{self.log_tail()}")
            try:
                r = requests.get(f"{self.base_url}/api/v2/monitor/health", timeout=5)
                last = r.text
                if r.ok:
                    health = r.json()
                    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
                    if all((health.get(p) or {}).get("status") == "healthy" for p in parts) \
                            and os.path.exists(self.password_file):
                        return
            except requests.RequestException as exc:
                last = repr(exc)
            time.sleep(1)
        raise StandaloneError(f"airflow standalone not ready after {timeout}s (last health: {last})\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group started here, wait; then every straggler of its session
        by PID (SIGTERM, then SIGKILL)."""
        if self.process is None:
            return
        sid = self.process.pid
        if self.process.poll() is None:
            try:
                os.killpg(sid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # task processes (own process groups) and their Spark jobs: SIGTERM once, wait
        _signal_pids(session_pids(sid), signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left := session_pids(sid):
            _signal_pids(left, signal.SIGKILL)
            time.sleep(1)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        if left := session_pids(sid):
            raise StandaloneError(f"processes of airflow standalone survived SIGKILL: {left}")

    def cleanup(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    # -- auth and REST ---------------------------------------------------------------
    @property
    def password_file(self) -> str:
        return os.path.join(self.home, "simple_auth_manager_passwords.json.generated")

    def client(self) -> "RestClient":
        with open(self.password_file) as f:
            password = json.load(f)["admin"]
        return RestClient(self.base_url, "admin", password)

    # -- debugging ---------------------------------------------------------------------
    def log_tail(self, lines: int = 150) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            return "(no standalone log)"
        return f"----- tail of {self.log_path} -----\n" + "".join(tail)

    def task_logs(self, dag_id: str, run_id: str | None = None, task_id: str | None = None) -> list[str]:
        """Task log files, oldest first (``$AIRFLOW_HOME/logs/dag_id=…/run_id=…/task_id=…``)."""
        pattern = os.path.join(self.home, "logs", f"dag_id={dag_id}", f"run_id={run_id or '*'}",
                               f"task_id={task_id or '*'}", "**", "*.log")
        return sorted(glob.glob(pattern, recursive=True), key=os.path.getmtime)

    def task_log_tail(self, path: str, lines: int = 80) -> str:
        try:
            with open(path, errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError as exc:
            return f"(cannot read {path}: {exc})"
        return f"----- tail of {path} -----\n" + "".join(tail)


class RestClient:
    """/api/v2 with a JWT from the simple auth manager's ``POST /auth/token``."""

    def __init__(self, base_url: str, username: str, password: str):
        self.base_url = base_url
        self.username = username
        self.password = password
        self.session = requests.Session()
        self.login()

    def login(self) -> None:
        r = requests.post(f"{self.base_url}/auth/token", json={"username": self.username, "password": self.password},
                          timeout=30)
        if r.status_code not in (200, 201):
            raise StandaloneError(f"POST /auth/token: {r.status_code} {r.text}")
        self.session.headers["Authorization"] = f"Bearer {r.json()['access_token']}"

    def request(self, method: str, path: str, expect: tuple[int, ...] = (200, 201), **kwargs):
        kwargs.setdefault("timeout", 60)
        for delay in (1, 2, 3, 5, 8, 13, 0):
            r = self.session.request(method, self.base_url + path, **kwargs)
            if r.status_code == 401:  # token expired: log in again once
                self.login()
                r = self.session.request(method, self.base_url + path, **kwargs)
            # SQLite (Airflow's quick-start database) refuses a write while the scheduler holds
            # its lock: "503 Database is locked" (e.g. backfill creation); nothing was written,
            # so ask again, as a user clicking again would
            if r.status_code != 503 or "database is locked" not in r.text.lower() or not delay:
                break
            time.sleep(delay)
        if r.status_code not in expect:
            raise StandaloneError(f"{method} {path}: {r.status_code} {r.text}")
        return r.json() if r.content else None

    def get(self, path: str, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs):
        return self.request("POST", path, **kwargs)

    def patch(self, path: str, **kwargs):
        return self.request("PATCH", path, **kwargs)

    # -- the calls the UI makes ----------------------------------------------------------
    def dag_runs(self, dag_id: str) -> list[dict]:
        runs, offset = [], 0
        while True:
            page = self.get(f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100, "offset": offset,
                                                                     "order_by": "run_after"})
            runs += page["dag_runs"]
            offset += len(page["dag_runs"])
            if not page["dag_runs"] or offset >= page["total_entries"]:
                return runs

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        page = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti for ti in page["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        entry = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}")
        value = entry["value"]
        return json.loads(value) if isinstance(value, str) else value

    def wait_runs(self, dag_id: str, run_ids: list[str], *, per_run_timeout: float = 300.0,
                  tick: Callable[[list[dict]], None] | None = None, poll: float = 2.0) -> dict[str, dict]:
        """Poll until every run in ``run_ids`` is finished; the clock restarts whenever one
        finishes. ``tick(active_runs)`` is called on every poll (e.g. to feed waiting
        sensors). Fails fast when one of them fails."""
        pending = set(run_ids)
        done: dict[str, dict] = {}
        deadline = time.monotonic() + per_run_timeout
        while pending:
            runs = {r["dag_run_id"]: r for r in self.dag_runs(dag_id)}
            if tick is not None:
                tick([r for r in runs.values() if r["state"] not in TERMINAL_RUN_STATES])
            for run_id in sorted(pending):
                run = runs.get(run_id)
                if run is None:
                    raise StandaloneError(f"dag run {run_id} of {dag_id} is gone")
                if run["state"] == "failed":
                    states = {t: ti["state"] for t, ti in self.task_instances(dag_id, run_id).items()}
                    raise StandaloneError(f"dag run {run_id} of {dag_id} failed: {states}")
                if run["state"] == "success":
                    pending.discard(run_id)
                    done[run_id] = run
                    deadline = time.monotonic() + per_run_timeout
            if pending and time.monotonic() > deadline:
                states = {r: (runs[r]["state"], {t: ti["state"] for t, ti in self.task_instances(dag_id, r).items()})
                          for r in sorted(pending)}
                raise StandaloneError(f"dag runs of {dag_id} not finished within {per_run_timeout}s: {states}")
            if pending:
                time.sleep(poll)
        return done
