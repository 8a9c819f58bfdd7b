"""Hydra's own command-line flags, as verl's ``python3 -m verl.trainer.main_ppo`` takes them.

* ``--config-path=DIR`` / ``-cp DIR`` and ``--config-name=NAME`` / ``-cn NAME``: the verl YAML to
  compose. A relative ``DIR`` is relative to ``verl/trainer/`` (where ``main_ppo.py`` lives, so
  ``--config-path=config`` is verl's own config tree, read from the installed wheel), else to the
  working directory. Without ``--config-path`` the name is looked up in verl's tree
  (``ppo_trainer``, ``ppo_megatron_trainer``). A user's directory whose ``defaults:`` extend
  verl's configs finds them: verl's tree is on Hydra's search path.
* ``+key=value`` (add), ``++key=value`` (add or override): the key is set as any other.
* ``~key`` (``~key=value``: only if it holds that value): the key is deleted from the composed
  config, and an earlier override of it on the same command line is dropped; flowrl then keeps its
  own setting for it.

``~key`` travels to the loader as ``~key=`` (:func:`encode_deletions`): the loader's override
parser needs a ``=``; :mod:`flowrl.config.verl_yaml` (``_hydra_override``) and :mod:`flowrl.config.verl_load` read it back.
"""

from __future__ import annotations

from pathlib import Path

from flowrl.config.errors import ConfigError

#: Hydra's flags -> the argparse destination of ``flowrl train|submit|config``.
FLAGS = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name", "-cn": "config_name"}
COMMANDS = ("train", "submit", "config")
DELETE_MARK = "="  # ``~key`` is passed on as ``~key=``


def flags_first(argv: list[str]) -> list[str]:
    """``argv`` with Hydra's flags (anywhere after the sub-command, ``--flag=V`` or ``--flag V``)
    moved right behind the sub-command as ``--flag=V``, so argparse reads them wherever they were."""
    if not argv or argv[0] not in COMMANDS:
        return argv
    flags, rest = [], []
    it = iter(argv[1:])
    for arg in it:
        name, eq, value = arg.partition("=")
        if name in FLAGS:
            if not eq:
                value = next(it, "")
            long = "--config-path" if FLAGS[name] == "config_path" else "--config-name"
            flags.append(f"{long}={value}")
        else:
            rest.append(arg)
    return [argv[0], *flags, *rest]


def config_file(config_path: str | None, config_name: str | None) -> Path | None:
    """The YAML file that ``--config-path``/``--config-name`` name (``None``: neither given)."""
    if config_path is None and config_name is None:
        return None
    from flowrl.config.verl_yaml import verl_config_dir

    tree = verl_config_dir()
    name = (config_name or "ppo_trainer").removesuffix(".yaml").removesuffix(".yml")
    if config_path is None:
        directory = tree
    elif Path(config_path).is_absolute():
        directory = Path(config_path)
    else:
        under_verl = tree.parent / config_path if tree is not None else None
        directory = under_verl if under_verl is not None and under_verl.is_dir() else Path(config_path)
    if directory is None:
        raise ConfigError("--config-name", config_name, "names a config of verl's tree, which is not installed",
                          "pip install --no-deps verl==0.9.1 (its YAML tree), or pass --config-path=DIR")
    for suffix in (".yaml", ".yml"):
        if (directory / f"{name}{suffix}").is_file():
            return directory / f"{name}{suffix}"
    flag = "--config-path" if config_path is not None else "--config-name"
    raise ConfigError(flag, config_path if config_path is not None else config_name,
                      f"{directory}/{name}.yaml is not a file",
                      "name a directory holding the config (verl's own: --config-path=config) and its name "
                      "(ppo_trainer, ppo_megatron_trainer)")


def encode_deletions(items: list[str]) -> list[str]:
    """Hydra's ``~key`` as ``~key=`` (the loader's parser wants a ``=``); other items as they are."""
    return [f"{item}{DELETE_MARK}" if item.startswith("~") and "=" not in item else item for item in items]


def is_deletion(key: str) -> bool:
    return key.startswith("~")


