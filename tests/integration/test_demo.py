"""``airflow-eo demo`` as a new user runs it: its story in ≤ 30 lines, the rest in its log file,
nothing left behind outside its data directory (no temporary directory, no process)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

LINE_BUDGET = 30


def _ours(tmp: Path, prefixes=("airflow-eo-", "spark-", "blockmgr-")) -> set[str]:
    """What a demo could leave in a temporary directory: Airflow homes, Spark and broker scratch."""
    return {p.name for p in tmp.iterdir() if p.name.startswith(prefixes)} if tmp.is_dir() else set()


def _processes_naming(*paths: str) -> list[str]:
    """Command lines of live processes that name one of ``paths`` (the broker, Spark, Airflow children)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(p in cmdline for p in paths) and "pytest" not in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def test_demo_tells_its_story_in_30_lines_and_leaves_nothing_behind(tmp_path):
    data = tmp_path / "demo-data"
    own_tmp = tmp_path / "tmp"  # TMPDIR of the demo: anything it would leave in /tmp shows here
    own_tmp.mkdir()
    system_tmp = Path(tempfile.gettempdir())
    # the JVM ignores TMPDIR: Spark's own directories would land in /tmp (heavy jobs run one at a time)
    before = _ours(system_tmp, ("spark-", "blockmgr-", "airflow-eo-demo-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["TMPDIR"] = str(own_tmp)
    cli = str(Path(sys.executable).parent / "airflow-eo")
    done = subprocess.run([cli, "demo", "--dir", str(data), "--records", "3000"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    lines = done.stdout.splitlines()
    log = data / "demo.log"
    shown = done.stdout + done.stderr[-3000:] + (log.read_text()[-4000:] if log.exists() else "")
    assert done.returncode == 0, shown
    assert 10 <= len(lines) <= LINE_BUDGET, done.stdout
    assert done.stderr == "", done.stderr  # everything else went to the log file

    # the story: what it started, each run's plan and commit, the clear's no-op, the offsets, the verdict
    assert any("started Kafka" in line for line in lines) and any("started Airflow" in line for line in lines)
    for run in ("run 1", "run 2"):
        assert any(line.split("] ", 1)[-1].startswith(f"{run} (") and ": plan batch" in line for line in lines)
        assert any(f"{run}: committed batch" in line and " rows in " in line for line in lines), done.stdout
    assert any("clear of run 2" in line and "already_committed" in line and line.endswith(": a no-op")
               for line in lines), done.stdout
    assert sum("committed offset" in line and line.endswith("lag 0") for line in lines) == 3
    assert any(line.startswith("exactly once: 3000 records produced, 3000 committed by 2 runs, 3000 rows, "
                               "0 duplicates, 0 aborted records") for line in lines), done.stdout
    assert lines[-1] == f"full Airflow and Spark log: {log}"

    # the rest is in that log: Airflow's dag.test() and spark-submit's own output
    text = log.read_text()
    assert "Spark-Submit cmd: spark-submit" in text and "[DAG TEST]" in text and "==> run 1" in text

    # nothing outside the data directory: no temporary directory, no process still running
    assert list(own_tmp.iterdir()) == []
    assert _ours(system_tmp, ("spark-", "blockmgr-", "airflow-eo-demo-")) - before == set()
    assert not (data / "tmp").exists()
    assert _processes_naming(str(data), str(own_tmp)) == []
