"""Every generated table of ``experiments/results/*.md``, rebuilt from the stored result files in one command.

A page keeps its prose by hand and its tables between ``<!-- generated: COMMAND -->`` and ``<!-- end generated -->``
(a block may sit indented inside a list item; its lines then carry the marker's indentation). COMMAND is a
``python experiments/...`` line that prints the block from stored JSON. This script re-runs every COMMAND and
writes what it prints into the page; ``--check`` only reports the blocks that differ (what
``tests/test_results_tables.py`` asserts), so a hand edit or a stale table is caught.

  python experiments/tables.py            # rewrite every block of every page
  python experiments/tables.py --check    # exit 1 and name the blocks that differ
  python experiments/tables.py --only fedvsa_mnist_table3   # only the blocks whose command names this

``--only`` is for the one block a new result feeds: every page's blocks take minutes to re-run, the one a few
seconds; the test suite still checks them all.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
BLOCK = re.compile(r"^([ \t]*)<!-- generated: (.+?) -->\n(.*?)^\1<!-- end generated -->", re.S | re.M)


def dedent(body: str, indent: str) -> str:
  return "".join(line[len(indent):] if line.startswith(indent) else line for line in body.splitlines(keepends=True))


def indent_block(body: str, indent: str) -> str:
  return "".join(indent + line if line.strip() else line for line in body.splitlines(keepends=True))


def blocks(md: Path) -> list[tuple[str, str, str]]:
  """``(indent, command, body)`` of each generated block of a page, the body without the indentation."""
  return [(indent, cmd, dedent(body, indent)) for indent, cmd, body in BLOCK.findall(md.read_text())]


def run(command: str) -> str:
  """What a block's command prints (run with this interpreter from the repository root)."""
  argv = shlex.split(command)
  if argv[0] != "python" or not argv[1].startswith("experiments/"):
    raise ValueError(f"a generated block's command must be `python experiments/...`, got {command!r}")
  return subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def rewrite(md: Path, only: str = "") -> bool:
  """Re-runs every block's command (those naming ``only``, when given) and writes its output into the page; True
  when the page changed."""
  text = md.read_text()

  def regenerate(m: re.Match) -> str:
    if only not in m.group(2):
      return m.group(0)
    return (f"{m.group(1)}<!-- generated: {m.group(2)} -->\n"
            f"{indent_block(run(m.group(2)), m.group(1))}{m.group(1)}<!-- end generated -->")

  new = BLOCK.sub(regenerate, text)
  if new != text:
    md.write_text(new)
  return new != text


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--check", action="store_true", help="report the blocks that differ, change nothing")
  parser.add_argument("--only", default="", help="only the blocks whose command contains this text")
  args = parser.parse_args(argv)
  stale = 0
  for md in sorted(RESULTS.glob("*.md")):
    if args.check:
      for _, command, body in blocks(md):
        if args.only in command and run(command) != body:
          stale += 1
          print(f"{md.name}: `{command}` prints something else", file=sys.stderr)
    elif rewrite(md, args.only):
      print(f"rewrote {md.relative_to(ROOT)}")
  return 1 if stale else 0


if __name__ == "__main__":
  sys.exit(main())
