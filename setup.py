"""Package discovery: graphs/ lives at the top level of the repository (the design card) and
installs as ``flowrl.graphs``, for editable and wheel installs alike (tests/unit/test_packaging.py)."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["flowrl", "flowrl.*"]) + ["flowrl.graphs"],
    package_dir={"flowrl.graphs": "graphs"},
)
