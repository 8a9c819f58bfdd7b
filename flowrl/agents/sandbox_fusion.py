"""A client of SandboxFusion (bytedance/SandboxFusion), the remote sandbox verl uses.

One call is ``POST {url}/run_code`` with verl's JSON body (``code``, ``stdin``, ``language``,
``compile_timeout``, ``run_timeout``, ``memory_limit_MB``, ``files``, ``fetch_files``); the answer's
``run_result`` (``status``, ``return_code``, ``stdout``, ``stderr``) becomes a
:class:`~flowrl.agents.jail.JailResult`. Settings are verl's: ``sandbox_fusion.url``,
``max_concurrent`` (calls in flight per process, at most) and ``memory_limit_mb``. A request has a
timeout (the run's plus ``request_timeout_s``); connection errors and HTTP 5xx answers (verl
retries its gateway's 504) are retried ``max_retries`` times with a growing pause, then raise
:class:`SandboxUnreachable` naming the URL, the last error and the fixes. A ``url`` that already
ends in ``/run_code`` (verl's examples pass the full endpoint) is used as it is.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import lru_cache

from flowrl.agents.jail import JailResult

__all__ = ["FusionClient", "SandboxUnreachable"]


class SandboxUnreachable(RuntimeError):
    """The remote sandbox did not answer (after the retries) or answered with an error."""


@lru_cache(maxsize=None)
def _semaphore(url: str, max_concurrent: int) -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(max_concurrent)


@dataclass(frozen=True, kw_only=True)
class FusionClient:
    url: str
    """The service, e.g. ``http://sandbox:8080`` (or its ``.../run_code`` endpoint)."""
    max_concurrent: int = 64
    """Calls in flight to this URL from one process, at most (verl's ``max_concurrent``)."""
    memory_limit_mb: int = 1024
    """Memory limit of each call's process (verl's ``memory_limit_mb``)."""
    request_timeout_s: float = 10.0
    """Added to the run's timeout for one HTTP request (verl: 10 s)."""
    max_retries: int = 3
    """Tries of one call, at most, on connection errors and HTTP 5xx."""
    retry_delay_s: float = 1.0
    """Pause before the second try; the k-th pause is k times this."""

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"sandbox.url={self.url!r} is not an http(s) URL; use e.g. http://localhost:8080")
        for name in ("max_concurrent", "memory_limit_mb", "max_retries"):
            if getattr(self, name) < 1:
                raise ValueError(f"sandbox.{name}={getattr(self, name)!r} must be >= 1")

    @property
    def endpoint(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/run_code") else url + "/run_code"

    def body(self, code: str, stdin: str, run_timeout_s: float, language: str = "python") -> bytes:
        timeout = max(1, int(round(run_timeout_s)))
        return json.dumps({"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
                           "memory_limit_MB": self.memory_limit_mb, "language": language, "files": {},
                           "fetch_files": []}).encode()

    def run_code(self, code: str, *, stdin: str = "", run_timeout_s: float = 10.0, max_output_chars: int = 100_000,
                 language: str = "python") -> JailResult:
        """Run ``code`` remotely (blocking; at most ``max_concurrent`` at once per process)."""
        with _semaphore(self.endpoint, self.max_concurrent):
            answer = self._post(self.body(code, stdin, run_timeout_s, language), run_timeout_s + self.request_timeout_s)
        return to_result(answer, max_output_chars)

    def _post(self, body: bytes, timeout_s: float) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        last = ""
        for attempt in range(self.max_retries):
            if attempt:
                time.sleep(self.retry_delay_s * attempt)
            request = urllib.request.Request(self.endpoint, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code} {exc.reason}"
                if exc.code < 500:
                    break  # the request is wrong: another try answers the same
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            except ValueError as exc:
                raise SandboxUnreachable(f"SandboxFusion at {self.endpoint} answered with invalid JSON ({exc})") from None
        raise SandboxUnreachable(
            f"SandboxFusion at {self.endpoint} did not answer after {self.max_retries} tries (last: {last}); check "
            "sandbox.url and that the service runs, or run code locally in the jail (sandbox.mode=jail)")


def to_result(answer: dict, max_output_chars: int) -> JailResult:
    """A :class:`JailResult` from SandboxFusion's answer (verl's reading of its statuses)."""
    status = answer.get("status")
    if status == "SandboxError":
        raise SandboxUnreachable(f"SandboxFusion failed internally: {answer.get('message', answer)}")
    compile_result = answer.get("compile_result") or {}
    if compile_result.get("status") in ("Error", "TimeLimitExceeded") and not answer.get("run_result"):
        stderr = str(compile_result.get("stderr") or "")[:max_output_chars]
        return JailResult(1, "", stderr, timed_out=compile_result.get("status") == "TimeLimitExceeded")
    run = answer.get("run_result") or {}
    stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or "")
    timed_out = run.get("status") == "TimeLimitExceeded"
    code = None if timed_out else run.get("return_code", 0 if status == "Success" else 1)
    cut = len(stdout) > max_output_chars or len(stderr) > max_output_chars
    return JailResult(code, stdout[:max_output_chars], stderr[:max_output_chars], timed_out=timed_out, truncated=cut)
