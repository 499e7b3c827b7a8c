"""Training from a plan (``espresso train``, ``python -m espresso.train``): the plan's model
built stage by stage with the runner, real data, and ``metrics.jsonl`` to compare the run with
its plan (``espresso compare``). docs/training.md walks through it.

Imports nothing on its own: :mod:`.options`, :mod:`.data`, :mod:`.metrics` and
:mod:`.compare` are torch-free; :mod:`.loop` needs the ``torch`` extra.
"""
