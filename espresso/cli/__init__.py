"""The ``espresso`` command line: one module per command group, sharing ``_common`` (exit
codes, console, inputs, progress) and ``report`` (how plans and estimates read).

Exit status: 0 success, 1 no plan / infeasible, 2 bad input (``error: ...`` on stderr),
3 the command could not finish (its output could not be written, memory ran out, or an
internal error: one line on stderr; ``ESPRESSO_DEBUG=1`` shows the traceback), 130
interrupted (after printing and writing what was found).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from rich.markup import escape

from .. import __version__
from ..errors import EspressoError
from . import _common, _streams, bench, export, frontier, info, launch, measure, planning, train

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse, reading ``--deadline -1d`` and ``--port -5`` as a flag and its (bad) value,
    for the value's check to refuse with its own words: no option of ours looks like a
    negative number, so a word starting ``-`` and a digit is never an option."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = re.compile(r"^-\.?\d")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="espresso",
        description="Plan cost-efficient training of large transformers on heterogeneous "
        "cloud GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"espresso {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    info.register(sub)
    planning.register(sub)
    frontier.register(sub)
    measure.register(sub)
    launch.register(sub)
    train.register(sub)
    export.register(sub)
    bench.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    with _streams.guarded():
        try:
            return _main(argv)
        except _streams.StreamError as exc:
            _streams.silence(exc.stream)
            _say(f"error: {exc}")
            return _common.EXIT_FAILED


def _say(line: str) -> None:
    """One line on stderr, unless stderr itself cannot be written."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except _streams.StreamError as exc:
        _streams.silence(exc.stream)


PATH_ARGS = {"catalog": "--catalog", "quota": "--quota", "job": "--job",
             "cost_model": "--cost-model", "profile": "--profile", "json": "--json",
             "plot": "--plot", "out": "--out", "cost_out": "--cost-out", "bench": "--bench",
             "hosts": "--hosts", "out_dir": "--out-dir", "plan": "PLAN", "suite": "SUITE",
             "dir": "DIR", "script": "--script", "workdir": "--workdir", "model": "--model",
             "data": "--data", "metrics": "--metrics", "tokenizer": "--tokenizer",
             "checkpoint_dir": "--checkpoint-dir", "from_run": "--from-run",
             "wheel": "--wheel"}
"""Arguments that name a file or folder (by ``dest``): an empty one is refused up front, not
read as "not given" or as the current folder."""


def _refuse_empty_paths(args: argparse.Namespace) -> None:
    for dest, flag in PATH_ARGS.items():
        value = getattr(args, dest, None)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not item.strip():
                msg = f"{flag}: an empty name; expected a file or folder"
                raise EspressoError(msg)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        sys.stdout.flush()  # --help on a full disk fails here, inside the guard
        raise
    try:
        _refuse_empty_paths(args)
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except EspressoError as exc:
        _common.console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}")
        return _common.EXIT_USAGE
    except KeyboardInterrupt:
        _common.console(stderr=True).print("interrupted")
        return _common.EXIT_INTERRUPTED
    except _streams.StreamError:
        raise
    except MemoryError:
        _say("error: out of memory (an input too large for this machine's memory limit?)")
        return _common.EXIT_FAILED
    except Exception as exc:
        # The last net: every known failure has its own message; anything else is a bug,
        # said in one line (ESPRESSO_DEBUG=1: the traceback, as the tests run).
        if os.environ.get("ESPRESSO_DEBUG"):
            raise
        _say(f"error: internal error ({type(exc).__name__}: {str(exc)[:300]}); this is a bug in "
             "espresso: please report it with the command (ESPRESSO_DEBUG=1 shows the "
             "traceback)")
        return _common.EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
