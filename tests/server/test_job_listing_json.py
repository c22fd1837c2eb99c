"""``GET /v1/jobs`` writes its page straight from the database's rows (``services/jobs.
list_jobs``: no ``JobOut`` validated per row, issue 31's fast ``gpufleet queue``). Held
here to what validating would give: every item has ``JobOut``'s fields in ``JobOut``'s
order, and validating then dumping it changes nothing (types, rounding, nulls) — for
pending, placed, running, ended and array jobs, with their allocations, on both
databases. And the detail route agrees with the list on every listed field."""

from __future__ import annotations

from typing import Any

from gpufleet.api.jobs import JobOut
from server.conftest import Server, make_pool, make_team, ok, wait_for
from server.playnode import attempt_of, eventually, register, submit, sync


def test_a_listed_job_is_exactly_what_jobout_would_write(server: Server) -> None:
    team = make_team(server)
    pool = make_pool(server)
    node, token = register(server, pool=pool, gpus=4)
    ran = submit(server, pool=pool, team=team, gpus=2, gpu_type="H100", time_limit="1h", name="é ran")
    arr = submit(server, pool=pool, team=team, gpus=1, array="0-1")
    attempt = attempt_of(wait_for(server, ran["id"], "SCHEDULED"))
    sync(server, node, {"jobs": [{"job_id": ran["id"], "state": "running", "attempt": attempt}]}, token=token)
    wait_for(server, ran["id"], "RUNNING")
    task = attempt_of(wait_for(server, arr["id"], "SCHEDULED"))
    done = {"job_id": arr["id"], "state": "exited", "attempt": task, "exit_code": 3}
    sync(server, node, {"jobs": [done]}, token=token)
    wait_for(server, arr["id"], "FAILED")
    waiting = submit(server, pool=pool, team=team, gpus=4, name="waits")  # 3 GPUs of 4 are held
    eventually(lambda: wait_for(server, waiting["id"], "PENDING")["queue_position"] is not None)
    with server.client() as c:
        page = ok(c.get("/jobs", params={"team": team, "limit": 2}))
        rest = ok(c.get("/jobs", params={"team": team, "limit": 1000, "cursor": page["next_cursor"]}))
        details = {j["id"]: ok(c.get(f"/jobs/{j['id']}")) for j in page["items"] + rest["items"]}
    assert list(page) == ["items", "next_cursor", "total"] and rest["next_cursor"] is None
    items: list[dict[str, Any]] = page["items"] + rest["items"]
    assert [j["id"] for j in items] == sorted(details) and len(items) == 4
    for item in items:
        assert list(item) == list(JobOut.model_fields), item["id"]
        assert JobOut.model_validate(item).model_dump(mode="json") == item
        assert {k: details[item["id"]][k] for k in item} == item
    by_id = {j["id"]: j for j in items}
    assert by_id[ran["id"]]["allocation"] and by_id[ran["id"]]["state"] == "RUNNING"
    assert by_id[arr["id"]]["exit_code"] == 3 and by_id[arr["id"]]["array_task_id"] == 0
    assert by_id[waiting["id"]]["wait_reason"] and by_id[waiting["id"]]["queue_position"] is not None


def test_job_lists_only_those_jobs_and_arrays(server: Server) -> None:
    """``?job=`` (``sacct -j``): these jobs, and every task of an array named by its id;
    an id out of PostgreSQL's integer matches nothing (no 500), as ``/steps``."""
    team = make_team(server)
    pool = make_pool(server)
    one, other = (submit(server, pool=pool, team=team, gpus=1) for _ in range(2))
    arr = submit(server, pool=pool, team=team, gpus=1, array="0-2")
    with server.client() as c:

        def ids(*job: int) -> list[int]:
            return [j["id"] for j in ok(c.get("/jobs", params={"team": team, "job": list(job)}))["items"]]

        assert ids(one["id"]) == [one["id"]]
        assert ids(arr["id"], other["id"]) == [other["id"], arr["id"], arr["id"] + 1, arr["id"] + 2]
        assert ids(arr["id"] + 1) == [arr["id"] + 1]  # a task by its own id: that task
        assert ids(2**31, 2**63) == []
        assert len(ids()) == 5  # none given: no filter
        too_many = c.get("/jobs", params={"job": list(range(1, 1002))})
        assert too_many.status_code == 422
