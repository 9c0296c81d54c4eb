"""A ``spark-submit`` on PATH that records its command line instead of starting Spark.

Airflow's SparkSubmitHook runs the binary its connection names; the command it builds is its
public behaviour, so the tests read that command here rather than calling the hook's
internals. The files shipped with ``--files`` are copied with their mode (they are removed
once the job ends).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass

import pytest

SCRIPT = """#!{python}
import json, os, shutil, stat, sys
argv = sys.argv[1:]
shipped = []
if "--files" in argv:
    for path in argv[argv.index("--files") + 1].split(","):
        copy = os.path.join({folder!r}, "shipped-" + os.path.basename(path))
        shutil.copyfile(path, copy)
        shipped.append({{"path": path, "copy": copy, "mode": stat.S_IMODE(os.stat(path).st_mode)}})
with open({record!r}, "a") as f:
    env = {{k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_EO_")}}
    f.write(json.dumps({{"argv": argv, "shipped": shipped, "env": env}}) + "\\n")
print("fake spark-submit: done")
"""


@dataclass(frozen=True)
class Call:
    """One spark-submit command line, the files it shipped (path → (content, mode)) and the
    AIRFLOW_EO_* variables of its environment."""

    argv: list
    shipped: dict
    env: dict

    def value_of(self, flag: str) -> str | None:
        return self.argv[self.argv.index(flag) + 1] if flag in self.argv else None

    @property
    def conf(self) -> dict:
        pairs = [self.argv[i + 1] for i, a in enumerate(self.argv) if a == "--conf"]
        return dict(p.split("=", 1) for p in pairs)


class SparkSubmitRecorder:
    def __init__(self, folder):
        self.folder = folder
        self.record = folder / "calls.jsonl"

    def calls(self) -> list[Call]:
        if not self.record.exists():
            return []
        found = []
        for line in self.record.read_text().splitlines():
            raw = json.loads(line)
            shipped = {s["path"]: (open(s["copy"]).read(), s["mode"]) for s in raw["shipped"]}
            found.append(Call(raw["argv"], shipped, raw["env"]))
        return found


@pytest.fixture
def spark_submit(tmp_path, monkeypatch) -> SparkSubmitRecorder:
    folder = tmp_path / "fake-spark"
    folder.mkdir()
    recorder = SparkSubmitRecorder(folder)
    binary = folder / "spark-submit"
    binary.write_text(SCRIPT.format(python=sys.executable, folder=str(folder), record=str(recorder.record)))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return recorder
