"""A headless Chromium driven through its DevTools protocol: pages, viewports, script, screenshots.

What the UI page's layout check (:mod:`tests.system.airflow.ui_check`) needs and no more: the
browser from the operating system's packages (Debian's ``chromium``), one process with a profile
of its own in a temporary directory, pages opened and driven over one WebSocket (``websockets``,
already pinned as a dependency of Airflow's API server). Nothing is downloaded.

Example::

    >>> with Chromium() as browser:                                   # doctest: +SKIP
    ...     page = browser.page(1280, 800)
    ...     page.goto("http://127.0.0.1:8080/")
    ...     page.evaluate("document.title")
    'Airflow'
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

from websockets.sync.client import connect

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """A Chromium on PATH (``$CHROMIUM`` first)."""
    for name in (os.environ.get("CHROMIUM"), *BINARIES):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class BrowserError(RuntimeError):
    """The browser or a page did not do what was asked (a protocol error, a timeout, a script error)."""


class Chromium:
    """One headless Chromium process and its DevTools connection (a context manager)."""

    def __init__(self, binary: str | None = None, timeout: float = 60.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no Chromium on PATH: install Debian's package (apt-get install -y chromium) or set "
                               "$CHROMIUM to the browser's path")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="airflow-eo-chromium-")
        self.process: subprocess.Popen | None = None
        self._ws = None
        self._ids = itertools.count(1)
        self._events: list[dict] = []

    def __enter__(self) -> "Chromium":
        self.process = subprocess.Popen(
            [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
             f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.timeout
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BrowserError(f"{self.binary} did not open its DevTools port")
            time.sleep(0.05)
        port = open(port_file).read().split("\n")[0].strip()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=10) as answer:
            url = json.load(answer)["webSocketDebuggerUrl"]
        self._ws = connect(url, max_size=64 * 2**20, open_timeout=self.timeout)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float | None = None) -> dict:
        """One protocol command; its result (events that arrive meanwhile are kept for :meth:`wait_event`)."""
        message_id = next(self._ids)
        message: dict = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._ws.send(json.dumps(message))
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer within {timeout or self.timeout:.0f}s")
            answer = json.loads(self._ws.recv(timeout=left))
            if answer.get("id") == message_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            if "method" in answer:
                self._events.append(answer)

    def wait_event(self, method: str, session: str | None = None, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and (session is None or event.get("sessionId") == session):
                    return self._events.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no {method} within {timeout or self.timeout:.0f}s")
            try:
                answer = json.loads(self._ws.recv(timeout=left))
            except TimeoutError:
                continue
            if "method" in answer:
                self._events.append(answer)

    def page(self, width: int, height: int, incognito: bool = False) -> "Page":
        """A new tab at ``width`` × ``height`` CSS pixels (``incognito``: a context of its own, no cookies)."""
        params: dict = {"url": "about:blank"}
        if incognito:
            params["browserContextId"] = self.send("Target.createBrowserContext")["browserContextId"]
        target = self.send("Target.createTarget", params)["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime"):
            page.send(f"{domain}.enable")
        page.resize(width, height)
        return page


class Page:
    """One tab: navigate, run script in it, screenshot it."""

    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def send(self, method: str, params: dict | None = None, timeout: float | None = None) -> dict:
        return self.browser.send(method, params, self.session, timeout)

    def resize(self, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False})

    def goto(self, url: str, timeout: float = 60.0) -> None:
        """Navigate and wait for the load event."""
        self.browser._events = [e for e in self.browser._events if e.get("sessionId") != self.session]
        answer = self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise BrowserError(f"{url}: {answer['errorText']}")
        self.browser.wait_event("Page.loadEventFired", self.session, timeout)

    def evaluate(self, expression: str, timeout: float | None = None):
        """The JSON value of ``expression`` (awaited when it is a promise); a script error raises."""
        answer = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True, "userGesture": True}, timeout)
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            raise BrowserError(f"script error: {details.get('exception', {}).get('description') or details}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str | None = None) -> bool:
        """Poll ``expression`` until it is truthy (in JavaScript's sense: an element is)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(f"!!({expression})")
            except BrowserError:
                value = None  # e.g. the document is being replaced
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"waited {timeout:.0f}s for {what or expression}")
            time.sleep(0.1)

    def screenshot(self, path: str) -> str:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type ``text`` as keystrokes would (the page's own input handlers run)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", {"text": text})

    def click_on(self, selector: str) -> None:
        """A real mouse click in the middle of the element ``selector`` of this document."""
        x, y = self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                             "e.scrollIntoView({block: 'center'}); const b = e.getClientRects()[0]; "
                             "return [b.left + b.width / 2, b.top + b.height / 2]; })()")
        self.click(x, y)

    def click(self, x: float, y: float) -> None:
        """A real mouse click at (x, y) of the viewport (a user's gesture, unlike a script's click())."""
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
