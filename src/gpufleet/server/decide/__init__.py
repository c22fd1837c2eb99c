"""Pure decisions of the server: no database, no clock of its own, no I/O.

``replicas`` (what a service's replicas do next), ``autoscale`` (how many to serve with),
``traffic`` (gateway reports as rates), ``health`` (GPU health rules), ``pricing`` (price
schedules). May import ``gpufleet.api`` and ``gpufleet.scheduler`` only."""
