"""Which nodes a job may use: its ``--constraint`` (``gpufleet.constraint``) over node
features, its ``--exclude``, and its ``--cuda`` (nodes whose driver supports it,
``cuda.py``).

A node's features are what its agent reports (``gpufleet agent --features ib,nvme``)
and what operators add (``gpufleet node label NODE +feat``); its GPU model is one too,
matched as ``--gpu-type`` matches (``-C a100`` keeps working: ``options.gpu_type_matches``).
A job's filters narrow the nodes the core places it on (``core._fitting``, ``cpu.py``);
the core does not preempt for a filtered job (victims are chosen on any node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpufleet.constraint import Terms, alternatives, holds, node_has, parse
from gpufleet.migindex import physical_node

if TYPE_CHECKING:
    from gpufleet.scheduler.model import JobRequest, Node

NodeFilter = Callable[["Node"], bool]


def node_filters(job: JobRequest) -> list[NodeFilter]:
    """The filters to try in order for ``job``'s ``--constraint``, ``--exclude`` and
    ``--cuda`` (``[]``: none, any node of its pool will do). A constraint stored by the
    server is canonical; one that no longer parses matches no node (the job waits, saying so)."""
    need = job.cuda
    if job.constraint is None and not job.exclude and need is None:
        return []  # the common case, once per job and pass: nothing imported, nothing made
    from gpufleet.scheduler.cuda import supports

    if job.constraint is None and not job.exclude:
        return [lambda node: supports(node, need)]
    from gpufleet.scheduler.options import gpu_type_matches

    try:
        alts = alternatives(parse(job.constraint)) if job.constraint is not None else [()]
    except ValueError:
        return [lambda node: False]
    excluded = job.exclude

    def make(terms: Terms) -> NodeFilter:
        def ok(node: Node) -> bool:
            if excluded and physical_node(node.name) in excluded:
                return False
            if need is not None and not supports(node, need):
                return False
            return not terms or holds(terms, node_has(node.features, node.model, gpu_type_matches))

        return ok

    return [make(t) for t in alts]
