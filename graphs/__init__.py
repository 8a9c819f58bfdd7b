"""Iteration graphs: one module per algorithm family (RL: ``grpo``, ``ppo``, ``remax``; supervised
post-training: ``sft``, ``dpo``, ``rm``; each a class registered with ``@register_family``, see
``family.py``), the building pieces they share (``pieces.py``, ``post_training.py``) and
validation's graph (``validation.py``). Installed as ``flowrl.graphs``."""
