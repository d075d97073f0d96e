"""dev/gpu_check.sh stage 3 (decoding and the tests), dry-run on CPU: every decoding table, the
GPU-relevant tests collected and recorded."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from tests.dev.gpu_check_dry import check_stage, dry_fixture, read

pytestmark = [pytest.mark.slow, pytest.mark.bench, pytest.mark.heavy]
dry = dry_fixture("3")  # the stage's dry run, once for the module


def test_stage_3_exits_0_with_its_files_and_the_decoding_tables(dry) -> None:
    results = check_stage("3", dry)
    assert "| ours |" in results


def test_tests_are_collected_and_recorded(dry) -> None:
    log = read(dry[1], "tests.log")
    assert "-m cuda" in log and "tests/training/test_train.py" in log and "--collect-only" in log
    assert re.search(r"\d+ tests collected", log)  # the GPU-relevant files, collected
    suites = ET.parse(dry[1] / "tests.xml").getroot()
    assert suites.tag == "testsuites" and {s.get("name") for s in suites} == {"cuda", "units"}


def test_decoding_file_holds_every_table(dry) -> None:
    bench = read(dry[1], "decode.txt")
    cached = re.findall(r"^\| ours \| [\d.]+ \| [\d.]+ \| \d+ \| - \|$", bench, re.M)
    assert len(cached) == 4  # bench_decode: reference and equal lengths, beam and greedy
    other = re.findall(r"^\| ours, static_search=(true|false) \|.*\| [\d.]+x .*\|$", bench, re.M)
    assert len(other) == 4  # --compare-search: the other search step (on a CPU the static one)
    assert "lengths=reference" in bench and "lengths=equal" in bench and "dtype=bfloat16" in bench
    shapes = re.findall(r"^\| (train|decode): .*( \d+\.\d\d ms \|){3} \d+\.\d\dx \|$", bench, re.M)
    assert len(shapes) == 4  # bench_attention
