"""Suite-wide setup: the unprivileged accounts real jobs run as (see ``jobaccounts.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobaccounts import JOB_ACCOUNT, OTHER_ACCOUNT, ensure_account, passable


@pytest.fixture(scope="session", autouse=True)
def job_accounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    for name in (JOB_ACCOUNT, OTHER_ACCOUNT):
        ensure_account(name)
    passable(tmp_path_factory.getbasetemp())
    yield
