"""Train backends (``actor.strategy`` / ``ref.strategy``: ``dp_policy``, ``megatron.policy``) and
value backends (``critic.strategy``: ``dp_value``, ``megatron.value``), registered by import string
in :mod:`flowrl.catalog.backends` so megatron-core is imported only when chosen."""
