"""An idle node on lease renewals (issue 35) keeps its liveness exactly as one that syncs:
a real agent renews through two node timeouts and stays Ready, goes NotReady within
the timeout once it stops, and comes back through a full sync."""

from __future__ import annotations

import time
from collections.abc import Callable

from failover.conftest import NODE_TIMEOUT_S, Node, make_pool, node_out, until
from server.conftest import Server


def test_an_idle_node_renews_and_still_goes_notready_when_it_stops(
    fast_server: Server, nodes: Callable[..., Node]
) -> None:
    node = nodes(pool=make_pool(fast_server), gpus=2)
    stats = node.agent.stats
    until(lambda: stats.renewals >= 3, what="renewals")
    syncs, renewals = stats.syncs, stats.renewals
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2 * NODE_TIMEOUT_S:
        assert node_out(fast_server, node.name)["state"] == "Ready"
        time.sleep(0.1)
    assert stats.renewals - renewals >= 4
    assert stats.syncs - syncs <= 1  # (an ECC count the simulated GPUs may tick up is news)
    node.pause()
    stopped = time.monotonic()
    until(lambda: node_out(fast_server, node.name)["state"] == "NotReady", what="NotReady")
    assert time.monotonic() - stopped <= NODE_TIMEOUT_S + 1.0
    syncs = stats.syncs
    node.resume()  # silent past the timeout: its lease is refused, it syncs in full
    until(lambda: node_out(fast_server, node.name)["state"] == "Ready", what="Ready again")
    assert stats.syncs > syncs
