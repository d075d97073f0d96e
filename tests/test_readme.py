"""The README's and the documentation's Python examples run as written, and every name, file and
test they cite exists."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [
    (page, block)
    for page in PAGES
    for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_readme_names_only_code_that_exists(page: Path) -> None:
    """Every ``transformer.*`` name, project file and test the README (or a docs/ page) cites
    exists: renames and removals cannot leave it pointing at nothing. (Its Python blocks run
    below.)"""
    text = page.read_text()
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
    missing += [path for path in set(re.findall(files, text)) if not (ROOT / path).exists()]
    defined = "".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    cited = set(re.findall(r"`(?:tests/[\w/]+\.py::)?(test_[a-z]\w*)`", text))
    missing += [t for t in cited if f"def {t}(" not in defined]
    assert not missing, sorted(missing)


def test_readme_has_python_blocks() -> None:
    assert re.search(r"```python\n", README.read_text())


NEEDS_CHECKPOINT = "# needs a trained checkpoint"  # a block's first line: compiled, not run


# docs/benchmarks.md's blocks time things (seconds of work): the full suite runs them, the fast
# lane (-m "not slow") leaves them out
TIMED = ROOT / "docs" / "benchmarks.md"


@pytest.mark.parametrize(
    "page, block",
    [pytest.param(p, b, marks=[pytest.mark.slow] if p == TIMED else []) for p, b in BLOCKS],
    ids=[f"{p.relative_to(ROOT)}-block{i}" for i, (p, _) in enumerate(BLOCKS)],
)
def test_readme_python_block_runs(page: Path, block: str) -> None:
    """Every block runs as written; one that needs a trained checkpoint (its first line says so
    and names the test that runs its calls) is compiled and its imports run."""
    code = compile(block, str(page), "exec")
    if not block.startswith(NEEDS_CHECKPOINT):
        exec(code, {})
        return
    assert re.search(r"tests/[\w/]+\.py", block.splitlines()[0]), "name the test that runs it"
    lines = block.splitlines()
    imports = "\n".join(line for line in lines if line.startswith(("from ", "import ")))
    exec(compile(imports, str(page), "exec"), {})
