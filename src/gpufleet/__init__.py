"""gpufleet: one control plane for a shared GPU cluster."""

__version__ = "0.1.0"
