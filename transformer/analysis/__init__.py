"""Attention analysis: per-head maps, head statistics, plots, head importance and pruning."""
