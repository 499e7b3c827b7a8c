"""The runner: a plan run with PyTorch.

* :mod:`~espresso.runner.launch` — the rank layout, hosts and ``torchrun`` commands derived
  from a plan (no torch needed: the CLI and the SkyPilot export use it);
* :mod:`~espresso.runner.stage` — this rank's pipeline stage, schedule and data-parallel
  groups (:func:`~espresso.runner.stage.setup`, the ``torch`` extra);
* :mod:`~espresso.runner.tp` — tensor and sequence parallelism of a stage;
* :mod:`~espresso.runner.states` — recomputation and FSDP/ZeRO sharding of a stage;
* :mod:`~espresso.runner.checkpoint` — saving and resuming each rank's stage.

User code imports :mod:`espresso.torch`, the public face of the torch parts. Importing this
package imports nothing, so the torch-free launcher never pulls torch in.
"""
