"""Where a stored result file's numbers came from, said in one line under every generated table.

Only what the file itself records is used: the cells' ``commit`` / ``device`` / ``jax`` / ``command`` fields
(``experiments/grid.py`` writes them since 2026-11-25), a file-level ``_command`` / ``_machine``, and for files
stored before that, ``_provenance.stored_by_commits``: the commits that stored the file, from its git history (the
runs' own commit was not recorded; their code is that of the commit that stored a cell, or an earlier one).
"""

from __future__ import annotations


def note(results: dict) -> str:
  """One line: where the file's cells came from, as far as the file says (never filled in from elsewhere)."""
  cells = [c for k, c in results.items() if not k.startswith("_") and isinstance(c, dict)]
  distinct = lambda field: sorted({str(c[field]) for c in cells if c.get(field) is not None})
  parts = []
  commits = distinct("commit")
  if commits:
    dirty = any(c.get("dirty") for c in cells)
    parts.append("commit " + ", ".join(c[:12] for c in commits) + (" (with uncommitted changes)" if dirty else ""))
  devices = distinct("device_kind") or distinct("device")
  if devices:
    parts.append("device " + ", ".join(devices))
  if distinct("jax"):
    parts.append("jax " + ", ".join(distinct("jax")))
  top = lambda *keys: next((results[k] for k in keys if isinstance(results.get(k), (str, list))), None)
  file_commands = top("_command", "commands")
  commands = distinct("command") or ([file_commands] if isinstance(file_commands, str) else file_commands or [])
  if len(commands) == 1:
    parts.append(f"command `{commands[0]}`")
  elif commands:
    parts.append(f"{len(commands)} commands, e.g. `{commands[0]}`")
  if top("_machine", "machine"):
    parts.append(f"machine: {top('_machine', 'machine')}")
  stored = (results.get("_provenance") or {}).get("stored_by_commits")
  if not commits and stored:
    parts.append(f"run commit not recorded; stored by commit{'s' if len(stored) > 1 else ''} "
                 f"{', '.join(stored) if len(stored) <= 4 else f'{stored[0]} ... {stored[-1]} ({len(stored)})'} "
                 "(the code is that commit's or older)")
  if not parts:
    return ("provenance: not recorded in this file (stored before results carried config/commit/command); "
            "command and device as stated above")
  missing = "" if commits or stored else "; commit not recorded"
  return "provenance: " + "; ".join(parts) + missing
