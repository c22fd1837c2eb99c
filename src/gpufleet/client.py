"""``GpufleetClient``: the typed HTTP client of the gpufleet API (used by the CLI).

Exceptions: every failure is a ``ClientError`` with a one-line ``message`` and, when the
server answered, its HTTP ``status`` and problem ``detail``. httpx errors never leak.
Connection settings: ``GPUFLEET_URL`` / ``GPUFLEET_TOKEN`` / ``GPUFLEET_CA_FILE`` (the
cluster CA, for an https:// server whose certificate gpufleet's CA signed), else the file
written by ``gpufleet login`` (``<user config dir>/gpufleet/config.json``, mode 0600).
Requests go out on the standard library (``litehttp``: a command does not import httpx,
~25-30 ms of its start-up); pass ``transport=`` (an httpx transport, e.g.
``httpx.MockTransport``) to send through httpx instead, as tests without a server do.

Several servers (``GPUFLEET_URL=http://a:8080,http://b:8080``: one cluster's servers,
any of which answers any call): a request goes to the one that answered last, and moves
on to the next when it never reached it; one that may have reached it moves on only if
it is repeatable (GET, PUT, DELETE; ``failover.py`` has the rule), so a ``POST /v1/jobs``
that timed out is an error naming the servers tried, never a second job.

A 429 (rate limit, busy lane) is waited out and retried, ``Retry-After`` seconds at a
time, for up to ``max_wait_s`` in all: the server refuses a request with 429 before it
does anything, so a retry never repeats a write. List methods follow ``next_cursor`` to
the end; their first page asks for 100 items and the next ones for 1,000, because a page
costs the server's rate limit by the items it asks for.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from gpufleet.failover import CONNECT_TIMEOUT_S, NoAnswer, Servers, first_answer, parse_urls
from gpufleet.failover import repeatable as method_repeatable

if TYPE_CHECKING:
    import ssl
    from pathlib import Path

    import httpx
    from pydantic import BaseModel

    from gpufleet.api.audit import AuditOut
    from gpufleet.api.bulk import JobsChanged
    from gpufleet.api.chargeback import PricesOut, UsageReport
    from gpufleet.api.credentials import NodeCredentialOut
    from gpufleet.api.jobs import Cancelled, JobDetail, JobOut
    from gpufleet.api.nodes import NodeOut, SyncReply
    from gpufleet.api.reservations import ReservationOut
    from gpufleet.api.users import PoolOut, TeamOut, TokenCreated, TokenOut, UserCreated, UserOut
    from gpufleet.litehttp import LiteHTTP

M = TypeVar("M", bound="BaseModel")

BULK_TIMEOUT_S = 600.0
"""How long a change of many jobs (cancel, hold, release, update by array, user or
filter) waits for its answer, instead of the client's 30 s: the server finishes such a
change once it has it, so a client that gave up first would report a failure for work
that was done (issue 35: a 10,000-task cancel took 27-30 s). The server makes the
waiting part of it a few statements (``services/bulkjobs.py``: well under a second for
10,000 tasks); only the running jobs it stops are one transaction each."""


class ClientError(Exception):
    def __init__(self, message: str, *, status: int | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.detail = detail
        """The server's problem detail alone (``message`` says more around it)."""


def config_file() -> str:
    """``gpufleet login``'s file: ``<user config dir>/gpufleet/config.json``. On Linux the
    directory is the XDG rule, written out here (what ``platformdirs.user_config_dir``
    answers there, checked by a test): importing platformdirs, pathlib and dataclasses
    was ~10 ms of every command's start-up. Elsewhere, platformdirs says."""
    if sys.platform.startswith("linux"):
        base = os.environ.get("XDG_CONFIG_HOME", "").strip() or os.path.expanduser("~/.config")
        return os.path.join(base, "gpufleet", "config.json")
    import platformdirs

    return os.path.join(platformdirs.user_config_dir("gpufleet"), "config.json")


def config_path() -> Path:
    from pathlib import Path

    return Path(config_file())


class Connection(NamedTuple):
    """A tuple, not a dataclass: ``dataclasses`` imports ``inspect`` (~5 ms of start-up)."""

    url: str
    """One server URL, or several comma-separated (``parse_urls``)."""
    token: str | None
    ca_file: str | None = None


def tls_verify(ca_file: str | None) -> ssl.SSLContext | bool:
    """httpx's ``verify``: the system's trust store, or exactly the cluster CA."""
    if not ca_file:
        return True
    import ssl

    return ssl.create_default_context(cafile=ca_file)


