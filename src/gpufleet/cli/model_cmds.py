"""``gpufleet model-server``: the inference server gpufleet deploys as a service replica.

uvicorn, numpy and the app are imported when the command runs, not when the CLI starts.
"""

from __future__ import annotations

import typer

from gpufleet.cli._common import BAD_INPUT, fail
from gpufleet.timefmt import parse_duration

GRACEFUL_SHUTDOWN_S = 10
"""On SIGTERM, in-flight requests (streams included) get this long to finish."""
KEEP_ALIVE = "75s"
"""How long an idle keep-alive connection stays open (``--keep-alive``). The rule: a
server keeps idle connections open longer than any client in front of it keeps them in
its pool, so the client always retires a connection first and never sends a request
on one the server is closing (the race that made the gateway answer 502: uvicorn's
default is 5 s, the gateway's pool kept them 30 s). 75 s is nginx's
``keepalive_timeout``; the gateway's pool keeps them ``gateway.app.UPSTREAM_KEEPALIVE_S``
(30 s)."""


def model_server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", envvar="PORT", min=1, max=65535, help="Port to listen on."),
    model: str = typer.Option("mlp", "--model", help="The model's name in URLs and replies."),
    model_version: str = typer.Option(
        "1",
        "--model-version",
        envvar="GPUFLEET_MODEL_VERSION",
        help="Version shown in replies (model_version; OpenAI model NAME:VERSION).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the MLP's weights and of the generated text."),
    load_delay: str = typer.Option(
        "0s", "--load-delay", help="Not ready (503) for this long after start: a simulated model load."
    ),
    token_delay_ms: float = typer.Option(
        0.0,
        "--token-delay-ms",
        min=0.0,
        help="Text generation: the fixed time of one decoding step (one token for every sequence"
        " in the batch), so streaming is visible.",
    ),
    token_delay_per_seq_us: float = typer.Option(
        0.0,
        "--token-delay-per-seq-us",
        min=0.0,
        help="Text generation: what each sequence in the batch adds to a step's time"
        " (a step costs --token-delay-ms + this x batch, as a GPU's grows little with the batch).",
    ),
    batching_mode: str = typer.Option(
        "continuous",
        "--batching",
        help="Text generation: continuous (sequences join and leave the batch at every step,"
        " as vLLM) or static (a batch runs until its longest sequence ends; the baseline).",
    ),
    max_num_seqs: int = typer.Option(
        64,
        "--max-num-seqs",
        "--max-batch",
        min=1,
        help="Text generation: most sequences decoded in one step.",
    ),
    max_waiting: int = typer.Option(
        1024,
        "--max-waiting",
        min=1,
        help="Text generation: most sequences waiting for a slot; beyond, 503 with Retry-After.",
    ),
    hidden: int = typer.Option(
        32, "--hidden", min=1, help="Width of the MLP's hidden layer (wider: more compute per row)."
    ),
    launch_overhead_us: float = typer.Option(
        2000.0,
        "--launch-overhead-us",
        min=0.0,
        help="Simulated fixed cost of each forward call, as a GPU's kernel launch and sync;"
        " batching spreads it over the batch. 0: the bare CPU computation.",
    ),
    max_batch_size: int = typer.Option(
        64, "--max-batch-size", min=1, help="Most rows in one request, and in one batched execution."
    ),
    max_queue_delay_us: int = typer.Option(
        0,
        "--max-queue-delay-us",
        min=0,
        help="Dynamic batching: how long a request may wait for others to join its batch"
        " (Triton's max_queue_delay_microseconds). 0: batching off.",
    ),
    keep_alive: str = typer.Option(
        KEEP_ALIVE,
        "--keep-alive",
        help="Close a keep-alive connection idle this long; keep it above the gateway's pool (30s).",
    ),
    access_log: bool = typer.Option(
        True, "--access-log/--no-access-log", help="One line per request on stderr (with its latency)."
    ),
    preferred_batch_size: list[str] = typer.Option(
        [],
        "--preferred-batch-size",
        help="Batch sizes that run without waiting out the delay (repeat, or 16,32)."
        " Default: --max-batch-size.",
    ),
) -> None:
    """Serve a small real model: KServe v2 (Triton's HTTP protocol, binary tensors
    included) for a seeded MLP, and OpenAI-compatible toy /v1/completions,
    /v1/chat/completions and /v1/models.

    Ready (GET /v2/health/ready is 200) once --load-delay has passed; every reply has
    X-Gpufleet-Replica: $GPUFLEET_JOB_ID (else local). No authentication: put it behind
    the gateway.

    With --max-queue-delay-us, concurrent infer requests run as one forward call (Triton's
    dynamic batcher). Text generation batches continuously (--batching). Statistics:
    GET /v2/models/{model}/stats (Triton's) and /metrics
    (Prometheus).
    """
    try:
        load_delay_s = parse_duration(load_delay)
    except ValueError as exc:
        raise fail(f"--load-delay: {exc}", BAD_INPUT) from None
    try:
        keep_alive_s = parse_duration(keep_alive)
    except ValueError as exc:
        raise fail(f"--keep-alive: {exc}", BAD_INPUT) from None
    if keep_alive_s < 1:
        raise fail("--keep-alive: at least 1s", BAD_INPUT)
    try:
        preferred = tuple(int(p) for item in preferred_batch_size for p in item.split(",") if p.strip())
    except ValueError:
        raise fail(f"--preferred-batch-size: not integers: {preferred_batch_size}", BAD_INPUT) from None

    import uvicorn

    from gpufleet.modelserver.app import create_app
    from gpufleet.modelserver.batcher import BatchPolicy
    from gpufleet.modelserver.engine import EnginePolicy

    try:
        batching = BatchPolicy(
            max_batch_size=max_batch_size,
            max_queue_delay_us=max_queue_delay_us,
            preferred_batch_sizes=preferred,
        )
    except ValueError as exc:
        raise fail(str(exc), BAD_INPUT) from None
    if batching_mode not in ("continuous", "static"):
        raise fail(f"--batching: continuous or static, not {batching_mode!r}", BAD_INPUT)
    generation = EnginePolicy(
        mode="static" if batching_mode == "static" else "continuous",
        max_num_seqs=max_num_seqs,
        max_waiting=max_waiting,
        step_s=token_delay_ms / 1000.0,
        step_per_seq_s=token_delay_per_seq_us / 1e6,
    )

    app = create_app(
        model_name=model,
        version=model_version,
        seed=seed,
        load_delay_s=load_delay_s,
        generation=generation,
        hidden=hidden,
        launch_overhead_us=launch_overhead_us,
        batching=batching,
        access_log=access_log,
    )
    if access_log:
        _log_to_stderr("gpufleet.modelserver.access")
    from gpufleet import netguard

    # header, body and idle timeouts; no cap per address: behind the gateway every caller is
    # its address; idle connections kept --keep-alive (longer than the gateway's pool keeps them)
    limits = netguard.GuardLimits(max_per_address=0, idle_timeout_s=keep_alive_s)
    guard = netguard.uvicorn_options(limits, netguard.GuardStats())
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="auto",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        **guard,
    )


def _log_to_stderr(name: str) -> None:
    """INFO lines of ``name`` on stderr, whatever uvicorn's log level (warning)."""
    import logging
    import sys

    logger = logging.getLogger(name)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


__all__ = ["KEEP_ALIVE", "model_server"]
