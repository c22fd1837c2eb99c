"""Service functions: one per API operation, keyword arguments only, each one short
transaction. They return schemas or a ``Failure`` value; they never decide policy
(placement, order and preemption belong to ``gpufleet.scheduler``)."""