class _Answer(Protocol):
    """What the client reads of an answer: httpx's ``Response`` or ``litehttp.Response``."""

    @property
    def status_code(self) -> int: ...

    @property
    def reason_phrase(self) -> str: ...

    @property
    def headers(self) -> Any: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


def load_connection() -> Connection:
    saved: dict[str, Any] = {}
    path = config_file()
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
        except (OSError, ValueError) as exc:
            raise ClientError(f"cannot read {path}: {exc}") from exc
    url = os.environ.get("GPUFLEET_URL") or saved.get("url") or "http://127.0.0.1:8080"
    token = os.environ.get("GPUFLEET_TOKEN") or saved.get("token")
    ca = os.environ.get("GPUFLEET_CA_FILE") or saved.get("ca_file")
    return Connection(url=str(url), token=None if token is None else str(token), ca_file=ca and str(ca))


def save_connection(conn: Connection) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": conn.url, "token": conn.token, "ca_file": conn.ca_file}, f)
    os.chmod(path, 0o600)
    return path


def _job_filters(
    *,
    states: list[str] | None = None,
    user: str | None = None,
    team: str | None = None,
    pool: str | None = None,
    array: int | None = None,
    since: float | None = None,
    until: float | None = None,
    ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """``GET /v1/jobs``'s query for these filters (those given). ``ids``: these jobs and
    the tasks of arrays of these ids (``job=``, repeated); a server from before it
    ignores it and lists more, so a caller filters what it gets as well."""
    params: dict[str, Any] = {"state": ",".join(states)} if states else {}
    if ids:
        params["job"] = list(ids)
    given = {"user": user, "team": team, "pool": pool, "array": array, "since": since, "until": until}
    return params | {k: v for k, v in given.items() if v is not None}


class GpufleetClient:
    """``url``: one server URL, or several (a sequence, or comma-separated) of one
    cluster, failed over between as ``failover.py`` says."""

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        max_wait_s: float = 60.0,
        ca_file: str | None = None,
    ) -> None:
        try:
            urls = parse_urls(url)
        except ValueError as exc:
            raise ClientError(f"server URL: {exc}") from exc
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.servers = Servers(urls)
        self.max_wait_s = max_wait_s
        connect = min(timeout, CONNECT_TIMEOUT_S) if len(urls) > 1 else timeout
        self._http: httpx.Client | None = None
        self._lite: LiteHTTP | None = None
        if transport is None:
            from gpufleet.litehttp import LiteHTTP

            self._lite = LiteHTTP(headers=headers, timeout=timeout, connect_timeout=connect, ca_file=ca_file)
        else:
            import httpx

            self._http = httpx.Client(
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=connect),
                transport=transport,
                verify=tls_verify(ca_file),
            )

    @property
    def url(self) -> str:
        """The server that answered last (before any did, the first given)."""
        return self.servers.current

    @classmethod
    def from_env(cls) -> GpufleetClient:
        conn = load_connection()
        return cls(conn.url, conn.token, ca_file=conn.ca_file)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._lite is not None:
            self._lite.close()

    def __enter__(self) -> GpufleetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport --------------------------------------------------------------------------
    def request(self, method: str, path: str, *, repeatable: bool | None = None, **kw: Any) -> Any:
        """``repeatable``: whether the request may be sent to another server after it may
        have reached one (default: by its method, ``failover.repeatable``)."""
        again = method_repeatable(method) if repeatable is None else repeatable
        waited = 0.0
        while True:
            resp = self._send(method, path, repeatable=again, **kw)
            pause = _retry_after(resp)
            if pause is None or waited + pause > self.max_wait_s:
                break
            time.sleep(pause)
            waited += pause
        if resp.status_code >= 400:
            raise ClientError(_problem_line(resp), status=resp.status_code, detail=_detail(resp))
        try:
            return resp.json()
        except ValueError as exc:
            raise ClientError(f"server {self.url} sent a non-JSON answer ({resp.status_code})") from exc

    def _send(self, method: str, path: str, *, repeatable: bool, **kw: Any) -> _Answer:
        """The first answer from the servers in turn (``failover.first_answer``, or
        ``litehttp.first_answer`` by the same rule). A proxy's 502/503/504 after which the
        walk ends is an error naming the servers tried; with one server, the answer (as it
        always was)."""
        resp: _Answer
        try:
            if self._lite is not None:
                from gpufleet.litehttp import first_answer as lite_first_answer

                lite = self._lite
                resp, _ = lite_first_answer(
                    self.servers,
                    lambda url: lite.request(method, f"{url}/v1{path}", **kw),
                    repeatable=repeatable,
                )
            else:
                http = self._http
                assert http is not None
                resp, _ = first_answer(
                    self.servers,
                    lambda url: http.request(method, f"{url}/v1{path}", **kw),
                    repeatable=repeatable,
                )
        except NoAnswer as exc:
            detail = None if exc.response is None else _detail(exc.response)
            raise ClientError(str(exc), status=exc.status, detail=detail) from exc.__cause__
        return resp

    def _get(self, model: type[M], method: str, path: str, **kw: Any) -> M:
        from pydantic import ValidationError

        try:
            return model.model_validate(self.request(method, path, **kw))
        except ValidationError as exc:
            raise ClientError(f"unexpected answer from {path}: {exc.error_count()} schema errors") from exc

    def _list(self, model: type[M], path: str, params: dict[str, Any] | None = None) -> list[M]:
        """Every page of a paged list (``{"items", "next_cursor"}``), validated."""
        from pydantic import TypeAdapter, ValidationError

        try:
            return TypeAdapter(list[model]).validate_python(self.pages(path, params))  # type: ignore[valid-type]
        except ValidationError as exc:
            raise ClientError(f"unexpected answer from {path}: {exc.error_count()} schema errors") from exc

    def pages(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every item of a paged list (``{"items", "next_cursor"}``), as the server's JSON:
        objects, not validated. For a listing that is only printed (``gpufleet queue``),
        which then never imports pydantic (~50 ms of a command's start-up)."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            query = {**(params or {}), "limit": 1000 if cursor else 100}
            body = self.request("GET", path, params=query if cursor is None else {**query, "cursor": cursor})
            items = body.get("items") if isinstance(body, dict) else None
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise ClientError(f"unexpected answer from {path}: not a page")
            out += items
            cursor = body.get("next_cursor")
            if cursor is None:
                return out

    # -- jobs -------------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any]) -> JobDetail:
        from gpufleet.api.jobs import JobDetail

        return self._get(JobDetail, "POST", "/jobs", json=spec)

    def all_jobs(self, **filters: Any) -> list[JobOut]:
        """Every job the filters match (``states``, ``user``, ``team``, ``pool``, ``array``;
        ``since``/``until``: jobs in the system at some time in that window), every page."""
        from gpufleet.api.jobs import JobOut

        return self._list(JobOut, "/jobs", _job_filters(**filters))

    def job_listing(self, *, collapsed: bool = False, **filters: Any) -> list[dict[str, Any]]:
        """:meth:`all_jobs` as the server's JSON objects (``JobOut``'s fields), not
        validated: for ``gpufleet queue``, which prints them (see :meth:`pages`).
        ``collapsed``: an array's tasks waiting in one state are one item, with
        ``array_tasks`` (``5-99``) and ``array_task_count``, as ``squeue`` shows them (a
        server from before lists every task, without those fields)."""
        params = _job_filters(**filters) | ({"arrays": "collapsed"} if collapsed else {})
        return self.pages("/jobs", params)

    def job(self, job_id: int) -> JobDetail:
        from gpufleet.api.jobs import JobDetail

        return self._get(JobDetail, "GET", f"/jobs/{job_id}")

    def cancel(self, job_id: int) -> JobDetail:
        from gpufleet.api.jobs import JobDetail

        return self._get(JobDetail, "POST", f"/jobs/{job_id}/cancel")

    def cancel_many(self, spec: dict[str, Any]) -> Cancelled:
        """``POST /v1/jobs/cancel``: every job of yours matching all of ``ids``, ``array``,
        ``user``, ``states``, ``name`` given. Waits up to ``BULK_TIMEOUT_S`` for the
        answer (see there)."""
        from gpufleet.api.jobs import Cancelled

        return self._get(Cancelled, "POST", "/jobs/cancel", json=spec, timeout=BULK_TIMEOUT_S)

    def change_many(self, verb: str, spec: dict[str, Any]) -> JobsChanged:
        """``POST /v1/jobs/{hold,release,update}``: every job of yours matching ``spec``
        (``cancel_many``'s fields; ``update``: and ``set``), waiting as ``cancel_many``."""
        from gpufleet.api.bulk import JobsChanged

        return self._get(JobsChanged, "POST", f"/jobs/{verb}", json=spec, timeout=BULK_TIMEOUT_S)

    def requeue(self, job_id: int) -> JobDetail:
        from gpufleet.api.jobs import JobDetail

        return self._get(JobDetail, "POST", f"/jobs/{job_id}/requeue")

    def update(self, job_id: int, changes: dict[str, Any]) -> JobDetail:
        """``PATCH /v1/jobs/{id}``: ``time_limit``, ``name``, ``held``."""
        from gpufleet.api.jobs import JobDetail

        return self._get(JobDetail, "PATCH", f"/jobs/{job_id}", json=changes)

    def hold(self, job_id: int) -> JobDetail:
        from gpufleet.api.jobs import JobDetail

        return self._get(JobDetail, "POST", f"/jobs/{job_id}/hold")

    def release(self, job_id: int) -> JobDetail:
        from gpufleet.api.jobs import JobDetail

        return self._get(JobDetail, "POST", f"/jobs/{job_id}/release")

    def set_priority(self, job_id: int, priority: int) -> JobDetail:
        from gpufleet.api.jobs import JobDetail

        return self._get(JobDetail, "PUT", f"/jobs/{job_id}/priority", json={"priority": priority})

    # -- reservations -----------------------------------------------------------------------
    def reserve(self, spec: dict[str, Any]) -> list[ReservationOut]:
        from pydantic import TypeAdapter, ValidationError

        from gpufleet.api.reservations import ReservationOut

        try:
            return TypeAdapter(list[ReservationOut]).validate_python(
                self.request("POST", "/reservations", json=spec)
            )
        except ValidationError as exc:
            raise ClientError(
                f"unexpected answer from /reservations: {exc.error_count()} schema errors"
            ) from exc

    def reservations(self, *, include_past: bool = False) -> list[ReservationOut]:
        from gpufleet.api.reservations import ReservationOut

        return self._list(ReservationOut, "/reservations", {"all": "true"} if include_past else {})

    def cancel_reservation(self, reservation_id: int) -> ReservationOut:
        from gpufleet.api.reservations import ReservationOut

        return self._get(ReservationOut, "DELETE", f"/reservations/{reservation_id}")

    # -- nodes ------------------------------------------------------------------------------
    def nodes(self, *, pool: str | None = None) -> list[NodeOut]:
        from gpufleet.api.nodes import NodeOut

        return self._list(NodeOut, "/nodes", {} if pool is None else {"pool": pool})

    def node(self, name: str) -> NodeOut:
        from gpufleet.api.nodes import NodeOut

        return self._get(NodeOut, "GET", f"/nodes/{name}")

    def put_node(self, name: str, spec: dict[str, Any]) -> NodeOut:
        from gpufleet.api.nodes import NodeOut

        return self._get(NodeOut, "PUT", f"/nodes/{name}", json=spec)

    def sync_node(self, name: str, body: dict[str, Any]) -> SyncReply:
        from gpufleet.api.nodes import SyncReply

        # a sync is idempotent (server/services/sync.py): safe to send again elsewhere
        return self._get(SyncReply, "POST", f"/nodes/{name}/sync", repeatable=True, json=body)

    # -- accounts and pools -------------------------------------------------------------------
    def whoami(self) -> UserOut:
        from gpufleet.api.users import UserOut

        return self._get(UserOut, "GET", "/users/me")

    def users(self) -> list[UserOut]:
        from gpufleet.api.users import UserOut

        return self._list(UserOut, "/users")

    def create_user(self, name: str, *, role: str, teams: list[str]) -> UserCreated:
        from gpufleet.api.users import UserCreated

        return self._get(UserCreated, "POST", "/users", json={"name": name, "role": role, "teams": teams})

    def teams(self) -> list[TeamOut]:
        from gpufleet.api.users import TeamOut

        return self._list(TeamOut, "/teams")

    def create_team(self, name: str) -> TeamOut:
        from gpufleet.api.users import TeamOut

        return self._get(TeamOut, "POST", "/teams", json={"name": name})

    def node_credentials(self, *, node: str | None = None) -> list[NodeCredentialOut]:
        """Every join token and node certificate (operators), all pages."""
        from gpufleet.api.credentials import NodeCredentialOut

        return self._list(NodeCredentialOut, "/node-credentials", {"node": node} if node else None)

    def set_default_team(self, user: str, team: str) -> UserOut:
        from gpufleet.api.users import UserOut

        return self._get(UserOut, "PUT", f"/users/{user}/default-team", json={"team": team})

    def add_member(self, team: str, user: str) -> TeamOut:
        from gpufleet.api.users import TeamOut

        return self._get(TeamOut, "POST", f"/teams/{team}/members", json={"user": user})

    def set_quota(self, team: str, *, gpus: int, limit: int | None) -> TeamOut:
        from gpufleet.api.users import TeamOut

        return self._get(TeamOut, "PUT", f"/teams/{team}/quota", json={"gpus": gpus, "limit": limit})

    def set_budget(self, team: str, *, soft: float | None, hard: float | None) -> TeamOut:
        from gpufleet.api.users import TeamOut

        return self._get(TeamOut, "PUT", f"/teams/{team}/budget", json={"soft": soft, "hard": hard})

    # -- prices and usage ---------------------------------------------------------------------
    def prices(self) -> PricesOut:
        from gpufleet.api.chargeback import PricesOut

        return self._get(PricesOut, "GET", "/prices")

    def set_prices(self, schedule: dict[str, Any]) -> PricesOut:
        from gpufleet.api.chargeback import PricesOut

        return self._get(PricesOut, "PUT", "/prices", json=schedule)

    def usage(
        self, *, by: str = "team", month: str | None = None, start: str | None = None, end: str | None = None
    ) -> UsageReport:
        from gpufleet.api.chargeback import UsageReport

        params = {
            k: v for k, v in {"by": by, "month": month, "from": start, "to": end}.items() if v is not None
        }
        return self._get(UsageReport, "GET", "/usage", params=params)

    def pools(self) -> list[PoolOut]:
        from gpufleet.api.users import PoolOut

        return self._list(PoolOut, "/pools")

    def create_pool(self, name: str, *, gpu: bool, description: str = "", default: bool = False) -> PoolOut:
        from gpufleet.api.users import PoolOut

        body = {"name": name, "gpu": gpu, "description": description, "default": default}
        return self._get(PoolOut, "POST", "/pools", json=body)

    def update_pool(self, name: str, **fields: Any) -> PoolOut:
        """``PATCH /pools/NAME`` with the fields given (``description``, ``default``)."""
        from gpufleet.api.users import PoolOut

        return self._get(PoolOut, "PATCH", f"/pools/{name}", json=fields)

    def delete_pool(self, name: str) -> PoolOut:
        from gpufleet.api.users import PoolOut

        return self._get(PoolOut, "DELETE", f"/pools/{name}")

    def tokens(self, *, user: str | None = None) -> list[TokenOut]:
        from gpufleet.api.users import TokenOut

        return self._list(TokenOut, "/tokens", {} if user is None else {"user": user})

    def create_token(
        self, *, name: str, user: str | None = None, expires_in: str | None = None
    ) -> TokenCreated:
        from gpufleet.api.users import TokenCreated

        body = {"name": name, "user": user} | ({} if expires_in is None else {"expires_in": expires_in})
        return self._get(TokenCreated, "POST", "/tokens", json=body)

    def revoke_token(self, token_id: int) -> TokenOut:
        from gpufleet.api.users import TokenOut

        return self._get(TokenOut, "DELETE", f"/tokens/{token_id}")

    def audit(
        self, *, user: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[AuditOut]:
        """The newest ``limit`` audit rows (admins), following pages as needed."""
        from gpufleet.api.audit import AuditPage

        out: list[AuditOut] = []
        cursor: str | None = None
        while len(out) < limit:
            params: dict[str, Any] = {"limit": min(1000, limit - len(out))}
            params |= {
                k: v for k, v in (("user", user), ("since", since), ("cursor", cursor)) if v is not None
            }
            page = self._get(AuditPage, "GET", "/audit", params=params)
            out += page.items
            cursor = page.next_cursor
            if cursor is None:
                break
        return out


def _detail(resp: _Answer) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip().splitlines()[0][:200] if resp.text.strip() else ""
    return str(body.get("detail") or body.get("title") or "") if isinstance(body, dict) else ""


def _problem_line(resp: _Answer) -> str:
    detail = _detail(resp)
    prefix = {
        401: "not authenticated (check GPUFLEET_TOKEN or run `gpufleet login`)",
        403: "forbidden",
        404: "not found",
        429: "too many requests (retried for a while)",
    }.get(resp.status_code, f"server said {resp.status_code} {resp.reason_phrase}")
    return f"{prefix}: {detail}" if detail else prefix


def _retry_after(resp: _Answer) -> float | None:
    """Seconds to wait before retrying a 429, or None (not a 429, or no usable header)."""
    if resp.status_code != 429:
        return None
    try:
        return max(0.0, float(resp.headers.get("Retry-After", "")))
    except ValueError:
        return None
