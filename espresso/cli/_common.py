"""What the commands share: exit codes, the console, input helpers and the progress line."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console

from .. import _io
from .._validate import load_yaml
from ..catalog import Catalog
from ..cost import CostParams
from ..errors import CatalogError, ProfileError, SpecError
from ..profile import Profile
from ..progress import SearchProgress, TimeBudget
from ..search import usable_cores

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
"""The command could not finish: its output could not be written, memory ran out, or an
internal error (one line on stderr)."""
EXIT_INTERRUPTED = 130

T = TypeVar("T")


def console(stderr: bool = False) -> Console:
    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal:
        # Piped or captured output: tables take their natural width instead of 80 columns.
        con = Console(stderr=stderr, highlight=False, width=240)
    return con


def load_catalog(path: str | None, network_gbs: float | None = None) -> Catalog:
    """``--catalog`` (and ``--network-gbs``): see :meth:`Catalog.open`."""
    return Catalog.open(path, network_gbs=network_gbs)


def load_profiles(items: list[str] | None) -> dict[str, Profile] | None:
    """``--profile GPU=FILE`` (repeatable) -> {gpu: Profile}."""
    if not items:
        return None
    out: dict[str, Profile] = {}
    for item in items:
        gpu, sep, path = item.partition("=")
        if not sep or not gpu or not path:
            msg = f"--profile: expected GPU=FILE (e.g. A100-80GB=prof.json), got {item!r}"
            raise ProfileError(msg)
        prof = Profile.load(path)
        if prof.gpu != gpu:
            msg = f"--profile {item}: the file is a profile of {prof.gpu}, not {gpu}"
            raise ProfileError(msg)
        out[gpu] = prof
    return out


def load_cost_model(path: str | None) -> CostParams | None:
    """``--cost-model FILE``: CostParams from YAML/JSON (a mapping, or one under
    ``cost_model:``)."""
    if path is None:
        return None
    data = load_yaml("--cost-model", path, err=SpecError)
    if isinstance(data, dict) and set(data) == {"cost_model"}:
        data = data["cost_model"]
    if not isinstance(data, dict):
        msg = (f"--cost-model: {path!r} is not a mapping of cost-model constants "
               "(e.g. `bytes_per_weight: 4.0`); see docs/cost-model.md")
        raise SpecError(msg)
    return CostParams.from_dict(data)


def add_catalog_arg(p: argparse.ArgumentParser, what: str = "default: built-in") -> None:
    p.add_argument("--catalog", metavar="FILE",
                   help=f"catalog YAML/JSON, skypilot:VMS.CSV[,...], or builtin:cloud|gpus "
                        f"({what}: the dated snapshot of eight providers' offers, docs/catalog.md)")
    p.add_argument("--network-gbs", type=float, metavar="GBS",
                   help="GB/s per GPU between instances of offers whose instance type has no "
                        "published network figure (default: by provider class and GPU count, "
                        "stated under the plan; docs/catalog.md, \"Unknown instance types\")")


def add_availability_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quota", metavar="FILE",
                   help="instances available per provider/region/instance type (YAML/JSON, "
                        "docs/catalog.md)")
    p.add_argument("--max-instances", type=int, metavar="N",
                   help="at most N instances of any one offer")
    p.add_argument("--spot", action="store_true",
                   help="also offer every instance with a spot price on the spot market (the "
                        "search picks the market per offer; docs/cost-model.md, \"Spot capacity\")")
    p.add_argument("--spot-only", action="store_true",
                   help="only the spot market (instances without a spot price are dropped)")
    p.add_argument("--spot-rate", type=float, metavar="R",
                   help="interruptions per instance-hour of every spot instance (implies --spot; "
                        "default: each provider's published figure)")
    p.add_argument("--spot-recovery", type=float, metavar="H",
                   help="hours until a reclaimed spot instance is replaced (implies --spot; "
                        "default 0.25)")


def load_available(args: argparse.Namespace) -> Catalog:
    """``--catalog`` with ``--quota`` and ``--max-instances`` applied."""
    from ..cloud.quota import load_quota, max_instances

    catalog = load_catalog(args.catalog, getattr(args, "network_gbs", None))
    spot_only = getattr(args, "spot_only", False)
    rate, recovery = getattr(args, "spot_rate", None), getattr(args, "spot_recovery", None)
    if getattr(args, "spot", False) or spot_only or rate is not None or recovery is not None:
        from ..cloud.spot import with_spot

        catalog = with_spot(catalog, only=spot_only, rate=rate, recovery_hours=recovery)
    if getattr(args, "quota", None):
        catalog = load_quota(catalog, args.quota)
    if getattr(args, "max_instances", None) is not None:
        if args.max_instances < 0:
            msg = f"--max-instances: expected a count >= 0, got {args.max_instances}"
            raise CatalogError(msg)
        catalog = max_instances(catalog, args.max_instances)
    return catalog


def add_engine_arg(p: argparse.ArgumentParser) -> None:
    from ..engines import ENGINES

    p.add_argument("--engine", choices=tuple(ENGINES), default="espresso",
                   help="only plans this engine runs: espresso (the default: every plan, on "
                        "espresso train), torchtitan or megatron (one TP width; Megatron-LM's "
                        "layer split and ZeRO-1); docs/engines.md")


def add_cost_model_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--cost-model", metavar="FILE",
                   help=f"cost-model constants (YAML/JSON, docs/cost-model.md) {what}")


def add_profile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="append", metavar="GPU=FILE",
                   help="measured profile (espresso profile) replacing the analytic block "
                        "costs of GPU; repeatable")


def write_output(what: str, path: str, text: str) -> None:
    """``text`` to ``path`` (atomically), or to standard output for ``-``."""
    if path == "-":
        sys.stdout.write(text)
    else:
        _io.write_text(what, path, text)


def write_json(what: str, path: str, data: Any) -> None:
    """JSON to ``path`` (atomically), or to standard output for ``-``."""
    write_output(what, path, json.dumps(data, indent=2) + "\n")


def port(text: str) -> int:
    """``--port``: the TCP port of the process group (and of torchrun's rendezvous)."""
    from ..runner.launch import MAX_PORT

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= MAX_PORT:
        msg = f"expected a port from 1 to {MAX_PORT}, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def threads_arg(con: Console, threads: int | None) -> int | None:
    """``--threads``: at least 1; more than this machine's cores is capped with a note (a
    search thread per core is the most that helps; beyond, threads only contend)."""
    if threads is None:
        return None
    if threads < 1:
        msg = f"--threads: expected a count >= 1, got {threads}"
        raise SpecError(msg)
    cores = usable_cores()
    if threads > cores:
        con.print(f"[dim]Note: --threads {threads} is more than the {cores} cores this process "
                  f"may use; searching with {cores}.[/]")
        return cores
    return threads


def note_threads(con: Console, asked: int | None, stats: Any) -> None:
    """Say so when the system could not start every search thread asked for."""
    wanted = asked or usable_cores()
    if 0 < stats.threads < wanted:
        con.print(f"[dim]Note: the system started only {stats.threads} of {wanted} search "
                  "threads (a memory or process limit); the search ran on those.[/]")


def check_output(what: str, path: str | None) -> None:
    """Refuse an output path that cannot be written (an empty one included) before doing
    the work; ``-`` is standard output."""
    if path is not None and path != "-":
        _io.check_writable(what, path)


def _describe(snap: dict[str, Any]) -> str:
    parts = [snap["phase"]]
    best = snap["best"]
    if best is not None:
        parts.append(f"best ${best:,.2f}" if snap["objective"] == "cost"
                     else f"best {best:,.1f} h")
        gap = snap["gap"]
        parts.append("proven" if gap == 0 else f"gap {gap:.1%}" if gap is not None else "")
    parts.append(f"{snap['nodes']:,} nodes")
    return ", ".join(p for p in parts if p)


def run_with_progress(con: Console, label: str, fn: Callable[[], T],
                      progress: SearchProgress | None = None,
                      budget: TimeBudget | None = None) -> T:
    """Run ``fn()`` in a worker thread; after one second show a status line with the elapsed
    time, the limit, and (given ``progress``) the best plan so far and its proven gap.

    Ctrl-C with a ``progress`` cancels the search, which then returns the best it found:
    ``fn()``'s result comes back and ``progress.cancelled`` tells the caller to print and
    write it as unproven and exit 130. A second Ctrl-C (or one without ``progress``) raises
    KeyboardInterrupt at once."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        fut = pool.submit(fn)
        try:
            return _wait(con, label, fut, progress, budget)
        except KeyboardInterrupt:
            if progress is None or progress.cancelled:
                raise
            progress.cancel()
        con.print("[yellow]Interrupted:[/] stopping with the best plan found so far "
                  "(Ctrl-C again to quit at once)")
        return _wait(con, "Stopping", fut, progress, budget)


def _wait(con: Console, label: str, fut: concurrent.futures.Future[T],
          progress: SearchProgress | None, budget: TimeBudget | None) -> T:
    try:
        return fut.result(timeout=1.0)
    except concurrent.futures.TimeoutError:
        pass
    start = time.monotonic() - 1.0
    limit = (f" of {budget.limit_s:g} s" if budget is not None and budget.limit_s else "")
    with con.status(label) as status:
        while True:
            try:
                return fut.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                text = _describe(progress.snapshot()) if progress is not None else label
                status.update(f"{text} ({time.monotonic() - start:.0f} s{limit})")
