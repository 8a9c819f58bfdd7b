"""Pre-flight: everything about a run that can be checked before any worker starts.

:func:`resolve_inputs` fills ``model.path``, ``data.train_files`` and ``trainer.run_dir``
(building the embedded default task when no model or data is given), checks that the files
exist and the model directories hold a valid ``config.json`` and weights, runs the chosen
backends' own checks (layouts against the model, installed packages, vLLM's head sizes), resolves
the algorithm family, the reward function, the run directory (derived from the run's identity,
writable: :mod:`flowrl.run.run_dir`) and the resume checkpoint, and reads every prompt row
(:mod:`flowrl.run.data_check`). A mistake raises :class:`~flowrl.config.ConfigError` naming the
key, the value and the fix, in well under a second for the defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

from flowrl.config import ConfigError, RunConfig
from flowrl.config.vlm_checks import check_vlm
from flowrl.config.vlm_critic_checks import check_vlm_scorers

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """Where the embedded default task is built once and reused."""
    return Path.home() / ".cache" / "flowrl"


def resolve_inputs(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its inputs filled in and checked (see the module docstring)."""
    if cfg.cluster.kind == "local":  # a script that starts workers without the __main__ guard: refused now
        from flowrl.actors.main_guard import check_script_guard

        check_script_guard()
    from flowrl.backends.preflight import check_backends
    from flowrl.config.moe_options import check_moe_options
    from flowrl.run.run_dir import resolve_run_dir
    from flowrl.run.sandbox_check import check_sandbox

    model_path, train_files, val_files = _inputs(cfg)
    check_model_dir("model.path", model_path)
    check_vlm(cfg, model_path=model_path)  # a vision-language model: dp/fsdp, hf, hybrid only (flowrl.config.vlm_checks)
    check_vlm_scorers(cfg, model_path=model_path)  # its critic and reward model (flowrl.config.vlm_critic_checks)
    from flowrl.config.lora_adapter_path import resolve_adapter

    cfg = resolve_adapter(cfg)  # model.lora_adapter_path: the adapter's rank, alpha and targets
    _check_files("data.train_files", train_files)
    if cfg.trainer.test_freq > 0:
        if not val_files:
            raise ConfigError("data.val_files", "", f"is empty while trainer.test_freq={cfg.trainer.test_freq}",
                              "point data.val_files at held-out Parquet prompts, or set trainer.test_freq=0")
        _check_files("data.val_files", val_files)
    if cfg.reward_model.enable:
        check_model_dir("reward_model.model_path", cfg.reward_model.model_path)
    if cfg.needs_critic and cfg.critic.model_path:
        check_model_dir("critic.model_path", cfg.critic.model_path)
    check_family(cfg, model_path=model_path)
    check_backends(cfg, model_path=model_path)
    check_moe_options(cfg, model_path=model_path)  # actor.router_replay, actor.moe_*_coeff
    check_loggers(cfg)
    check_reward_fn(cfg)
    check_sandbox(cfg)  # code the policy writes runs in a working sandbox (issue 38)
    from flowrl.config.verl_tool_config import check_tool_config

    check_tool_config(cfg)  # rollout.multi_turn.tool_config_path: verl's tool config loads
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(model_path)),
                              data=dataclasses.replace(cfg.data, train_files=train_files, val_files=val_files))
    run_dir = resolve_run_dir(cfg)
    resume_mode = cfg.trainer.resume_mode
    if resume_mode not in ("auto", "disable"):
        resume_mode = str(check_resume_path(cfg, resume_mode))
    elif resume_mode == "auto":
        check_auto_resume(run_dir)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, run_dir=str(run_dir), resume_mode=resume_mode))
    from flowrl.run.data_check import check_prompts

    check_prompts(cfg)
    return cfg


