"""Head roles, named from the head statistics (:mod:`transformer.analysis.stats`), after the
kinds of heads Voita et al. (2019) and Clark et al. (2019) describe.

Each head gets the first role whose test it passes, in this order:

* ``removed``: its maps are all zero, a head pruned away (``python -m transformer.prune``);
* ``boundary``: at least ``BOUNDARY`` of its weight on the sentence boundary (the source's eos,
  the decoder input's bos), a "no-op" slot;
* ``alignment`` (cross-attention only): its most-attended source piece is that of the model's
  consensus, the mean of all cross-attention heads of all layers, for at least ``ALIGNMENT`` of
  the queries. A proxy: no external word aligner is used, so this says that a head agrees with
  the model's own alignment, not that the alignment is right;
* ``previous``, ``same``, ``next`` (``diagonal`` in cross-attention: the source piece of the
  query's own index): at least ``POSITIONAL`` of its weight on that one position;
* ``broad``: mean entropy of at least ``BROAD`` nats, its weight spread over e^1.5 ~ 4.5 keys
  or more;
* ``other``: none of these.

The thresholds are round numbers chosen by hand, not fitted; shares are means over query rows.
"""

from __future__ import annotations

from torch import Tensor

BOUNDARY = 0.5  # share of weight on eos/bos
ALIGNMENT = 0.5  # share of queries whose argmax is the consensus's
POSITIONAL = 0.5  # share of weight on the previous, same or next position
BROAD = 1.5  # mean entropy in nats
ROLES = (
    "removed",
    "boundary",
    "alignment",
    "previous",
    "same",
    "diagonal",
    "next",
    "broad",
    "other",
)


def head_role(stats: dict[str, float], kind: str) -> str:
    """The role of one head from its statistics (``STATS`` names -> value)."""
    if stats["confidence"] == 0.0:
        return "removed"
    if stats["eos"] >= BOUNDARY:
        return "boundary"
    if kind == "cross" and stats["agreement"] >= ALIGNMENT:
        return "alignment"
    position = max(("previous", "same", "next"), key=lambda name: stats[name])
    if stats[position] >= POSITIONAL:
        return "diagonal" if kind == "cross" and position == "same" else position
    if stats["entropy"] >= BROAD:
        return "broad"
    return "other"


def head_roles(stats: dict[str, dict[str, Tensor]]) -> dict[str, list[list[str]]]:
    """{type: {stat: (L, H)}} -> {type: the role of each head, layer by layer}."""
    roles = {}
    for kind, values in stats.items():
        L, H = next(iter(values.values())).shape
        roles[kind] = [
            [head_role({name: float(v[layer, head]) for name, v in values.items()}, kind)
             for head in range(H)]
            for layer in range(L)
        ]  # fmt: skip
    return roles
