"""The node-lifecycle defaults that other code shows: ``gpufleet server``'s options, and
the simulator's help, which compares its own failure handling to the server's. One value
each, imported wherever it is used or shown, so no help text restates a number. (A
module of constants only: the CLI imports it without the server's dependencies.)
"""

from __future__ import annotations

NODE_TIMEOUT_S = 30.0
"""A node not seen (sync or registration) for this long is NotReady: nothing new lands on it."""

REQUEUE_AFTER_S = 60.0
"""NotReady this much longer: the node is declared lost and its jobs are requeued. A dead
node's jobs thus re-enter the queue ``NODE_TIMEOUT_S + REQUEUE_AFTER_S`` after its last sync."""

__all__ = ["NODE_TIMEOUT_S", "REQUEUE_AFTER_S"]
