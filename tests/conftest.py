"""Shared pytest setup.

Four forced host devices let the ``shard_map`` strategy run (and be checked
against ``vmap``/sequential) on a CPU; the flag must be set before JAX starts.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")


# --- data: the offline dataset copies (../shared/data) --------------------------------
# Rule for tests that need the real files: when they are missing, fail on CI (env CI
# set: the copies must be provisioned there) and skip elsewhere.

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def shared_data_root() -> Path:
  """``$FEDJAX_ROBUST_SHARED_DATA`` or ``<repo>/../shared/data``."""
  env = os.environ.get("FEDJAX_ROBUST_SHARED_DATA")
  return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


def require_shared_data(*relpaths: str) -> Path:
  """The shared data root, after checking ``relpaths`` exist under it (fail on CI, else skip)."""
  root = shared_data_root()
  missing = [p for p in relpaths if not (root / p).exists()] if root.is_dir() else [str(root)]
  if missing:
    msg = f"offline dataset copies missing under {root}: {missing}"
    if os.environ.get("CI"):
      pytest.fail(msg + " (required on CI)")
    pytest.skip(msg)
  return root


@pytest.fixture(scope="session")
def data_cache_dir(tmp_path_factory) -> Path:
  """A session-wide dataset cache, so each real dataset is decoded once per test run."""
  return tmp_path_factory.mktemp("fedjax_robust_cache")


@pytest.fixture(scope="session")
def shared_data():
  """``shared_data("mnist", ...)`` -> data root, applying the fail-on-CI / skip rule."""
  return require_shared_data


@pytest.fixture(scope="module")
def fast_compiles():
  """XLA with most optimizations off for one module: many small jitted kernels compile faster than they run
  (aggregators, similarity kernels); modules opt in with ``pytestmark = pytest.mark.usefixtures(...)``."""
  import jax
  old = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", old)


# --- end-of-run plots -------------------------------------------------------------------
# A run draws its figures when it ends (output.plots, about 2 s); the suite's hundreds of runs skip that, except in
# tests marked `plots` (tests/test_plots.py). Runs in a subprocess (the CLI tests) still draw theirs.
@pytest.fixture(autouse=True)
def _no_end_of_run_plots(request, monkeypatch):
  if request.node.get_closest_marker("plots") is None:
    monkeypatch.setattr("fedjax_robust.experiment.write_plots", lambda *args, **kwargs: [])
