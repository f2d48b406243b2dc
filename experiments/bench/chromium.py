"""Headless Chromium driven over the DevTools protocol: open a page, run script in it, take a
screenshot. Used by the viewer's benchmark and its browser tests; needs Debian's `chromium`
(scripts/install.sh installs it)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def chromium_binary() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    pass


class Chromium:
    """One headless browser with one page, closed (its whole process group, its profile) by
    `close` or the `with` block. Every call has a timeout; a script that throws raises."""

    def __init__(self, width: int = 1400, height: int = 900, timeout_s: float = 20.0) -> None:
        binary = chromium_binary()
        if binary is None:
            raise BrowserError(f"none of {BINARIES} is installed (scripts/install.sh installs Debian's chromium)")
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.profile = Path(tempfile.mkdtemp(prefix="opd-chromium-"))
        self.log = open(self.profile / "chromium.log", "wb")
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                 f"--user-data-dir={self.profile}", "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"]
        # Its temporary files (org.chromium.Chromium.*, left behind otherwise) go with the profile.
        (self.profile / "tmp").mkdir()
        env = {**os.environ, "TMPDIR": str(self.profile / "tmp")}
        # Its own session: `close` ends the wrapper script, the browser and its helpers together.
        self.proc = subprocess.Popen([binary, *flags], stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True, env=env)
        self.loop = asyncio.new_event_loop()
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.next_id = 0
        self.page_errors: list[str] = []  # uncaught exceptions and console.error calls, in order
        try:
            self.loop.run_until_complete(self._connect())
            self.send("Page.enable")
            self.send("Runtime.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    async def _connect(self) -> None:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BrowserError(f"chromium did not start: {self._log_tail()}")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self.http = aiohttp.ClientSession()
        async with self.http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            pages = [t for t in await resp.json() if t["type"] == "page"]
        # max_msg_size=0: a screenshot or a large evaluate result is one big message.
        self.ws = await self.http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)

    def _log_tail(self) -> str:
        self.log.flush()
        return (self.profile / "chromium.log").read_text(errors="replace")[-1500:]

    async def _send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events arrive in between: the page's errors are kept, the rest dropped
            message = json.loads((await self.ws.receive()).data)
            if message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.page_errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
            elif message.get("method") == "Runtime.consoleAPICalled" and message["params"]["type"] == "error":
                self.page_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in message["params"]["args"]))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message["result"]

    def send(self, method: str, timeout_s: float | None = None, **params: Any) -> dict[str, Any]:
        """One DevTools call; its result."""
        try:
            return self.loop.run_until_complete(asyncio.wait_for(self._send(method, params), timeout_s or self.timeout_s))
        except asyncio.TimeoutError:
            raise BrowserError(f"{method} took more than {timeout_s or self.timeout_s} s") from None

    def evaluate(self, expression: str, timeout_s: float | None = None) -> Any:
        """The value of a script in the page (a promise is awaited)."""
        result = self.send("Runtime.evaluate", timeout_s, expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"script failed: {details.get('exception', {}).get('description') or details.get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float | None = None) -> Any:
        """Poll a script until its value is truthy (a DOM node comes back as `{}`: ask for a
        boolean); that value. A script that throws counts as not
        yet (the page may still be loading); its last error is in the timeout's message."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        last = "false"
        while True:
            try:
                value = self.evaluate(expression)
                if value:
                    return value
            except BrowserError as err:
                last = str(err)
            if time.monotonic() > deadline:
                raise BrowserError(f"not true after {timeout_s or self.timeout_s} s ({last}): {expression}")
            time.sleep(0.02)

    def goto(self, url: str) -> None:
        """Start loading `url` (returns when navigation is committed, not when the page is loaded)."""
        result = self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"{url}: {result['errorText']}")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if self.ws is not None:
                self.loop.run_until_complete(self.ws.close())
            if self.http is not None:
                self.loop.run_until_complete(self.http.close())
        finally:
            self.loop.close()
            # The whole group, also when the first process is gone: its helpers may not be.
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    continue
                time.sleep(0.1)  # helpers leave right after the browser; SIGKILL any that stay
            self.log.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
