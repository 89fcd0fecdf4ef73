# Shim for Dataflow's --setup_file, which needs a setup.py; all metadata lives in pyproject.toml.
from setuptools import setup

setup()
