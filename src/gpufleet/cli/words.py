"""Small words the commands print."""

from __future__ import annotations


def count(n: int, noun: str) -> str:
    """``1 GPU``, ``2 GPUs``, ``0 GPUs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


__all__ = ["count"]
