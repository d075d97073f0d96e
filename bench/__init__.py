"""Speed scripts; results in docs/benchmarks.md. Shared pieces live in bench/common.py."""
