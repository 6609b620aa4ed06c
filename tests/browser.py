"""A headless Chromium driven over the DevTools protocol, standard library only.

Chromium's ``--remote-debugging-pipe`` reads protocol commands from file descriptor 3 and writes
replies and events to descriptor 4, each a JSON object ended by a NUL byte; no websocket client,
driver binary or browser download is needed, only Debian's ``chromium``. Clicks are real input
events at an element's centre (after a hit test), so they reach the page the way a reader's do.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    def __init__(self, width: int = 1400, height: int = 1000, binary: str | None = CHROMIUM):
        if binary is None:
            raise RuntimeError("no chromium on PATH (apt-get install chromium)")
        self.width, self.height = width, height
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        to_browser, self._commands = os.pipe()
        self._replies, from_browser = os.pipe()

        def descriptors_3_and_4():  # runs in the child, before exec
            # Move both ends above 4 first: either may itself be descriptor 3 or 4.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self._proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=descriptors_3_and_4,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id = b"", 0

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:  # events (messages without our id) are not needed: skip them
            while b"\0" not in self._buffer:
                chunk = os.read(self._replies, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        page = Page(self, session["sessionId"])
        page.call("Page.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        page.goto(url)
        return page

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self._proc.wait(timeout=20)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()
        for fd in (self._commands, self._replies):
            os.close(fd)
        self._profile.cleanup()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def call(self, method: str, params: dict | None = None) -> dict:
        return self.browser.send(method, params, self.session)

    def goto(self, url: str) -> None:
        """Load ``url`` (again, if it is the current page) and wait until it has loaded."""
        # The marker is gone once a new document replaces this one; and a reload must not
        # restore the old scroll position after load, under a click already aimed.
        self.evaluate("window.__leaving = true; history.scrollRestoration = 'manual'")
        self.call("Page.navigate", {"url": url})
        self.wait_for("window.__leaving === undefined && document.readyState === 'complete'")

    def evaluate(self, expression: str, context: int | None = None):
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context is not None:
            params["contextId"] = context
        result = self.call("Runtime.evaluate", params)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:200]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20, in_child_frame: bool = False):
        """Poll ``expression`` until it is truthy; returns its value. ``in_child_frame``
        evaluates it in the page's (only) child frame, in a context made afresh for each poll:
        a frame that is still replacing its first document destroys a context made too early
        (a poll that loses its context that way counts as not yet)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                context = self.child_frame_context() if in_child_frame else None
                value = self.evaluate(expression, context)
            except RuntimeError as error:
                if not (in_child_frame and "Cannot find context" in str(error)):
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for: {expression[:300]}")
            time.sleep(0.05)

    def click(self, element: str) -> None:
        """Click the element that the JS expression ``element`` evaluates to, as a mouse would
        (waiting for it to appear: a click usually re-renders what the next one needs)."""
        self.wait_for(f"({element}) != null")
        # Aim once the element has stopped moving (menus slide in with CSS transitions).
        x, y, hit = self.evaluate(
            f"(async () => {{ const el = {element};"
            " el.scrollIntoView({block: 'center', inline: 'center'});"
            " const frame = () => new Promise(done => requestAnimationFrame(done));"
            " let last = '', same = 0;"
            " for (let i = 0; i < 300 && same < 3; i++) {"
            "   await frame(); const r = JSON.stringify(el.getBoundingClientRect());"
            "   same = r === last ? same + 1 : 0; last = r; }"
            " const r = el.getBoundingClientRect(), x = r.x + r.width / 2, y = r.y + r.height / 2;"
            " const top = document.elementFromPoint(x, y);"
            " return [x, y, top !== null && (el === top || el.contains(top))]; })()"
        )
        if not hit:
            raise AssertionError(f"{element} is covered or off screen at ({x:.0f}, {y:.0f})")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    def child_frame_context(self) -> int:
        """An execution context in the page's (only) child frame, e.g. an iframe's document."""
        tree = self.call("Page.getFrameTree")["frameTree"]
        children = tree.get("childFrames", [])
        if len(children) != 1:
            raise AssertionError(f"expected one child frame, found {len(children)}")
        frame = children[0]["frame"]["id"]
        world = self.call("Page.createIsolatedWorld", {"frameId": frame, "worldName": "check"})
        return world["executionContextId"]

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", {"format": "png"})
        Path(path).write_bytes(base64.b64decode(shot["data"]))
