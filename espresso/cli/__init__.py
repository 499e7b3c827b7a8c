"""The ``espresso`` command line: one module per command group, sharing ``_common`` (exit
codes, console, inputs, progress) and ``report`` (how plans and estimates read).

Exit status: 0 success, 1 no plan / infeasible, 2 bad input (``error: ...`` on stderr),
130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.markup import escape

from .. import __version__
from ..errors import EspressoError
from . import _common, bench, export, frontier, info, launch, measure, planning

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    export.register(sub)
    bench.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except EspressoError as exc:
        _common.console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}")
        return _common.EXIT_USAGE
    except KeyboardInterrupt:
        _common.console(stderr=True).print("interrupted")
        return _common.EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
