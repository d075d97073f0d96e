"""Speed scripts; results in BENCHMARKS.md. Shared pieces live in bench/common.py."""
