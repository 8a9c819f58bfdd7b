"""Iteration graphs: one module per algorithm family (``grpo``, ``ppo``, ``remax``, each a class
registered with ``@register_family``, see ``family.py``), the building pieces they share
(``pieces.py``) and validation's graph (``validation.py``). Installed as ``flowrl.graphs``."""
