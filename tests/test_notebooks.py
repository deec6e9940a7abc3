"""The notebooks in notebooks/: each runs top to bottom on the CPU with small settings, and is committed clean.

A notebook's cell tagged ``parameters`` holds its real settings; as papermill does, the run inserts a cell after
it (tagged ``injected-parameters``) with the small ones of :data:`SMALL` and executes the copy with nbclient in a
kernel on this interpreter (a kernelspec written to a temporary ``JUPYTER_PATH``, so a fresh virtual environment
needs no ``ipykernel install``). A cell that raises fails the test with the cell's source and traceback. The
committed files must carry no outputs or execution counts (``python tests/test_notebooks.py --strip`` clears
them in place).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import xla_flags_with_devices

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "fedjax-robust-tests"
CELL_TIMEOUT_S = 300  # one cell; a whole small run takes ~15-40 s on an idle 2-core CPU

# notebook -> its small settings (Python assignments), the XLA:CPU host device count of its kernel, the
# offline dataset copy it reads (its DATA_DIR) and whether its kernel compiles with XLA's optimizations off
# (JAX_DISABLE_MOST_OPTIMIZATIONS, as the `fast_compiles` tests of tests/conftest.py: the MLP notebooks' runs
# compile longer than they run, -10 s for the quickstart; the CNN of fedcap_tpu runs slower unoptimized).
SMALL = {
    "quickstart.ipynb": dict(devices=1, fast_compiles=True, params={"ROUNDS": 8, "NUM_CLIENTS": 8}),
    # Two host devices: the notebook shards the client axis (engine.strategy=shard_map) as on a TPU's cores.
    "fedcap_tpu.ipynb": dict(devices=2, data="cifar10_jpeg",
                             params={"ROUNDS": 2, "NUM_CLIENTS": 20, "SAMPLES_PER_CLASS": 60, "EPOCHS": 1,
                                     "ALLOW_DOWNLOAD": False}),
    # Fig. 3's threat in miniature: 6 of 10 clients per round, attack at round 4 of 8, an MLP (LeNet-5 compiles
    # slowly on the CPU), no warm start and lr 0.05 so that the model has learned something before the attack.
    "fedvsa_tpu.ipynb": dict(devices=2, data="mnist", fast_compiles=True,
                             params={"METHODS": ("fedvsa", "fedavg"), "ROUNDS": 8, "ATTACK_ROUNDS": (4,),
                                     "NUM_CLIENTS": 10, "PARTICIPATION": 0.6, "EPOCHS": 1, "LR": 0.05,
                                     "PRETRAIN_ROUNDS": 0, "POOL_SIZE": 3000, "MAX_SAMPLES_PER_CLIENT": 300,
                                     "SHAPLEY_ROWS": 500, "MODEL": "mlp", "ALLOW_DOWNLOAD": False}),
}


def notebook_paths() -> list[Path]:
  return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_every_notebook_has_small_settings():
  names = [p.name for p in notebook_paths()]
  assert names, f"no notebooks in {NOTEBOOKS}"
  assert sorted(names) == sorted(SMALL), "each notebook needs its small settings in SMALL (and only those)"


# ------------------------------------------------------------------------------------------ committed clean
def dirty_cells(nb: dict) -> list[str]:
  """What a committed notebook must not carry: outputs, execution counts, per-run metadata."""
  found = []
  for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] != "code":
      continue
    if cell.get("outputs"):
      found.append(f"cell {i}: {len(cell['outputs'])} output(s)")
    if cell.get("execution_count") is not None:
      found.append(f"cell {i}: execution_count {cell['execution_count']}")
    extra = sorted(set(cell.get("metadata", {})) - {"tags", "id"})
    if extra:
      found.append(f"cell {i}: metadata {extra}")
  if "widgets" in nb.get("metadata", {}):
    found.append("notebook metadata: widgets")
  return found


def strip(nb: dict) -> dict:
  for cell in nb["cells"]:
    if cell["cell_type"] == "code":
      cell["outputs"], cell["execution_count"] = [], None
    cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k == "tags"}
  nb.get("metadata", {}).pop("widgets", None)
  return nb


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.name)
def test_committed_notebook_is_stripped(path):
  nb = json.loads(path.read_text())
  assert not dirty_cells(nb), (f"{path.name} carries outputs: {dirty_cells(nb)}; "
                               f"clear them with: python tests/test_notebooks.py --strip")
  tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
  assert len(tagged) == 1 and tagged[0]["cell_type"] == "code", f"{path.name}: one code cell tagged 'parameters'"


def test_strip_clears_outputs():
  nb = {"metadata": {"widgets": {}}, "cells": [
      {"cell_type": "code", "execution_count": 3, "metadata": {"tags": ["parameters"], "collapsed": True},
       "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}], "source": "x = 1"},
      {"cell_type": "markdown", "metadata": {}, "source": "# title"}]}
  assert len(dirty_cells(nb)) == 4
  assert dirty_cells(strip(nb)) == [] and nb["cells"][0]["metadata"] == {"tags": ["parameters"]}


# ------------------------------------------------------------------------------------------ install cell
def install_cell(path: Path) -> str:
  """The source of a notebook's install cell: the one that finds the checkout around it or clones REPO_URL."""
  nb = json.loads(path.read_text())
  cells = [src for src in ("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
           if "def find_checkout" in src]
  assert len(cells) == 1, f"{path.name}: {len(cells)} install cells, expected one"
  return cells[0]


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.name)
def test_install_cell_outside_a_checkout(path, tmp_path, monkeypatch):
  """As on Colab, no checkout around the notebook: without REPO_URL the cell stops with one line that says to
  set it (the project names no public address); with it, the cell clones it (this checkout, by path) and skips
  pip, fedjax_robust being importable here."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", list(sys.path))  # the cell puts its checkout first on sys.path
  source = install_cell(path)
  with pytest.raises(RuntimeError, match="set REPO_URL in the parameters cell"):
    exec(source, {"REPO_URL": ""})
  assert not (tmp_path / "fedjax_robust_repo").exists()
  namespace = {"REPO_URL": str(ROOT)}
  exec(source, namespace)
  clone = tmp_path / "fedjax_robust_repo"
  assert namespace["REPO"] == clone and (clone / "experiments" / "configs").is_dir()
  assert sys.path[0] == str(clone)


# ------------------------------------------------------------------------------------------ executed
def with_parameters(nb, params: dict):
  """A copy of ``nb`` with a cell assigning ``params`` right after its ``parameters`` cell (papermill's way)."""
  import copy

  import nbformat
  nb = copy.deepcopy(nb)
  index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
  source = "# Injected by tests/test_notebooks.py: small settings for a CPU run\n" + "\n".join(
      f"{k} = {v!r}" for k, v in params.items())
  cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
  cell.id = "injected-parameters"
  nb.cells.insert(index + 1, cell)
  return nb


def write_kernelspec(folder: Path) -> Path:
  """A kernelspec named :data:`KERNEL` that starts ipykernel on this very interpreter; returns the JUPYTER_PATH."""
  kernel_dir = folder / "kernels" / KERNEL
  kernel_dir.mkdir(parents=True)
  (kernel_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "fedjax_robust tests", "language": "python"}))
  return folder


