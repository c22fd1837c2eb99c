"""The job state machine, below the services and the loops and above the models.

- ``states``: the states, which moves are legal, which states hold GPUs (``ACTIVE``).
- ``transitions``: every state change as a compare-and-set ``move`` written with its
  job-event row in the caller's transaction (``errors.Conflict`` when the row moved),
  and ``release_attempt``, the bookkeeping of an attempt that leaves SCHEDULED/RUNNING.
- ``requeue``: the one place that applies a job's requeue policy.
"""
