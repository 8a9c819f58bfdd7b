"""Roles: what a rank actor holds. Thin glue between experience tables and an engine.

``PolicyRole`` (trained actor), ``ReferenceRole`` (frozen reference), ``RolloutRole``
(generation), ``CriticRole`` (PPO value model), ``RewardModelRole`` (neural reward), and
``HybridRole`` (``cluster.placement=hybrid``: policy, rollout and reference in one process,
generation on the training parameters where the layouts agree; ``memory`` counts what a rank
holds). The rank actor builds a role by import string inside its worker process; ``specs``
builds the ``GroupSpec`` of each group from a run config, ``checkpoints`` saves and restores
trainable roles.
"""