def check_model_dir(key: str, path: str) -> None:
    """``path`` is a transformers model directory: a ``config.json`` that parses, with a
    ``model_type``, and weight files (``*.safetensors`` / ``*.bin``, or their index)."""
    directory = Path(path)
    config = directory / "config.json"
    if not config.is_file():
        raise ConfigError(key, path, "is not a transformers model directory (no config.json)",
                          f"point {key} at a local directory saved with save_pretrained")
    try:
        loaded: Any = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(key, path, f"has an invalid config.json ({exc})",
                          "fix or re-create it (model.config.save_pretrained(DIR))") from None
    if not isinstance(loaded, dict) or not loaded.get("model_type"):
        raise ConfigError(key, path, "has a config.json without a model_type",
                          "re-create it with the model's config.save_pretrained(DIR)")
    weights = [p for pattern in ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
               for p in directory.glob(pattern)]
    if not weights:
        raise ConfigError(key, path, "holds no weight files (*.safetensors or *.bin)",
                          "save the model into it with model.save_pretrained(DIR)")


def check_reward_fn(cfg: RunConfig) -> None:
    """``algorithm.reward_fn`` resolves (a registered name, ``module:function`` or
    ``file.py:function``) on the driver, as the reward node will resolve it."""
    from flowrl.rewards import REWARD_FUNCTIONS, resolve_reward_fn

    name = cfg.algorithm.reward_fn
    try:
        resolve_reward_fn(name)
    except Exception as exc:  # noqa: BLE001 - a user's module may raise anything on import
        raise ConfigError("algorithm.reward_fn", name, f"does not resolve to a reward function ({type(exc).__name__}: "
                          f"{exc})", f"use one of {', '.join(REWARD_FUNCTIONS.names())}, package.module:function "
                          "or path/to/file.py:function (verl's signature)") from None


def _inputs(cfg: RunConfig) -> tuple[str, str, str]:
    """(model path, train files, val files): the config's, or the embedded default task's."""
    model_path, train_files, val_files = cfg.model.path, cfg.data.train_files, cfg.data.val_files
    if model_path and cfg.model.tiny != "default":
        raise ConfigError("model.tiny", cfg.model.tiny, "picks the embedded default task's model, but model.path is set",
                          "leave model.tiny=default with model.path, or drop model.path")
    if model_path and train_files:
        return model_path, train_files, val_files
    if bool(model_path) != bool(train_files):
        missing = "data.train_files" if model_path else "model.path"
        raise ConfigError(missing, "", "is empty while the other of model.path / data.train_files is set",
                          "set both, or neither for the embedded default task")
    from flowrl.tasks.default_task import default_task_dir, prepare_default_task

    cache = Path(cfg.trainer.cache_dir) if cfg.trainer.cache_dir else default_cache_dir()
    if cfg.algorithm.reward_fn == "code":  # the embedded code task (flowrl.tasks.code_task)
        from flowrl.tasks.code_task import prepare_code_task

        task = prepare_code_task(cache / "code_task", seed=cfg.trainer.seed)
    elif cfg.algorithm.reward_fn == "vlm_shapes":  # the embedded vision-language task (flowrl.tasks.vlm_shapes)
        from flowrl.tasks.vlm_shapes import prepare_vlm_shapes_task

        with _saying_if_slow(f"flowrl: building the embedded vision-language task in {cache / 'vlm_shapes'} "
                             "(a tiny Qwen2-VL warmed up on coloured shapes; about 2 min, once)"):
            task = prepare_vlm_shapes_task(cache / "vlm_shapes", seed=cfg.trainer.seed)
    elif cfg.rollout.multi_turn.enable:  # the embedded agentic task (flowrl.tasks.agent_task)
        from flowrl.tasks.agent_task import prepare_agent_task

        task = prepare_agent_task(cache / "agent_task", seed=cfg.trainer.seed)
    else:
        root = cache / default_task_dir(cfg.model.tiny)  # model.tiny: the preset (moe: its own cache)
        with _saying_if_slow(f"flowrl: building the embedded default task in {root} (a tiny model "
                             "warmed up on two-digit addition; about 30 s on an idle 2-core machine, once: later runs reuse it)"):
            task = prepare_default_task(root, seed=cfg.trainer.seed, preset=cfg.model.tiny)
    if cfg.trainer.test_freq > 0 and not val_files:
        val_files = str(task.test_path)  # validation: the default task's held-out split
    return str(task.model_dir), str(task.train_path), val_files


