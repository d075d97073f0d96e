"""The package's layout: short modules, each one concern a reader can find by its name."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "transformer"
MAX_LINES = 300


def test_no_package_module_is_over_300_lines() -> None:
    """Every module of transformer/ is at most 300 lines: a longer one is split along a concern
    with its own name (docs/development.md's layout names each module)."""
    lengths = {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    over = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them): {over}"