def execute(path: Path, params: dict, tmp_path: Path, env: dict) -> tuple[object, float]:
  import nbformat
  from nbclient import NotebookClient
  from nbclient.exceptions import CellExecutionError

  nb = with_parameters(nbformat.read(path, as_version=4), params)
  client = NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S, startup_timeout=120,
                          resources={"metadata": {"path": str(path.parent)}})  # the kernel starts in notebooks/
  start = time.perf_counter()
  try:
    client.execute(env=env)
  except CellExecutionError as e:
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # the traceback without its terminal colours
    pytest.fail(f"{path.name}: a cell failed (executed copy: {tmp_path / path.name})\n{message}", pytrace=False)
  finally:
    nbformat.write(nb, tmp_path / path.name)  # what ran, with its outputs, for a look
  return nb, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch, data_cache_dir, shared_data):
  if not os.environ.get("CI"):  # on CI the plots extra is installed (the README's install command)
    pytest.importorskip("matplotlib", reason="the notebooks draw with matplotlib (the plots extra)")
  small = SMALL[path.name]
  params = dict(small["params"], OUTPUT_DIR=str(tmp_path / "runs"))
  if "data" in small:  # the offline copy in ../shared/data: fails on CI, skips elsewhere, when it is missing
    params["DATA_DIR"] = str(shared_data(small["data"]))
  monkeypatch.setenv("JUPYTER_PATH", str(write_kernelspec(tmp_path / "jupyter")))
  monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter" / "runtime"))  # connection files
  monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core's future default, without its warning
  env = dict(os.environ,
             XLA_FLAGS=xla_flags_with_devices(small["devices"]),
             JAX_PLATFORMS="cpu",
             FEDJAX_ROBUST_CACHE=str(data_cache_dir),  # decoded datasets shared with the other tests
             PYDEVD_DISABLE_FILE_VALIDATION="1")  # no debugger warning about frozen modules
  if small.get("fast_compiles"):
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
  nb, seconds = execute(path, params, tmp_path, env)
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
  print(f"{path.name}: {seconds:.1f} s")
  assert "Traceback" not in outputs
  images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
  assert images >= 3, f"{path.name} displayed {images} figures"


if __name__ == "__main__":  # python tests/test_notebooks.py --strip: clear outputs and execution counts in place
  if sys.argv[1:] != ["--strip"]:
    sys.exit("usage: python tests/test_notebooks.py --strip")
  import nbformat
  for p in notebook_paths():
    text = nbformat.writes(nbformat.from_dict(strip(json.loads(p.read_text()))))
    if not text.endswith("\n"):
      text += "\n"
    if text != p.read_text():
      p.write_text(text)
      print("stripped", p.relative_to(ROOT))
