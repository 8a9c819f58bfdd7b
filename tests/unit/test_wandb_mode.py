"""wandb goes online where ``wandb.init`` finds credentials (``WANDB_API_KEY``, ``~/.netrc`` from
``wandb login``, wandb's settings) and ``WANDB_MODE`` is the user's (issue 35, item 4).

The sink is tested against a fake ``wandb`` module (no network); the credential lookup itself
against the real wandb package, in a subprocess with its own ``HOME`` and ``.netrc``."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from flowrl.metrics.logger import WandbLogger, wandb_mode


class FakeWandb(types.ModuleType):
    """What the sink calls: ``login(prompt=False, verify=False)`` and ``init(...)``."""

    def __init__(self, logged_in: bool) -> None:
        super().__init__("wandb")
        self.logged_in, self.login_calls, self.inits, self.logged = logged_in, [], [], []

    def login(self, **kwargs):
        self.login_calls.append(kwargs)
        return self.logged_in

    def init(self, **kwargs):
        self.inits.append(kwargs)
        run = types.SimpleNamespace(log=lambda data, step: self.logged.append((step, data)), finish=lambda: None)
        return run


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


@pytest.mark.parametrize("logged_in, mode", [(True, "online"), (False, "offline")])
def test_credentials_as_wandb_finds_them_choose_online(clean_env, tmp_path, logged_in, mode):
    fake = FakeWandb(logged_in)
    clean_env.setitem(sys.modules, "wandb", fake)
    lines = []
    logger = WandbLogger(tmp_path, project="p", name="e", write=lines.append)
    assert fake.login_calls == [{"prompt": False, "verify": False}]  # never a prompt, never the network
    assert fake.inits[0]["mode"] == mode and fake.inits[0]["project"] == "p" and fake.inits[0]["name"] == "e"
    assert lines[0].startswith(f"wandb: {mode} (")
    assert ("wandb sync" in lines[0]) == (mode == "offline")
    logger.log(1, {"critic/score/mean": 0.5, "x": float("nan")})
    assert fake.logged == [(1, {"critic/score/mean": 0.5})]  # verl's step, non-finite values left out


@pytest.mark.parametrize("user_mode", ["offline", "disabled", "online"])
def test_wandb_mode_is_the_users(clean_env, user_mode):
    clean_env.setenv("WANDB_MODE", user_mode)
    fake = FakeWandb(logged_in=user_mode != "online")
    assert wandb_mode(fake) == (user_mode, "WANDB_MODE")
    assert fake.login_calls == []  # not even looked up


REAL_LOOKUP = "import wandb, flowrl.metrics.logger as l; print(l.wandb_mode(wandb)[0])"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("netrc", [True, False])
def test_real_wandb_finds_a_netrc_login(tmp_path, netrc):
    pytest.importorskip("wandb")
    home = tmp_path / "home"
    home.mkdir()
    if netrc:  # what `wandb login` writes
        (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {'a' * 40}\n")
        (home / ".netrc").chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "NETRC"))}
    env.update(HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config" / "wandb"))
    proc = subprocess.run([sys.executable, "-c", REAL_LOOKUP], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == ("online" if netrc else "offline")
