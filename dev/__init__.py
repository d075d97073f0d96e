"""The development harness: the GPU check, the lever runs, the studies (not user benchmarks)."""
