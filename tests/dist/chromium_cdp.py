"""A headless Chromium driven over the DevTools protocol (CDP), for the dashboard browser tests.

Debian's ``chromium`` package (``.ci/run`` installs it); the websocket client is tornado's (a
dependency of bokeh and distributed), so no selenium/chromedriver. Every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

#: JS: text of every shadow root and the document, canvases with a size, DataTable cells.
#: Bokeh 3 renders its widgets and plots inside shadow roots, which ``--dump-dom`` leaves out.
DOM_PROBE_JS = """
(() => {
  const out = {canvases: 0, cells: [], texts: [document.body ? document.body.innerText : ""], links: []};
  function walk(root) {
    for (const el of root.querySelectorAll("*")) {
      if (el.tagName === "CANVAS" && el.width > 0 && el.height > 0) out.canvases++;
      if (el.classList && el.classList.contains("slick-cell")) out.cells.push(el.textContent);
      if (el.tagName === "A" && el.href) out.links.push(el.href);
      if (el.shadowRoot) {
        const shown = !el.checkVisibility || el.checkVisibility();
        for (const child of (shown ? el.shadowRoot.children : [])) {
          if (child.tagName !== "STYLE" && child.tagName !== "LINK") out.texts.push(child.innerText || child.textContent || "");
        }
        walk(el.shadowRoot);
      }
    }
  }
  walk(document);
  out.text = out.texts.join("\\n");
  delete out.texts;
  return out;
})()
"""


#: JS: ``performance.now()`` (ms since the navigation started) once the Bokeh page has rendered:
#: every root view finished and a drawn canvas for each figure; else null.
RENDERED_MS_JS = """
(() => {
  if (!window.Bokeh || !Bokeh.documents.length || !Bokeh.index || !Bokeh.index.roots) return null;
  const roots = Bokeh.index.roots;
  if (!roots.length || !roots.every((v) => v.has_finished())) return null;
  const figures = [...Bokeh.documents[0].all_models].filter((m) => m.constructor.__name__ === "Figure").length;
  let canvases = 0;
  (function walk(root) {
    for (const el of root.querySelectorAll("*")) {
      if (el.tagName === "CANVAS" && el.width > 0 && el.height > 0) canvases++;
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  })(document);
  return canvases >= figures ? performance.now() : null;
})()
"""


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Chromium:
    """``with Chromium() as browser: browser.open(url); browser.evaluate("1 + 1")``."""

    def __init__(self, *, width: int = 1500, height: int = 2600, timeout_s: float = 60.0) -> None:
        binary = chromium_binary()
        if binary is None:
            raise RuntimeError("no chromium binary; fix: apt-get install -y chromium")
        self.timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="flowrl-chromium-")
        self._proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--hide-scrollbars", "--remote-debugging-port=0",
             "--remote-allow-origins=*", f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self._loop = asyncio.new_event_loop()
        self._ws: Any = None
        self._next_id = 0
        try:
            port = self._wait_port()
            self._connect(port)
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- plumbing
    def _wait_port(self) -> int:
        path = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._proc.returncode}")
            if path.is_file() and path.read_text().strip():
                return int(path.read_text().split()[0])
            time.sleep(0.1)
        raise TimeoutError(f"chromium did not open its DevTools port within {self.timeout_s}s")

    def _connect(self, port: int) -> None:
        from tornado.websocket import websocket_connect

        deadline = time.monotonic() + self.timeout_s
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
                pages = [t for t in json.load(resp) if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not pages:
            raise RuntimeError("chromium has no page target")
        url = pages[0]["webSocketDebuggerUrl"]

        async def connect() -> Any:
            return await websocket_connect(url, max_message_size=256 * 2**20)

        self._ws = self._run(connect())

    def _run(self, coro: Any, timeout_s: float | None = None) -> Any:
        return self._loop.run_until_complete(asyncio.wait_for(coro, timeout_s or self.timeout_s))

    def call(self, method: str, params: dict | None = None, *, timeout_s: float | None = None) -> dict:
        """One CDP command; events that arrive meanwhile are dropped."""
        self._next_id += 1
        msg_id = self._next_id

        async def roundtrip() -> dict:
            await self._ws.write_message(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
            while True:
                raw = await self._ws.read_message()
                if raw is None:
                    raise RuntimeError("chromium closed the DevTools connection")
                msg = json.loads(raw)
                if msg.get("id") == msg_id:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg.get("result", {})

        return self._run(roundtrip(), timeout_s)

    # ----------------------------------------------------------------- API
    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", {"url": url}, timeout_s=max(self.timeout_s, 180))  # a server builds the page first

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, *, timeout_s: float | None = None, poll_s: float = 0.25) -> Any:
        """Poll a JS expression until it is truthy; returns its value."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        last_error = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
                if value:
                    return value
            except (RuntimeError, TimeoutError) as exc:  # a JS error, or the page busy rendering
                last_error = exc
            time.sleep(poll_s)
        raise TimeoutError(f"{expression!r} not true within {timeout_s or self.timeout_s}s (last error: {last_error})")

    def first_render_ms(self, url: str, *, timeout_s: float = 120.0) -> float:
        """Open ``url`` and return the milliseconds from the navigation's start until the Bokeh
        page has rendered (:data:`RENDERED_MS_JS`, polled every 20 ms: at most that much late)."""
        self.open(url)
        return float(self.wait_for(RENDERED_MS_JS, timeout_s=timeout_s, poll_s=0.02))

    def probe(self) -> dict:
        return self.evaluate(DOM_PROBE_JS)

    def screenshot(self, path: str | Path) -> Path:
        """A full-page PNG."""
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics.get("contentSize")
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip})["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        stop_process(self._proc, timeout_s=10)
        self._loop.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def stop_process(proc: subprocess.Popen, *, timeout_s: float = 15) -> None:
    """End ``proc`` if it still runs: SIGTERM, then SIGKILL after ``timeout_s`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)
