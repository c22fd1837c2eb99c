"""The control loops, in one room. Each is a step (observe, then act; one bad item
never stops it) on the one runner (``runner.Loop``); ``app.py`` builds them all with
``build.build`` and starts and stops them as one (``runner.Loops``).

=================  ====================================================  ===============
loop               what a step does                                      when
=================  ====================================================  ===============
``scheduling``     time limits; snapshot -> ``plan()`` -> one commit      woken, >= 1/s
                   (``scheduling.py``); the plan's reservation moves and
                   idle releases (``reservations.py``); in a child
                   process with ``gpufleet server`` (``child.py``)
``lifecycle``      lost / back nodes, drains, rollouts                    woken, 1/s
                   (``lifecycle.py``), GPU health cordons and
                   recoveries (``health.py``)
``accrual``        cost, energy, utilisation of every running job;        ``--accrual-interval``
                   soft-budget warnings (``accrual.py``)
``alerts``         built-in alert rules -> webhook (``alerts.py``)        ``--alert-interval``
``audit-retention``  audit rows past ``--audit-days`` deleted             hourly
``auto-mig``       idle MIG GPUs re-laid out for the waiting slice or       ``--auto-mig-interval``
                   whole-GPU jobs (``automig.py``, ``scheduler/migplan``;
                   only with ``--auto-mig``)
=================  ====================================================  ===============

Layers: routers -> services -> job state machine (``jobstate``) -> models; loops ->
services / jobstate; nothing imports upward (a service never imports a loop).
"""
