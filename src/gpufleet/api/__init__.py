"""The wire types of gpufleet's REST API (``/v1``): every request and reply body, as
Pydantic models. The server validates and answers with them; the client and the agent
parse with them. Plain Pydantic, no server code, so ``gpufleet queue`` stays fast.

One module per subject: ``base`` (the request and reply bases and what every request
refuses), ``jobs``, ``nodes`` (inventory, telemetry, the agent's sync), ``users``
(users, teams, tokens, pools), ``chargeback`` (prices, usage, budgets),
``maintenance``, ``reservations``, ``audit``, ``credentials`` (node join tokens and
certificates), ``fleet`` (the fleet page's read endpoints).
"""
