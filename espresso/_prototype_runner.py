"""Run the Espresso paper's prototype planner (GitHub Espresso111/Espresso) from its source, in
a process of its own: ``python _prototype_runner.py IN.json OUT.json``.

IN names the source checkout, the GPUs (the fields of the prototype's ``gpu_config.json``),
their availability and the model (its ``Model`` fields); OUT receives the planner's answer
and its time, or the error. This file imports nothing of Espresso: it runs under whichever
interpreter holds the prototype's own dependencies (``fire`` and DeepSpeed's pipeline
schedule), which need not hold Espresso (:mod:`espresso.prototype_source` starts it).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

# This file's folder is Espresso's package, whose modules (torch.py, profile.py, ...) would
# shadow the libraries the prototype imports: off the path.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    root = spec["source"]
    sys.path[:0] = [root, f"{root}/Espresso/llm-analysis"]
    from Espresso import GPUAllocator  # type: ignore[import-not-found]
    from Espresso.utils import GPU, Model  # type: ignore[import-not-found]

    gpus = [GPU(**g) for g in spec["gpus"]]
    # The allocator reads its GPU list from the file beside it and its availability from a
    # list in its source (one entry per GPU, then a 0): both are this job's here.
    GPUAllocator.load_gpus_from_config = lambda: gpus
    GPUAllocator.limit = [*spec["limits"], 0]
    # Three switches of its authors' experiments that the published source reads but never
    # defines: off, the planner as published.
    GPUAllocator.test_overhead = GPUAllocator.testBP = GPUAllocator.testCP = False
    model = Model(**spec["model"])
    started = time.perf_counter()
    answer = GPUAllocator.gpu_allocator(model, beta=spec.get("beta", 0.8))
    return {"result": answer, "seconds": time.perf_counter() - started}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: _prototype_runner.py IN.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    try:
        out = _run(spec)
    except BaseException as exc:  # everything goes back to the caller
        out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
