"""The demo's two outputs: its story on the terminal, everything else in one log file.

While a :class:`Story` is open, file descriptors 1 and 2 point at the log file, so Airflow's
``dag.test()`` output, the ``airflow db migrate`` child, spark-submit's command line and banner,
the Spark driver's and the JVM's lines all land there, whoever writes them and however.
:meth:`Story.say` writes a line to the terminal the demo was started from. While Airflow and
Spark run, :meth:`Story.working` shows one self-overwriting status line on a terminal (the
elapsed time and the latest of our own log lines: the sensor, the plan, the driver's progress,
the commit); when the output is not a terminal it shows nothing, so a captured demo output
holds the story only.

Example::

    >>> with Story("/tmp/demo/demo.log") as story:      # doctest: +SKIP
    ...     story.say("broker up")
    ...     with story.working("run 1"):
    ...         run_the_dag()
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

# Our log lines worth showing as the status while a run works: (pattern, what to show; None: its group 1).
_STATUS = [
    (re.compile(r"backlog (\d+) reached"), "the sensor saw {} new records"),
    (re.compile(r"(batch \d+ attempt \w+: plan .*)"), None),
    (re.compile(r"Spark-Submit cmd"), "spark-submit started: the Spark JVM is starting"),
    (re.compile(r"INFO airflow_eo\.driver\.\w+: (batch \d+: .*)"), None),  # the driver's progress and commit
]
_LOGGER_SUFFIX = re.compile(r"\s+\[[\w.]+\]\s+loc=\S+.*$")  # structlog's " [logger] loc=file:line key=value…"


def status_of(line: str) -> str | None:
    """What a log line says about a run's progress, for the status line; None: nothing to show."""
    line = _LOGGER_SUFFIX.sub("", line)
    for pattern, shown in _STATUS:
        found = pattern.search(line)
        if found:
            return shown.format(*found.groups()) if shown else found.group(1)
    return None


class Story:
    """Terminal for the story, log file for everything else (see the module docstring)."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.started = time.monotonic()
        self._saved: tuple[int, int] | None = None
        self._terminal: TextIO | None = None
        self.tty = False
        self._lock = threading.Lock()
        self._status_shown = False

    def __enter__(self) -> "Story":
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        self._terminal = os.fdopen(os.dup(1), "w", buffering=1)
        self.tty = self._terminal.isatty()
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        return self

    def __exit__(self, *exc) -> None:
        self._clear_status()
        sys.stdout.flush()
        sys.stderr.flush()
        assert self._saved is not None and self._terminal is not None
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._terminal.close()

    def elapsed(self) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s]"

    def say(self, line: str, stamp: bool = True) -> None:
        """One line of the story on the terminal (and in the log, where it marks the step)."""
        with self._lock:
            self._clear_status()
            text = f"{self.elapsed()} {line}" if stamp else line
            assert self._terminal is not None
            self._terminal.write(text + "\n")
        print(f"==> {line}", flush=True)  # fd 1 is the log file here

    @contextlib.contextmanager
    def working(self, label: str, every: float = 0.5) -> Iterator[None]:
        """Show ``label``, the time and the latest status line from the log until the block ends."""
        if not self.tty:
            yield
            return
        stop = threading.Event()
        offset = os.path.getsize(self.log_path)  # here, not in the thread: the block may write at once
        thread = threading.Thread(target=self._show_status, args=(label, offset, stop, every), daemon=True,
                                  name="airflow-eo-demo-status")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)
            with self._lock:
                self._clear_status()

    def _show_status(self, label: str, offset: int, stop: threading.Event, every: float) -> None:
        latest = ""
        with open(self.log_path, errors="replace") as log:
            log.seek(offset)
            while not stop.wait(every):
                for line in log.read().splitlines():
                    latest = status_of(line) or latest
                try:
                    width = os.get_terminal_size(self._terminal.fileno()).columns if self._terminal else 0
                except OSError:
                    width = 0
                width = width or 100  # a terminal that does not say its size
                text = f"{self.elapsed()} {label} … {latest}"[: max(width - 1, 20)]
                with self._lock:
                    assert self._terminal is not None
                    self._terminal.write("\r\x1b[K" + text)
                    self._terminal.flush()
                    self._status_shown = True

    def _clear_status(self) -> None:
        if self._status_shown and self._terminal is not None:
            self._terminal.write("\r\x1b[K")
            self._terminal.flush()
            self._status_shown = False
