"""``gpufleet model-server``: the inference server gpufleet deploys as a service replica.

uvicorn, numpy and the app are imported when the command runs, not when the CLI starts.
"""

from __future__ import annotations

import typer

from gpufleet.cli._common import BAD_INPUT, fail
from gpufleet.timefmt import parse_duration

GRACEFUL_SHUTDOWN_S = 10
"""On SIGTERM, in-flight requests (streams included) get this long to finish."""


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
        0.0, "--token-delay-ms", min=0.0, help="Time per generated token, so streaming is visible."
    ),
) -> None:
    """Serve a small real model: KServe v2 (Triton's HTTP protocol, binary tensors
    included) for a seeded MLP, and OpenAI-compatible toy /v1/completions,
    /v1/chat/completions and /v1/models.

    Ready (GET /v2/health/ready is 200) once --load-delay has passed; every reply has
    X-Gpufleet-Replica: $GPUFLEET_JOB_ID (else local). No authentication: put it behind
    the gateway.
    """
    try:
        load_delay_s = parse_duration(load_delay)
    except ValueError as exc:
        raise fail(f"--load-delay: {exc}", BAD_INPUT) from None

    import uvicorn

    from gpufleet.modelserver.app import create_app

    app = create_app(
        model_name=model,
        version=model_version,
        seed=seed,
        load_delay_s=load_delay_s,
        token_delay_ms=token_delay_ms,
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="auto",
        http="auto",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


__all__ = ["model_server"]
