"""The configuration reference, docs/configuration.md, documents every key of every file in
transformer/configs/, and the documentation site builds without a warning."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from transformer.configs import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = CONFIG_DIR
REFERENCE = ROOT / "docs" / "configuration.md"


def leaf_keys(node: object, prefix: str) -> list[str]:
    """Dotted paths of a YAML mapping's leaves (Hydra's `defaults` list left out)."""
    if not isinstance(node, dict) or not node:
        return [prefix]
    return [
        key
        for name, child in node.items()
        if name != "defaults"
        for key in leaf_keys(child, f"{prefix}.{name}" if prefix else str(name))
    ]


def config_keys(configs: Path) -> dict[str, list[str]]:
    """Each config file's keys as a user sets them: transformer/configs/<group>/<option>.yaml's
    under `<group>.` (a nested group's, callbacks/early_stopping/, under its path:
    `callbacks.early_stopping.`; an `@package _global_` overlay's as written), train.yaml's and
    evaluate.yaml's as written."""
    keys = {}
    for path in sorted(configs.rglob("*.yaml")):
        text = path.read_text()
        rel = path.relative_to(configs)
        top = len(rel.parts) == 1 or "@package _global_" in text
        package = "" if top else ".".join(rel.parts[:-1])
        keys[str(rel)] = leaf_keys(yaml.safe_load(text) or {}, package)
    return keys


def undocumented(configs: Path, reference: str) -> list[str]:
    return sorted(
        f"{file}: {key}"
        for file, keys in config_keys(configs).items()
        for key in keys
        if not re.search(rf"`{re.escape(key)}[`=]", reference)
    )


def test_every_config_key_is_in_the_configuration_reference() -> None:
    missing = undocumented(CONFIGS, REFERENCE.read_text())
    assert not missing, "add these keys to docs/configuration.md:\n" + "\n".join(missing)


def test_a_key_added_to_a_config_without_documentation_fails(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    model = configs / "model" / "base.yaml"
    model.write_text(model.read_text() + "rotary_base: 10000\n")
    train = configs / "train.yaml"
    train.write_text(train.read_text() + "loss:\n  z_loss: 0.0\n")
    assert undocumented(configs, REFERENCE.read_text()) == [
        "model/base.yaml: model.rotary_base",
        "train.yaml: loss.z_loss",
    ]


@pytest.mark.slow  # a subprocess building the whole site
@pytest.mark.skipif(shutil.which("mkdocs") is None, reason="mkdocs not installed (the docs extra)")
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """No broken link, missing page or unresolved API reference (CI runs the same command)."""
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_development_layout_names_every_module_of_the_package() -> None:
    """docs/development.md's layout: each module of transformer/ named in its folder's entry."""
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    layout = text.split("## Layout", 1)[1].split("```", 2)[1]
    names = set(re.findall(r"[a-z_0-9]+", layout))
    package = ROOT / "transformer"
    missing = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.stem not in ("__init__",) and path.stem not in names
    ]
    assert not missing, f"docs/development.md's layout leaves out {missing}"
