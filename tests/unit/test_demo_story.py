"""The demo's terminal shows the story and, on a terminal, one status line while a run works;
whatever else the process and its children write lands in the log file."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap

from airflow_eo.demo.story import status_of

SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, time
    from airflow_eo.demo.story import Story
    with Story(sys.argv[1]) as story:
        story.say("broker up")
        print("noise from Python")
        subprocess.run(["sh", "-c", "echo noise from a child; echo child error >&2"])
        with story.working("run 1", every=0.05):
            with open(sys.argv[1], "a") as log:
                log.write("x [info ] batch 1 attempt ab12: plan orders[0] 0..5 (5 offsets) [airflow_eo.loop.ingest] loc=i.py:1\\n")
            time.sleep(0.5)
        story.say("committed", stamp=False)
""")


def run_story(tmp_path, stdout) -> str:
    log = tmp_path / "demo.log"
    subprocess.run([sys.executable, "-c", SCRIPT, str(log)], stdout=stdout, stderr=stdout, check=True, timeout=60)
    return log.read_text()


def test_a_pipe_gets_the_story_only_and_the_log_everything_else(tmp_path):
    out = tmp_path / "out"
    with open(out, "w") as f:
        text = run_story(tmp_path, f)
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and lines[0].endswith("] broker up") and lines[1] == "committed"
    assert "\r" not in out.read_text()  # no status line off a terminal
    for noise in ("noise from Python", "noise from a child", "child error", "==> broker up"):
        assert noise in text


def test_a_terminal_gets_a_status_line_from_the_log(tmp_path):
    leader, follower = pty.openpty()
    try:
        text = run_story(tmp_path, follower)
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the follower side is closed: all read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    screen = shown.decode()
    assert "run 1 … batch 1 attempt ab12: plan orders[0] 0..5 (5 offsets)" in screen
    assert "\r\x1b[K" in screen and "noise" not in screen and "committed" in screen
    assert "noise from a child" in text


def test_the_status_names_our_steps_not_airflows():
    hook = "[airflow.task.hooks.airflow.providers.apache.spark.hooks.spark_submit.SparkSubmitHook] loc=spark_submit.py:965"
    assert status_of(f"T [info ] 2026 INFO airflow_eo.driver.progress: batch 1: 2 of 3 Spark tasks done {hook}") == \
        "batch 1: 2 of 3 Spark tasks done"
    assert status_of(f"T [info ] Spark-Submit cmd: spark-submit --master local[2] {hook}").startswith("spark-submit")
    assert status_of("T [info ] Task instance state updated [airflow.api] loc=x.py:1") is None
