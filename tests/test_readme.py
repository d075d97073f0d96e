"""The README's Python examples run as written."""

import importlib
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_names_only_code_that_exists() -> None:
    """Every ``transformer.*`` name, project file and test the README cites exists: renames and
    removals cannot leave it pointing at nothing. (Its Python blocks run below.)"""
    text = README.read_text()
    root = README.parent
    missing = []
    for name in set(re.findall(r"`(transformer(?:\.\w+)+)", text)):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError:
                continue
            for attr in parts[i:]:
                obj = getattr(obj, attr, None)
            missing += [name] if obj is None else []
            break
    files = r"`((?:transformer|bench|dev|tests|configs|docs)/[\w/.-]+\.(?:py|yaml|sh|md))"
    missing += [path for path in set(re.findall(files, text)) if not (root / path).exists()]
    defined = "".join(p.read_text() for p in (root / "tests").rglob("test_*.py"))
    cited = set(re.findall(r"`(?:tests/[\w/]+\.py::)?(test_[a-z]\w*)`", text))
    missing += [t for t in cited if f"def {t}(" not in defined]
    assert BLOCKS and not missing, sorted(missing)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(block: str) -> None:
    exec(compile(block, str(README), "exec"), {})
