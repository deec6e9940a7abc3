"""Shared pytest setup.

Four forced host devices let the ``shard_map`` strategy run (and be checked
against ``vmap``/sequential) on a CPU; the flag must be set before JAX starts.
"""

import os

# XLA:CPU compiling the suite's many small programs is most of its time. Two compiler flags halve that: the legacy
# elemental emitters instead of the MLIR fusion emitters, and one LLVM module per program instead of split ones
# (measured 2026-11-28, `pytest -n 2` on a 2-core VM: 1380 s -> 784 s, backend compile 1726 -> 781 s of worker
# time; 1,081 passed either way; alone, neither flag was a steady gain). Tests only: runs keep XLA's defaults, and
# every comparison a test makes (vmap against sequential, folded against canonical) compiles both sides alike.
# Set XLA_FLAGS yourself to replace all of it (keep the device count for the shard_map tests).
TEST_COMPILE_FLAGS = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=4 {TEST_COMPILE_FLAGS}")


def xla_flags_with_devices(devices: int) -> str:
  """This session's XLA_FLAGS with ``devices`` host devices instead: for a subprocess (a notebook's kernel, the
  multihost processes) that wants its own device count and the same compiler flags."""
  kept = [f for f in os.environ["XLA_FLAGS"].split() if not f.startswith("--xla_force_host_platform_device_count")]
  return " ".join([f"--xla_force_host_platform_device_count={devices}"] + kept)

# The experiment scripts (experiments/*.py: grids, tables, figures) are a folder of scripts, not part of the
# installed package: tests import them from the repository root, whichever test file runs first (or alone).
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- one directory for the whole test session: XLA compilation cache, decoded datasets (issue 28) ----------------
# Most of the suite's time is XLA:CPU compiling small programs, and many are compiled again by other processes or
# other tests: the same eager ops and RNG kernels in each xdist worker and in every CLI / notebook subprocess, the
# same round programs rebuilt by tests that build equal simulators. JAX's persistent cache (an entry is keyed by
# the program, the jaxlib version, XLA flags, compile options and devices) hands such a compile the executable the
# first one wrote. The directory is fresh for each session: made by the first process (the xdist controller, or the
# only process), inherited by the workers and subprocesses through the environment, deleted at the end, so no run
# reads another run's (or another commit's) entries and a fresh-clone CI run times what every run gets. Set
# JAX_COMPILATION_CACHE_DIR yourself to use a directory of yours (kept, thresholds left to you), or to "" for none.
import shutil  # noqa: E402
import tempfile  # noqa: E402

_SESSION_DIR_ENV = "FEDJAX_ROBUST_TEST_SESSION_DIR"
_OWN_SESSION_DIR = None
if _SESSION_DIR_ENV not in os.environ:
  _OWN_SESSION_DIR = tempfile.mkdtemp(prefix="fedjax_robust_tests_")
  os.environ[_SESSION_DIR_ENV] = _OWN_SESSION_DIR
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_OWN_SESSION_DIR, "xla_cache")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the default (1 s) would skip most programs
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"  # no size floor


def pytest_unconfigure(config):
  if _OWN_SESSION_DIR is not None:
    shutil.rmtree(_OWN_SESSION_DIR, ignore_errors=True)


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
def data_cache_dir() -> Path:
  """A session-wide dataset cache, so each real dataset is decoded once per test run: one for all the session's
  processes (entries are written to a temporary name and renamed: fedjax_robust/data/cache.py)."""
  path = Path(os.environ[_SESSION_DIR_ENV]) / "datasets"
  path.mkdir(parents=True, exist_ok=True)
  return path


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


@pytest.fixture(autouse=True)
def _fast_compiles_marker(request):
  """``@pytest.mark.fast_compiles``: the same for one test. For in-process tests whose programs compile longer than
  they run (an unoptimized CNN on real images runs several times slower: keep those off): runs that learn, flag
  their attackers, write their files, build their config; and equality tests of MLP / LeNet programs (vmap against
  sequential, seeds in one program against separate runs), whose two sides then compile alike and agree as closely
  (measured 2026-11-27: those marked pass, ~30% faster; 2026-11-28: 20 more, each timed both ways, kept where
  it saved 4 s or more: ~270 s of the suite's worker time). BatchNorm equality tests stay optimized: the vmapped
  bn_cnn drifts ~1e-2 from the sequential loop without optimizations. Subprocesses the test starts inherit it
  (``JAX_DISABLE_MOST_OPTIMIZATIONS``)."""
  if request.node.get_closest_marker("fast_compiles") is None:
    yield
    return
  import jax
  old = jax.config.read("jax_disable_most_optimizations")
  old_env = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS")
  jax.config.update("jax_disable_most_optimizations", True)
  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"  # the test's subprocesses (CLI runs, multihost) alike
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", old)
    if old_env is None:
      os.environ.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    else:
      os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = old_env


# --- end-of-run plots -------------------------------------------------------------------
# A run draws its figures when it ends (output.plots, about 2 s); the suite's hundreds of runs skip that, except in
# tests marked `plots` (tests/test_plots.py). Runs in a subprocess (the CLI tests) still draw theirs.
@pytest.fixture(autouse=True)
def _no_end_of_run_plots(request, monkeypatch):
  if request.node.get_closest_marker("plots") is None:
    monkeypatch.setattr("fedjax_robust.experiment.write_plots", lambda *args, **kwargs: [])
