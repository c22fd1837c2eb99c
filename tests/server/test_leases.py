"""When an idle node's lease renewal stands for a full sync (``agentstate.Leases``,
issue 35): a table of what refuses one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpufleet.server.store.agentstate import Leases

Renew = Callable[[Leases, str], bool]


@pytest.mark.parametrize(
    ("renew", "ok"),
    [
        (lambda ls, t: ls.renew("n1", t, version="b.3", now=110.0), True),
        (lambda ls, t: ls.renew("n1", "someone-elses", version="b.3", now=110.0), False),
        (lambda ls, t: ls.renew("n2", t, version="b.3", now=110.0), False),
        (lambda ls, t: ls.renew("n1", t, version="b.4", now=110.0), False),
        (lambda ls, t: ls.renew("n1", t, version="c.3", now=110.0), False),
        (lambda ls, t: ls.renew("n1", t, version="b.3", now=131.0), False),
        (lambda ls, t: ls.renew("n1", t, version="b.3", now=130.0), True),
        (lambda ls, t: ls.revoke("n1") or ls.renew("n1", t, version="b.3", now=110.0), False),
        (lambda ls, t: ls.clear() or ls.renew("n1", t, version="b.3", now=110.0), False),
    ],
    ids=[
        "stands",
        "wrong-token",
        "other-node",
        "rung-since",
        "server-restarted",
        "silent-past-timeout",
        "silent-to-the-timeout",
        "revoked",
        "fleet-reshaped",
    ],
)
def test_a_renewal_stands_only_while_nothing_moved(renew: Renew, ok: bool) -> None:
    leases = Leases(silence_s=30.0, max_age_s=300.0)
    token = leases.grant("n1", version="b.3", at=100.0)
    assert renew(leases, token) is ok


def test_a_refused_renewal_drops_the_lease() -> None:
    leases = Leases(silence_s=30.0, max_age_s=300.0)
    token = leases.grant("n1", version="b.3", at=100.0)
    assert not leases.renew("n1", token, version="b.4", now=110.0)
    assert not leases.renew("n1", token, version="b.3", now=111.0)  # the node syncs in full
    assert len(leases) == 0


def test_renewals_carry_it_forward_until_its_age() -> None:
    leases = Leases(silence_s=30.0, max_age_s=300.0)
    token = leases.grant("n1", version="b.3", at=0.0)
    assert all(leases.renew("n1", token, version="b.3", now=float(t)) for t in range(20, 301, 20))
    assert not leases.renew("n1", token, version="b.3", now=320.0)  # a full sync every max_age_s
