"""The sandbox settings (issue 38): the ``sandbox`` section and verl's ``sandbox_fusion`` keys, the
pre-flight (no silent downgrade; the opt-in recorded), the SandboxFusion client against a local
HTTP server, and the ``code`` reward's verl comparisons."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flowrl.agents.jail import jail_problem
from flowrl.agents.sandbox import SANDBOX_ENV, SandboxSettings, run_code, sandbox_settings
from flowrl.agents.sandbox_fusion import FusionClient, SandboxUnreachable
from flowrl.config import ConfigError, load_config
from flowrl.config.loader import dump_config
from flowrl.rewards.code_tests import compare_call, compare_stdout, extract_program, parse_tests, score_results
from flowrl.run.sandbox_check import check_sandbox, code_runners

NO_JAIL = pytest.mark.skipif(jail_problem() is not None, reason=f"no jail here: {jail_problem()}")


def test_verl_sandbox_fusion_keys_map_onto_the_sandbox_section():
    cfg = load_config(None, ["sandbox_fusion.url=http://sf:8080", "sandbox_fusion.max_concurrent=8",
                             "reward.sandbox_fusion.memory_limit_mb=512"])
    assert (cfg.sandbox.url, cfg.sandbox.max_concurrent, cfg.sandbox.memory_limit_mb) == ("http://sf:8080", 8, 512)
    assert cfg.sandbox.resolved_mode == "remote" and load_config(None, []).sandbox.resolved_mode == "jail"
    with pytest.raises(ConfigError, match="needs sandbox.url"):
        load_config(None, ["sandbox.mode=remote"])
    with pytest.raises(ConfigError, match="sandbox.mode"):
        load_config(None, ["sandbox.mode=docker"])


def python_tool_config(*extra: str):
    return load_config(None, ["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[python]", *extra])


def test_code_runners_names_the_python_tool_and_the_code_reward():
    assert code_runners(load_config(None, [])) == []
    assert code_runners(python_tool_config()) == ["rollout.multi_turn.tools names 'python'"]
    assert code_runners(load_config(None, ["algorithm.reward_fn=code"])) == ["algorithm.reward_fn=code"]


def test_without_a_jail_a_code_running_config_stops_before_any_worker(monkeypatch):
    import flowrl.agents.jail as jail

    monkeypatch.setattr(jail, "jail_problem", lambda: "bubblewrap (bwrap) is not installed")
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    with pytest.raises(ConfigError) as err:
        check_sandbox(python_tool_config())
    text = str(err.value)
    assert "sandbox.mode" in text and "bwrap" in text and "apt-get install bubblewrap" in text
    assert "sandbox.url" in text and "sandbox.mode=unsafe-local" in text
    check_sandbox(load_config(None, []))  # nothing runs code: no jail needed


def test_the_unsafe_opt_in_warns_and_is_in_the_run_config(monkeypatch, tmp_path):
    import flowrl.agents.jail as jail

    monkeypatch.setattr(jail, "jail_problem", lambda: "bubblewrap (bwrap) is not installed")
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    cfg = python_tool_config("sandbox.mode=unsafe-local")
    with pytest.warns(RuntimeWarning, match="unsafe-local"):
        check_sandbox(cfg)
    assert sandbox_settings() == SandboxSettings(mode="unsafe-local")  # what the workers inherit
    dump_config(cfg, tmp_path / "config.yaml")
    assert "unsafe-local" in (tmp_path / "config.yaml").read_text()


class FakeFusion(BaseHTTPRequestHandler):
    """SandboxFusion's /run_code: runs nothing, answers from the request; ``fail_first`` 503s first."""

    fail_first = 0
    seen: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeFusion.seen.append((self.path, body))
        if FakeFusion.fail_first > 0:
            FakeFusion.fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        if "sleep" in body["code"]:
            time.sleep(2)
        out = {"status": "Success", "run_result": {"status": "Finished", "return_code": 0,
                                                   "stdout": body["stdin"].upper(), "stderr": ""}}
        data = json.dumps(out).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except BrokenPipeError:  # the client timed out first (the timeout test)
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def fusion():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeFusion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeFusion.seen, FakeFusion.fail_first = [], 0
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_the_fusion_client_posts_verls_request_and_retries(fusion):
    client = FusionClient(url=fusion, memory_limit_mb=256, retry_delay_s=0.01)
    FakeFusion.fail_first = 2
    result = client.run_code("print(input())", stdin="abc", run_timeout_s=3)
    assert result.ok and result.stdout == "ABC" and len(FakeFusion.seen) == 3
    path, body = FakeFusion.seen[-1]
    assert path == "/run_code" and body["memory_limit_MB"] == 256 and body["language"] == "python"
    assert body["run_timeout"] == 3 and body["stdin"] == "abc" and body["files"] == {}
    FakeFusion.fail_first = 5
    with pytest.raises(SandboxUnreachable, match="after 3 tries"):
        client.run_code("x")
    assert len(FakeFusion.seen) == 6  # bounded: three more tries