@contextlib.contextmanager
def _saying_if_slow(message: str, after_s: float = 2.0) -> Iterator[None]:
    """Print ``message`` (stderr) if the block is still running after ``after_s`` seconds: a cached
    task returns at once and says nothing, a first build says what the wait is."""
    timer = threading.Timer(after_s, lambda: print(message, file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _check_files(key: str, files: str) -> None:
    for f in files.split(","):
        if not Path(f).is_file():
            raise ConfigError(key, f, "no such file", f"point {key} at Parquet prompt files")


def check_loggers(cfg: RunConfig) -> None:
    """The packages of ``trainer.logger``'s sinks are installed (wandb, tensorboard)."""
    import importlib.util

    for name, module in (("wandb", "wandb"), ("tensorboard", "tensorboard")):
        if name in cfg.trainer.logger and importlib.util.find_spec(module) is None:
            raise ConfigError("trainer.logger", cfg.trainer.logger, f"names {name}, whose package is not installed",
                              f"pip install {module}, or drop {name} from trainer.logger")


def check_family(cfg: RunConfig, *, model_path: str | None = None) -> None:
    """``algorithm.family`` (or the family the estimator implies) names a registered family that
    takes this config (a vision-language ``model_path``: one that carries the images), and the
    cluster's pools host every worker group it declares."""
    from flowrl.config.pools import resolve_pools
    from flowrl.graphs.family import resolve_family

    try:
        family = resolve_family(cfg)(cfg)
    except ValueError as exc:
        raise ConfigError("algorithm.family", cfg.algorithm.family, str(exc),
                          "leave it empty (the family the estimator implies), or name a registered family "
                          "or package.module:Class") from None
    resolve_pools(cfg.cluster, {s.name: s.mesh.world_size for s in family.group_specs()})
    _check_family_images(cfg, type(family), model_path or cfg.model.path)


def _check_family_images(cfg: RunConfig, family: type, model_path: str) -> None:
    """A vision-language ``model.path`` trains only in a family whose graphs carry the images."""
    from flowrl.graphs.family import FAMILIES
    from flowrl.models.vlm_config import is_vlm_dir

    if family.takes_images or not model_path or not is_vlm_dir(model_path):
        return
    takers = [n for n in FAMILIES.names() if getattr(FAMILIES.get(n), "takes_images", False)]
    raise ConfigError("algorithm.family", cfg.algorithm.family or family.name, f"model.path={model_path} is a "
                      f"vision-language model, and the {family.name} family reads its data without the images "
                      "(it would train on the prompts' text alone)", f"use the {' or '.join(takers)} family")


def check_auto_resume(run_dir: Path) -> None:
    """``trainer.resume_mode=auto`` over damaged checkpoints (``latest`` missing or pointing
    elsewhere, a ``meta.json`` corrupt): a warning naming the damage and the intact checkpoint the
    run resumes from, or a ConfigError when none is intact; never a silent start from scratch."""
    from flowrl.checkpoint import latest_checkpoint
    from flowrl.checkpoint.loading import checkpoint_damage

    root = run_dir / "checkpoints"  # flowrl.run.checkpointing.checkpoint_root (which imports this module)
    damage = checkpoint_damage(root)
    if not damage:
        return
    found = latest_checkpoint(root)
    if found is None:
        raise ConfigError("trainer.resume_mode", "auto", f"finds no intact checkpoint in {root}: {'; '.join(damage)}",
                          "repair or remove the damaged checkpoint, point trainer.resume_mode at a complete one, "
                          "or start afresh with trainer.resume_mode=disable")
    log.warning("%s is damaged (%s); resuming from the newest intact checkpoint, %s", root, "; ".join(damage), found)


def check_resume_path(cfg: RunConfig, path: str) -> Path:
    """``trainer.resume_mode=PATH``: a complete checkpoint the run can load."""
    from flowrl.backends.preflight import check_checkpointable
    from flowrl.checkpoint import load_meta

    check_checkpointable(cfg, "trainer.resume_mode", path)
    resolved = Path(path).resolve()
    if not resolved.is_dir():
        raise ConfigError("trainer.resume_mode", path, "is neither auto, disable nor an existing checkpoint directory",
                          "use auto, disable or the path of a checkpoint (e.g. <run_dir>/checkpoints/step_00000010)")
    try:
        load_meta(resolved)
    except ValueError as exc:
        raise ConfigError("trainer.resume_mode", path, f"is not a loadable checkpoint: {exc}",
                          "point it at a complete checkpoint directory, or use auto / disable") from exc
    return resolved
