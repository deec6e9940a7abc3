"""Loading Python files by path: experiment configs (and scripts) are files, not an importable package.

``ml_collections`` loads ``--config path.py`` by path, so a config that builds on another one (FedCAP's EMNIST
setting on its CIFAR-10 scenario wiring, say) loads its sibling the same way, through :func:`sibling`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType


def load_module(path: str | os.PathLike, name: str | None = None) -> ModuleType:
  """Executes the Python file at ``path`` as a fresh module (named ``name``, default its stem) and returns it."""
  path = Path(path)
  spec = importlib.util.spec_from_file_location(name or path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def sibling(config_file: str | os.PathLike, name: str) -> ModuleType:
  """The config module ``<name>.py`` in the folder of ``config_file`` (pass ``__file__``)."""
  return load_module(Path(config_file).with_name(f"{name}.py"))
