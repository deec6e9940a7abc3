"""Tables in experiments/results/*.md are generated from the stored result files: a hand edit or a stale table
fails here. Each block sits between ``<!-- generated: COMMAND -->`` and ``<!-- end generated -->``; COMMAND is
re-run and must print the block exactly (``experiments/tables.py`` rewrites them all)."""

import pytest

from experiments import tables

BLOCKS = [(md.name, cmd, body) for md in sorted(tables.RESULTS.glob("*.md")) for _, cmd, body in tables.blocks(md)]


def test_some_tables_are_generated():
  assert BLOCKS, "no generated table found in experiments/results/*.md"


@pytest.mark.parametrize("name,command,body", BLOCKS, ids=[f"{n}:{i}" for i, (n, _, _) in enumerate(BLOCKS)])
def test_generated_table_matches_its_results(name, command, body):
  assert tables.run(command) == body, (f"{name}: the table differs from what `{command}` prints (edited by hand, "
                                       "or stale); `python experiments/tables.py` rewrites it")


def test_rewrite_only_touches_the_blocks_that_name_it(tmp_path):
  page = tmp_path / "page.md"
  stale = "stale\n"
  page.write_text("prose\n<!-- generated: python experiments/tables.py --help -->\n" + stale + "<!-- end generated -->\n"
                  "<!-- generated: python experiments/keep_cell.py --help -->\n" + stale + "<!-- end generated -->\n")
  assert tables.rewrite(page, only="keep_cell")
  (_, first, first_body), (_, second, second_body) = tables.blocks(page)
  assert first_body == stale  # not named by --only: left as it was
  assert second_body == tables.run(second) and "keep_cell" in second_body
  assert not tables.rewrite(page, only="keep_cell")  # nothing left to change
