"""``gpufleet model-server``: a small but real inference server, what gpufleet's demo
and tests deploy as a service replica (CPU here, GPUs elsewhere).

It serves one model, a seeded numpy MLP (``model``), over two protocols that real
third-party clients speak unmodified:

- KServe v2 / Open Inference Protocol as Triton speaks it (``tritonclient.http``),
  with Triton's binary tensor data extension (``kserve``): ``GET /v2``,
  ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{m}[/versions/{v}]``,
  ``.../ready``, ``.../config``, ``POST .../infer``, Triton's repository API
  (``/v2/repository/index``, ``.../models/{m}/load`` and ``/unload``: ``repository``)
  and Triton's statistics ``.../stats`` (``stats``);
- OpenAI-compatible toy text generation (``openai_api``, ``textgen``):
  ``GET /v1/models``, ``POST /v1/completions`` and ``/v1/chat/completions``, plain or
  streamed as Server-Sent Events (``logprobs`` honoured, options it cannot honour
  refused by name), and ``POST /v1/embeddings`` (``embeddings``). Generation is
  batched continuously, as vLLM does (``engine``: sequences join and leave the batch
  at every decoding step; ``--batching static`` for the baseline), on a simulated step
  cost of ``--token-delay-ms`` plus ``--token-delay-per-seq-us`` per sequence.

One access-log line per request with its latency (``accesslog``; the CLI's
``--no-access-log`` turns it off); idle keep-alive connections are kept 75 s
(``--keep-alive``), longer than the gateway's pool keeps them.

Infer requests run through Triton's dynamic batcher (``batcher``: off unless a queue
delay is set) on a simulated GPU (``model.SimulatedDevice``: the real MLP plus a fixed
cost per forward call); ``GET /metrics`` is Prometheus.

Every reply carries ``X-Gpufleet-Replica`` (``$GPUFLEET_JOB_ID`` or ``local``); the
model version shows in ``model_version`` (KServe) and ``model``/``system_fingerprint``
(OpenAI, ``NAME:VERSION``). The app is ``app.create_app``; this package imports nothing
so that the CLI stays fast.
"""