def test_the_fusion_client_times_out_and_reports_an_unreachable_service(fusion):
    slow = FusionClient(url=fusion, request_timeout_s=0.2, max_retries=1)
    start = time.monotonic()
    with pytest.raises(SandboxUnreachable):
        slow.run_code("sleep", run_timeout_s=0.1)
    assert time.monotonic() - start < 2
    gone = FusionClient(url="http://127.0.0.1:9", max_retries=2, retry_delay_s=0.01)
    with pytest.raises(SandboxUnreachable, match="127.0.0.1:9/run_code did not answer after 2 tries.*sandbox.url"):
        gone.run_code("print(1)")


def test_run_code_goes_to_the_remote_sandbox_in_remote_mode(fusion):
    import asyncio

    result = asyncio.run(run_code("ignored", stdin="hi", settings=SandboxSettings(mode="remote", url=fusion)))
    assert result.stdout == "HI"


def test_code_reward_comparisons_follow_verl():
    assert extract_program("text\n```python\nprint(1)\n```\nmore") == "\nprint(1)\n"
    assert extract_program("def f(x):return x") == "def f(x):return x"
    assert compare_call([1, 2], "[1, 2]") and compare_call(3, "[3]") and not compare_call(3, "4")
    assert compare_stdout("1 2\n3\n", "1 2\n3") and compare_stdout("1  2 3", "1 2\n3")
    assert compare_stdout("0.3333333", "0.33333331") and not compare_stdout("0.33", "0.34")
    assert score_results([True] * 12) == 1.0 and score_results([True, False] + [True] * 10) == 0.9
    assert score_results([]) == 0.0
    assert parse_tests({"assert_case": ["assert f(1)==1"]})["outputs"] == [None]
    with pytest.raises(ValueError):
        parse_tests('{"inputs": [1]}')


@NO_JAIL
def test_code_reward_scores_in_the_jail_as_verl_does(monkeypatch):
    from flowrl.rewards import resolve_reward_fn

    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    score = resolve_reward_fn("auto")
    calls = json.dumps({"fn_name": "f", "inputs": ["0", "1", "2\n3"], "outputs": ["1", "2", "[5]"]})
    assert score("apps", "def f(x, y=0):\n    return x + y + 1 if y == 0 else x + y", calls)["score"] == 1.0
    assert score("apps", "def f(x, y=0): return x + 1", calls)["score"] == pytest.approx(2 / 3)
    stdin = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
    assert score("codecontests", "a, b = map(int, input().split())\nprint(a + b)", stdin)["score"] == 1.0
    out = score("taco", "import os\nprint(open('/etc/passwd').read())", stdin)
    assert out["score"] == 0.0
    # only the inputs go into the sandbox; the outputs are compared outside it
    from flowrl.rewards.code_tests import _spec

    assert "outputs" not in _spec("print(1)", parse_tests(stdin), 5.0)[1]
    assert "outputs" not in _spec("print(1)", parse_tests(calls), 5.0)[1]
