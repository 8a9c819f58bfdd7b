"""verl's configuration keys as data: every leaf of verl 0.9.1's generated trainer configs
(``_generated_ppo_trainer.yaml``, ``_generated_ppo_megatron_trainer.yaml``) is in exactly one class:

* *mapped* (``map``, ``dyn``, ``derive``): it sets the flowrl setting that does the same;
* *accepted, no effect* (``noop``): a knob of verl's own implementation, its reason in one line,
  reported once at start;
* *refused by name* (``refuse``): a feature flowrl lacks, named; verl's "off" values (``accept``) pass.

Exact keys win over ``.*`` prefixes; longer prefixes win (so a lookup does not depend on the order of
the entries, and each key is in the table once). The table is held in one module per part of verl's
config, merged here:

* :mod:`~flowrl.config.verl_keys_trainer`: ``data``, ``trainer``, ``algorithm`` and verl's infrastructure;
* :mod:`~flowrl.config.verl_keys_actor`: ``actor_rollout_ref``'s actor, reference and model;
* :mod:`~flowrl.config.verl_keys_rollout`: ``actor_rollout_ref.rollout``;
* :mod:`~flowrl.config.verl_keys_critic_reward`: the critic and the reward model, managers and loop;
* :mod:`~flowrl.config.verl_keys_fsdp`: the FSDP engine (and Ulysses) of the actor, reference and critic;
* :mod:`~flowrl.config.verl_keys_megatron`: the Megatron engine of the actor, reference and critic.

:func:`flowrl.config.verl.classify` reads the table; ``python -m flowrl.config.verl_keys --write
docs/verl-keys.md`` writes its documentation (:func:`flowrl.config.verl_docs.document`; without
``--write`` it prints).
"""

from __future__ import annotations

# the verl values and names refused by name, and the knock-on refusals, live in verl_names
from flowrl.config.verl_names import AR, KNOCK_ON, REFUSED_VALUES, VERL_NAMES  # noqa: F401
from flowrl.config.verl_key import _NO, _OFF, VerlKey, _k  # noqa: F401 - the record of one key
from flowrl.config.verl_keys_actor import ACTOR_KEYS
from flowrl.config.verl_keys_critic_reward import CRITIC_REWARD_KEYS
from flowrl.config.verl_keys_fsdp import FSDP_KEYS
from flowrl.config.verl_keys_megatron import MEGATRON_KEYS
from flowrl.config.verl_keys_rollout import ROLLOUT_KEYS
from flowrl.config.verl_keys_trainer import TRAINER_KEYS

#: verl key -> flowrl key (or why not). Exact keys win over ``.*`` prefixes; longer prefixes win.
#: The trainer's part comes first: its data.max_response_length is the key the start-up notice of
#: verl's defaults names for rollout.response_length (flowrl.config.verl.default_differences).
VERL_KEYS: tuple[VerlKey, ...] = (*TRAINER_KEYS, *ACTOR_KEYS, *ROLLOUT_KEYS, *CRITIC_REWARD_KEYS, *FSDP_KEYS,
                                  *MEGATRON_KEYS)


def main(argv: list[str] | None = None) -> int:
    """``python -m flowrl.config.verl_keys [--write PATH]``: print (or write) ``docs/verl-keys.md``."""
    from flowrl.config.verl_docs import write_document

    return write_document(argv, VERL_KEYS, REFUSED_VALUES)


if __name__ == "__main__":
    raise SystemExit(main())
