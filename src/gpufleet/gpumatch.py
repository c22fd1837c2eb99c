"""Whether a GPU model answers a job's ``--gpu-type``: the scheduling core's rule
(``scheduler.options`` re-exports it), here on its own so that ``gpufleet submit``'s
price hint and ``gpufleet price`` match models as the scheduler does without importing
the scheduling core (~50 ms of a command's start-up). Standard library and ``migindex``
only.
"""

from __future__ import annotations

from gpufleet.migindex import SHARE_TAG, SLICE_TAG


def gpu_type_matches(wanted: str, model: str) -> bool:
    """``--gpu-type H100`` matches "H100", "H100-80GB" and "NVIDIA H100 80GB HBM3"; a slice
    or share type matches on both sides of its tag: "H100 MIG 1g.10gb" matches
    "H100-80GB MIG 1g.10gb", "H100 SHARED" and "SHARED" match "H100-80GB SHARED"."""
    w = wanted.lower().replace("-", " ").split()
    m = model.lower().replace("-", " ").split()
    for tag in _TAGS:
        if tag in w:
            if tag not in m:
                return False
            wi, mi = w.index(tag), m.index(tag)
            return w[wi:] == m[mi:] and _contains(m[:mi], w[:wi])
    return _contains(m, w)


_TAGS = (SLICE_TAG.lower(), SHARE_TAG.lower())


def _contains(m: list[str], w: list[str]) -> bool:
    return any(m[i : i + len(w)] == w for i in range(len(m) - len(w) + 1))


__all__ = ["gpu_type_matches"]
