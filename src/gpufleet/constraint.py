"""Slurm's ``--constraint`` expressions: parsed here, matched against nodes by the
scheduler (``scheduler/features.py``), read by the CLI too (a bad one is refused before
the submit). Standard library only: ``gpufleet submit`` imports no scheduler.

The expressions Slurm's ``sbatch(1)`` documents, and what is taken here:

- ``a``: nodes with feature a;
- ``a&b`` (AND), ``a|b`` (OR: each node has one of them, nodes may differ), with ``&``
  binding tighter than ``|`` and parentheses to group, as in Slurm;
- ``[a|b|c]`` (matching OR): every node of the job has the same one of them (a job on
  a whole rack or switch generation). The core tries the alternatives in order
  (:func:`alternatives`) and takes the first it can place in;
- counts (``a*2``: at least two of the job's nodes have a) and ``[a*2&b*4]`` are
  refused: gpufleet's placement takes one node filter per job, not a per-node mix;
  ask for the feature on every node instead (``-C a``).

:func:`parse` turns the text into a :class:`Constraint` (or ValueError with the words
to show); its ``str`` is the canonical form the server stores.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass


class Unsupported(ValueError):
    """A constraint Slurm takes and gpufleet cannot honour (counts: ``a*2``)."""


_TOKEN = re.compile(r"\s*(?:([A-Za-z0-9_][A-Za-z0-9_.:+-]*)|(.))")
MAX_TEXT = 256


@dataclass(frozen=True, slots=True)
class Constraint:
    """A boolean expression over features, in disjunctive form: ``any`` of the terms,
    each ``all`` of its features (``(a&b)|c`` is ``((a, b), (c,))``). ``matching``: a
    ``[...]`` list, whose terms are alternatives for the whole job, not per node."""

    terms: tuple[tuple[str, ...], ...]
    matching: bool = False

    def __str__(self) -> str:
        text = "|".join("&".join(t) for t in self.terms)
        return f"[{text}]" if self.matching else text


def parse(text: str) -> Constraint:
    """``text`` as Slurm's ``--constraint`` reads it (see the module docstring)."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"--constraint: at most {MAX_TEXT} characters")
    inner = text.strip()
    matching = inner.startswith("[") and inner.endswith("]")
    tokens = _tokens(inner[1:-1] if matching else inner, text)
    if not tokens:
        raise ValueError("--constraint: give a feature, e.g. -C ib or -C 'a100&ib'")
    pos, terms = _or(tokens, 0, text)
    if pos != len(tokens):
        raise ValueError(f"--constraint={text}: unexpected {tokens[pos]!r}")
    return Constraint(terms=terms, matching=matching)


def _tokens(inner: str, text: str) -> list[str]:
    out: list[str] = []
    for m in _TOKEN.finditer(inner.strip()):
        word, sym = m.groups()
        if word is not None:
            out.append(word)
        elif sym is not None:
            if sym == "*":
                raise Unsupported(
                    f"--constraint={text}: counts (feature*N) are not supported here; "
                    "ask for the feature on every node (-C feature)"
                )
            if sym not in "&|()[]":
                raise ValueError(f"--constraint={text}: {sym!r} is not part of a constraint (& | ( ) [ ])")
            if sym in "[]":
                raise ValueError(f"--constraint={text}: brackets go around the whole list only: [a|b]")
            out.append(sym)
    return out


Terms = tuple[tuple[str, ...], ...]


def _or(tokens: list[str], pos: int, text: str) -> tuple[int, Terms]:
    pos, terms = _and(tokens, pos, text)
    while pos < len(tokens) and tokens[pos] == "|":
        pos, more = _and(tokens, pos + 1, text)
        terms += more
    return pos, _unique(terms)


def _and(tokens: list[str], pos: int, text: str) -> tuple[int, Terms]:
    pos, terms = _atom(tokens, pos, text)
    while pos < len(tokens) and tokens[pos] == "&":
        pos, right = _atom(tokens, pos + 1, text)
        terms = tuple(tuple(sorted(set(a) | set(b))) for a in terms for b in right)
        if len(terms) > 64:
            raise ValueError(f"--constraint={text}: too many alternatives")
    return pos, terms


def _atom(tokens: list[str], pos: int, text: str) -> tuple[int, Terms]:
    if pos >= len(tokens):
        raise ValueError(f"--constraint={text}: a feature is missing at the end")
    tok = tokens[pos]
    if tok == "(":
        pos, terms = _or(tokens, pos + 1, text)
        if pos >= len(tokens) or tokens[pos] != ")":
            raise ValueError(f"--constraint={text}: a '(' is not closed")
        return pos + 1, terms
    if tok in "&|)":
        raise ValueError(f"--constraint={text}: a feature is missing before {tok!r}")
    return pos + 1, ((tok,),)


def _unique(terms: Terms) -> Terms:
    seen: list[tuple[str, ...]] = []
    for t in terms:
        if t not in seen:
            seen.append(t)
    return tuple(seen)


Has = Callable[[str], bool]
"""Whether a node has one feature (its features, its labels, its GPU model)."""


def holds(terms: Terms, has: Has) -> bool:
    """Whether a node with features ``has`` satisfies ``terms`` (any term, all of it)."""
    return any(all(has(f) for f in term) for term in terms)


def alternatives(c: Constraint) -> list[Terms]:
    """The node filters to try in order: one for a plain expression (each node on its
    own), one per alternative of a matching-OR list (every node the same one)."""
    return [(t,) for t in c.terms] if c.matching else [c.terms]


def node_has(features: Iterable[str], model: str, matches: Callable[[str, str], bool]) -> Has:
    """A node's :data:`Has`: one of its ``features`` (exact, as Slurm's are), else its GPU
    model as ``--gpu-type`` would match it (``matches``: ``options.gpu_type_matches``)."""
    own = frozenset(features)
    return lambda f: f in own or (bool(model) and matches(f, model))
