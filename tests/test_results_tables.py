"""Tables in experiments/results/*.md are generated from the stored result files: a hand edit or a stale table
fails here. Each block sits between ``<!-- generated: COMMAND -->`` and ``<!-- end generated -->``; COMMAND is
re-run and must print the block exactly."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A block may sit indented inside a list item: its lines carry the marker's indentation, which is not the command's.
BLOCK = re.compile(r"^([ \t]*)<!-- generated: (.+?) -->\n(.*?)^\1<!-- end generated -->", re.S | re.M)


def _dedent(body: str, indent: str) -> str:
  return "".join(line[len(indent):] if line.startswith(indent) else line for line in body.splitlines(keepends=True))


BLOCKS = [(md.name, cmd, _dedent(body, indent)) for md in sorted((ROOT / "experiments" / "results").glob("*.md"))
          for indent, cmd, body in BLOCK.findall(md.read_text())]


def test_some_tables_are_generated():
  assert BLOCKS, "no generated table found in experiments/results/*.md"


@pytest.mark.parametrize("name,command,body", BLOCKS, ids=[f"{n}:{i}" for i, (n, _, _) in enumerate(BLOCKS)])
def test_generated_table_matches_its_results(name, command, body):
  argv = shlex.split(command)
  assert argv[0] == "python" and argv[1].startswith("experiments/"), command
  out = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=True).stdout
  assert out == body, f"{name}: the table differs from what `{command}` prints (edited by hand, or stale)"
