"""Peak memory of process trees while a block runs, sampled in a background thread.

Measured as PSS (proportional set size): PySpark forks its Python workers from a daemon, and
RSS would count the pages they share with it once per worker. :class:`TreeRss` watches this
process's children (spark-submit, its JVM, Python workers) for the cold path's memory,
:class:`PeakPss` one server's tree (the warm path's Spark Connect server).
"""

from __future__ import annotations

import threading
from typing import TypeVar

import psutil

S = TypeVar("S", bound="Sampler")


def tree_pss_mb(pid: int) -> float:
    """Proportional set size of a process and its children (shared pages counted once); 0 when it has ended."""
    total = 0
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:  # ended between two samples: nothing left to count
        return 0.0
    for proc in tree:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            continue
    return total / 2**20


class Sampler:
    """Calls :meth:`sample` every ``interval`` seconds in a thread of its own while the ``with`` block runs."""

    def __init__(self, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self: S) -> S:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class PeakPss(Sampler):
    """Peak PSS (MB) of a process tree (the server: JVM and Python workers) while the block runs."""

    def __init__(self, pid: int, interval: float = 0.25):
        super().__init__(interval)
        self.pid, self.peak = pid, 0.0

    def sample(self) -> None:
        self.peak = max(self.peak, tree_pss_mb(self.pid))


class TreeRss(Sampler):
    """Peak PSS (bytes) of this process's children, in total and of the JVMs and Python workers;
    processes in ``exclude`` (the broker) and their children are left out."""

    def __init__(self, exclude: set[int], interval: float = 0.2):
        super().__init__(interval)
        self.exclude = exclude
        self.peak = {"total": 0, "jvm": 0, "python": 0}
        self._me = psutil.Process()

    def sample(self) -> None:
        sample = {"total": 0, "jvm": 0, "python": 0}
        for child in self._me.children(recursive=True):
            try:
                if child.pid in self.exclude or child.ppid() in self.exclude:
                    continue
                rss = child.memory_full_info().pss
                kind = "jvm" if child.name() == "java" else ("python" if "python" in child.name() else None)
            except psutil.Error:
                continue
            sample["total"] += rss
            if kind:
                sample[kind] += rss
        self.peak = {k: max(v, sample[k]) for k, v in self.peak.items()}
