"""Continuous batching of the model server's text generation (``modelserver.engine``):
the engine in-process against ``textgen.generate`` (its answers held against unbatched
generation; joins, leaves and cancellation counted in steps, not timed), then a real
``gpufleet model-server`` subprocess with httpx and the openai client (streams, a
client that leaves, a full queue, ``--batching static``)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import openai
import pytest

from gpufleet.modelserver.engine import EngineFull, EnginePolicy, Group, Mode, TextEngine
from gpufleet.modelserver.textgen import Decoder, generate
from services.test_modelserver import Server, start, stop

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def decoder(
    prompt: str = "p", *, max_tokens: int = 8, choice: int = 0, stops: tuple[str, ...] = ()
) -> Decoder:
    return Decoder(model="m", seed=1, prompt=prompt, choice=choice, max_tokens=max_tokens, stops=stops)


async def steps_until(engine: TextEngine, steps: int) -> None:
    while engine.steps < steps:
        await asyncio.sleep(0)


# --- the engine in-process ------------------------------------------------------------------


def test_batched_answers_are_the_unbatched_ones() -> None:
    """Many concurrent requests (several choices, stops that cut a token, max_tokens 0,
    more sequences than slots) each get what ``generate`` gives alone."""
    rng = random.Random(5)
    cases = [
        (
            f"prompt {k}",
            rng.choice([0, 1, 3, 17, 60]),
            rng.randint(1, 3),
            tuple(rng.sample([" GPU", "ue q", "e", " node", "s the"], rng.randint(0, 2))),
        )
        for k in range(40)
    ]

    async def main() -> list[list[Any]]:
        engine = TextEngine(EnginePolicy(max_num_seqs=8))
        groups = [
            engine.submit([decoder(p, max_tokens=mt, choice=c, stops=st) for c in range(n)])
            for p, mt, n, st in cases
        ]
        got = [await g.wait() for g in groups]
        assert not engine.running and not engine.waiting
        await engine.close()
        return got

    got = run(main())
    for (p, mt, n, st), gens in zip(cases, got, strict=True):
        want = [generate(model="m", seed=1, prompt=p, choice=c, max_tokens=mt, stops=st) for c in range(n)]
        assert gens == want


def test_streamed_updates_join_to_the_answer() -> None:
    async def main() -> tuple[list[str], list[str | None], Any]:
        engine = TextEngine()
        group = engine.submit([decoder(max_tokens=6), decoder(max_tokens=3, choice=1)])
        texts = ["", ""]
        finishes: list[str | None] = [None, None]
        async for updates in group.updates():
            for u in updates:
                texts[u.index] += u.piece or ""
                assert finishes[u.index] is None  # nothing after a choice's finish
                finishes[u.index] = u.finish_reason
        return texts, finishes, group.generations()

    texts, finishes, gens = run(main())
    assert texts == [g.text for g in gens] and finishes == ["length", "length"]


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_a_short_request_leaves_before_a_long_one_of_its_batch(mode: Mode) -> None:
    async def main() -> tuple[int, int]:
        engine = TextEngine(EnginePolicy(mode=mode))
        long, short = engine.submit([decoder(max_tokens=40)]), engine.submit([decoder(max_tokens=5)])
        await short.wait()
        short_at = engine.steps
        await long.wait()
        return short_at, engine.steps

    short_at, long_at = run(main())
    assert (short_at, long_at) == (5, 40)


@pytest.mark.parametrize(
    ("mode", "joins_at"),
    [("continuous", 10), ("static", 40)],
    ids=["continuous-joins-mid-batch", "static-waits-for-the-batch"],
)
def test_a_late_request_joins_the_running_batch(mode: Mode, joins_at: int) -> None:
    """B arrives at step 10 of A's 40: continuous, its first token comes in step 11 and it
    is done at step 15, A still running; static, it waits for A's batch to end (step 40)."""

    async def main() -> tuple[int, int, bool]:
        engine = TextEngine(EnginePolicy(mode=mode))
        a = engine.submit([decoder(max_tokens=40)])
        await steps_until(engine, 10)
        b = engine.submit([decoder("b", max_tokens=5)])
        first_at = -1
        async for _ in b.updates():
            first_at = engine.steps if first_at < 0 else first_at
        done_at, a_running = engine.steps, not a.finished
        await a.wait()
        return first_at, done_at, a_running

    first_at, done_at, a_running = run(main())
    # the reader may see a step late: the engine can run one more before it wakes
    assert joins_at + 1 <= first_at <= joins_at + 2 and joins_at + 5 <= done_at <= joins_at + 6
    assert a_running == (mode == "continuous")


