"""Multi-turn, tool-using rollouts: the tool interface and its registry, tool-call parsers, the
gym-style environment interface, the agent loop, and the built-in tools (a calculator, a Python
sandbox that runs in a subprocess). Nothing here imports torch; the loop drives an engine through
a ``generate`` callback the rollout role supplies."""
