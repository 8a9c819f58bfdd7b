"""Helpers shared by the tests (tiny models, reference computations, test-only roles).

Not part of the library: importable as ``flowrl_testing`` because ``tests/conftest.py`` puts
``tests/`` on ``sys.path`` and on ``PYTHONPATH`` (so worker processes spawned by a test find
test-only roles by import string, e.g. ``flowrl_testing.roles:EchoRole``).
"""