def test_at_most_max_num_seqs_run_and_the_oldest_join_first() -> None:
    async def main() -> list[int]:
        engine = TextEngine(EnginePolicy(max_num_seqs=2))
        groups = [engine.submit([decoder(str(k), max_tokens=3 + k)]) for k in range(4)]
        widest = 0
        done: list[int] = []
        while len(done) < 4:
            widest = max(widest, len(engine.running))
            done += [k for k, g in enumerate(groups) if g.finished and k not in done]
            await asyncio.sleep(0)
        assert widest == 2
        return done

    assert run(main()) == [0, 1, 2, 3]


def test_a_cancelled_request_frees_its_slot_at_the_next_step() -> None:
    async def main() -> tuple[int, int, list[Group]]:
        engine = TextEngine(EnginePolicy(max_num_seqs=1))
        gone = engine.submit([decoder(max_tokens=1000)])
        queued_and_gone = engine.submit([decoder("q", max_tokens=1000)])
        waiting = engine.submit([decoder("w", max_tokens=4)])
        await steps_until(engine, 3)
        engine.cancel(queued_and_gone)  # out of the queue at once
        assert len(engine.waiting) == 1
        engine.cancel(gone)
        cancelled_at = engine.steps
        await waiting.wait()
        return cancelled_at, engine.steps, [gone, queued_and_gone]

    cancelled_at, done_at, cancelled = run(main())
    assert done_at <= cancelled_at + 5  # its 4 steps, and the one the cancel came during
    assert all(not g.finished for g in cancelled)


def test_a_full_queue_refuses_and_a_request_larger_than_it_never_fits() -> None:
    async def main() -> None:
        engine = TextEngine(EnginePolicy(max_num_seqs=1, max_waiting=2))
        engine.submit([decoder(max_tokens=50, choice=c) for c in range(3)])  # a free slot, and 2
        await steps_until(engine, 1)
        with pytest.raises(EngineFull) as full:
            engine.submit([decoder("x")])
        assert full.value.retry_after_s >= 1 and len(engine.waiting) == 2
        with pytest.raises(ValueError, match="exceed"):
            engine.submit([decoder(choice=c) for c in range(4)])
        await engine.close()

    run(main())


def test_a_step_costs_its_base_plus_a_little_per_sequence() -> None:
    policy = EnginePolicy(step_s=0.01, step_per_seq_s=0.0001)
    assert policy.step_cost_s(1) == pytest.approx(0.0101) and policy.step_cost_s(64) == pytest.approx(0.0164)
    with pytest.raises(ValueError, match="batching"):
        EnginePolicy(mode="dynamic")  # type: ignore[arg-type]


def test_close_fails_what_has_not_finished() -> None:
    async def main() -> None:
        engine = TextEngine(EnginePolicy(step_s=0.01))
        group = engine.submit([decoder(max_tokens=100)])
        await steps_until(engine, 1)
        await engine.close()
        with pytest.raises(RuntimeError, match="shutting down"):
            await group.wait()

    run(main())


# --- a real server --------------------------------------------------------------------------

STEP_MS = 5


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """Two slots, two places in the queue, 5 ms a step."""
    proc, srv = start(
        "--token-delay-ms", str(STEP_MS), "--max-num-seqs", "2", "--max-waiting", "2", "--no-access-log"
    )
    yield srv
    stop(proc)


def completion(max_tokens: int, prompt: str = "p", **extra: Any) -> dict[str, Any]:
    return {"model": "mlp", "prompt": prompt, "max_tokens": max_tokens, **extra}


