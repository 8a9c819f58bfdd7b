"""Roles: what a rank actor holds. Thin glue between experience tables and an engine.

``PolicyRole`` (trained actor), ``ReferenceRole`` (frozen reference) and ``RolloutRole``
(generation). The rank actor builds a role by import string inside its worker process.
"""