def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/v2/health/ready").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_short_request_is_answered_while_a_long_stream_runs(server: Server) -> None:
    """Through the openai client: a long stream started first is still streaming when a
    short request sent after it has its answer; both are what the unbatched model says."""
    base = f"http://{server.url}"
    wait_ready(base)
    oai = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    long_done = threading.Event()
    streamed: list[str] = []

    def long() -> None:
        for chunk in oai.completions.create(model="mlp", prompt="long", max_tokens=200, stream=True):
            streamed.append(chunk.choices[0].text)
        long_done.set()

    thread = threading.Thread(target=long)
    thread.start()
    deadline = time.monotonic() + 10
    while not streamed:  # the long one is in the batch
        assert time.monotonic() < deadline
        time.sleep(0.01)
    short = oai.completions.create(model="mlp", prompt="short", max_tokens=5)
    assert not long_done.is_set()  # 200 steps of 5 ms: a second; the short one took 5
    thread.join(20)
    assert long_done.is_set()
    assert short.usage is not None and short.usage.completion_tokens == 5
    assert short.choices[0].text == generate(model="mlp", seed=0, prompt="short", choice=0, max_tokens=5).text
    assert "".join(streamed) == generate(model="mlp", seed=0, prompt="long", choice=0, max_tokens=200).text


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_client_that_leaves_frees_its_slots(server: Server, stream: bool) -> None:
    """Two clients fill both slots with requests of 4,000 steps (20 s) and leave; a
    request after them is answered within a second, which it could not be if their
    sequences still ran."""
    base = f"http://{server.url}"
    wait_ready(base)
    for k in range(2):
        body = completion(4000, f"leaver {k}", stream=stream)
        with httpx.Client(base_url=base) as c:
            if stream:
                with c.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    next(r.iter_lines())  # it runs, then the connection closes
            else:
                with pytest.raises(httpx.ReadTimeout):
                    c.post("/v1/completions", json=body, timeout=0.3)
    t0 = time.monotonic()
    r = httpx.post(f"{base}/v1/completions", json=completion(3), timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert time.monotonic() - t0 < 1.0


def metric(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_full_queue_is_a_503_with_retry_after_in_openais_shape(server: Server) -> None:
    """Two slots and two places in the queue: the fifth sequence is refused, nothing of
    it runs; /metrics shows the batch and the queue; once the queue has room, requests
    are taken again."""
    base = f"http://{server.url}"
    wait_ready(base)
    tokens_before = metric(base, "gpufleet_model_generated_tokens_total")

    async def main() -> tuple[list[httpx.Response], httpx.Response, tuple[float, float]]:
        async with httpx.AsyncClient(base_url=base, timeout=20) as c:
            busy = [
                asyncio.create_task(c.post("/v1/completions", json=completion(60, f"b{k}"))) for k in range(4)
            ]
            await asyncio.sleep(0.15)  # all four in: two run, two wait
            refused = await c.post("/v1/completions", json=completion(1, "late"))
            text = (await c.get("/metrics")).text
            seen = tuple(
                float(line.rsplit(" ", 1)[1])
                for name in ("gpufleet_model_sequences_running", "gpufleet_model_sequences_waiting")
                for line in text.splitlines()
                if line.startswith(name + "{")
            )
            return list(await asyncio.gather(*busy)), refused, (seen[0], seen[1])

    busy, refused, (running, waiting) = run(main())
    assert [r.status_code for r in busy] == [200] * 4
    assert (running, waiting) == (2, 2)
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "queue_full" and "queue" in error["message"]
    oai = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    again = oai.chat.completions.create(
        model="mlp", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert again.usage is not None and again.usage.completion_tokens == 2
    assert metric(base, "gpufleet_model_generated_tokens_total") - tokens_before == 4 * 60 + 2


def test_more_choices_than_slots_and_queue_together_is_a_400(server: Server) -> None:
    base = f"http://{server.url}"
    wait_ready(base)
    r = httpx.post(f"{base}/v1/completions", json=completion(2, n=5))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert httpx.post(f"{base}/v1/completions", json=completion(2, n=4)).status_code == 200


def test_static_batching_makes_a_late_short_request_wait() -> None:
    """``--batching static``: a short request sent while a long one runs is answered only
    after the long one ends (what continuous batching removes: the test above)."""
    proc, srv = start("--batching", "static", "--token-delay-ms", str(STEP_MS), "--no-access-log")
    try:
        base = f"http://{srv.url}"
        wait_ready(base)

        async def main() -> tuple[float, float]:
            async with httpx.AsyncClient(base_url=base, timeout=20) as c:
                t0 = time.monotonic()
                long = asyncio.create_task(c.post("/v1/completions", json=completion(100, "long")))
                await asyncio.sleep(0.1)
                short = await c.post("/v1/completions", json=completion(2, "short"))
                short_s = time.monotonic() - t0
                assert short.status_code == 200 and (await long).status_code == 200
                return short_s, time.monotonic() - t0

        short_s, long_s = run(main())
        assert short_s >= 100 * STEP_MS / 1000 * 0.9 and short_s >= long_s - 0.1
    finally:
        stop(proc)


def test_an_unknown_batching_mode_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "model-server", "--batching", "dynamic"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0 and "--batching" in done.stderr
