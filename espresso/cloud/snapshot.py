"""Build the built-in catalog (``espresso/data/offers.json``) from SkyPilot ``vms.csv`` files.

From files you downloaded (one per provider; record where each came from)::

    curl -Lo aws_vms.csv https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/COMMIT/catalogs/v8/aws/vms.csv
    python -m espresso.cloud.snapshot aws=aws_vms.csv gcp=gcp_vms.csv lambda=lambda_vms.csv \\
        vast=examples/catalogs/vast_vms.csv ... \\
        --date YYYY-MM-DD --source "skypilot-catalog catalogs/v8/aws/vms.csv @COMMIT" ...

(the shipped snapshot's eight files and its exact command: docs/catalog.md, "The shipped
snapshot"; the five GPU clouds' files are in examples/catalogs/)

or from the catalog SkyPilot keeps where it is installed (``~/.sky/catalogs/v8/<cloud>/vms.csv``,
fetched by SkyPilot itself, e.g. on ``sky show-gpus``)::

    python -m espresso.cloud.snapshot --from-sky [--providers aws,gcp,lambda,vast] --date YYYY-MM-DD

It keeps every GPU of the spec table (those without bf16 serve fp16 jobs), one offer per
(provider, region, instance type; of a GPU cloud's host sizes of the same GPUs, one), and the
default availability (instances holding 32 GPUs per offer; a marketplace's offer has the
hosts its file lists), prints what it skipped and why, and writes the package's
``data/offers.json`` (or ``--out``). docs/catalog.md says which files and commits the shipped
snapshot was built from.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

from .. import _io
from ..catalog import assumption_note
from ..errors import CatalogError
from .skypilot import DEFAULT_GPUS_PER_OFFER, PROVIDERS, read_skypilot

SKY_CATALOGS = "~/.sky/catalogs/v8"
"""Where SkyPilot keeps the v8 catalogs it downloads (its ``CATALOG_DIR`` and schema
version)."""
SNAPSHOT_PROVIDERS = ("aws", "gcp", "lambda", "vast", "shadeform", "nebius", "cudo", "hyperbolic")


def sky_files(root: str | Path = SKY_CATALOGS,
              providers: tuple[str, ...] = SNAPSHOT_PROVIDERS) -> list[str]:
    """``PROVIDER=PATH`` of each provider's ``vms.csv`` under SkyPilot's catalog folder;
    an error naming the folder and the providers when none is there."""
    base = Path(root).expanduser()
    found = [f"{p}={base / p / 'vms.csv'}" for p in providers if (base / p / "vms.csv").is_file()]
    if not found:
        msg = (f"--from-sky: no SkyPilot catalog in {base} for {', '.join(providers)} "
               f"(expected {base}/<provider>/vms.csv; SkyPilot downloads them when it is used, "
               "e.g. `sky show-gpus`); or give the files themselves")
        raise CatalogError(msg)
    return found


def build(paths: list[str], date: str, sources: list[str]) -> dict[str, object]:
    read = read_skypilot(paths)
    notes = [
        f"snapshot of SkyPilot catalogs (v8) taken {date}: {'; '.join(sources)}",
        assumption_note(DEFAULT_GPUS_PER_OFFER,
                        own_counts=any(o.availability for o in read.offers)),
    ]
    return {"notes": notes, "offers": [o.to_dict() for o in read.offers],
            "skipped": read.summary()}


def _providers(text: str) -> tuple[str, ...]:
    out = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    bad = [p for p in out if p not in PROVIDERS]
    if not out or bad:
        msg = (f"--providers: expected a comma-separated list of {', '.join(PROVIDERS)}, "
               f"got {text!r}")
        raise argparse.ArgumentTypeError(msg)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m espresso.cloud.snapshot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="PROVIDER=vms.csv (or a file named after it)")
    ap.add_argument("--from-sky", nargs="?", const=SKY_CATALOGS, metavar="DIR",
                    help=f"read SkyPilot's installed catalog (default folder: {SKY_CATALOGS})")
    ap.add_argument("--providers", type=_providers, default=SNAPSHOT_PROVIDERS,
                    help="with --from-sky: the providers to read (default: "
                         f"{','.join(SNAPSHOT_PROVIDERS)})")
    ap.add_argument("--date", required=True, help="when the source files were taken")
    ap.add_argument("--source", action="append", default=[],
                    help="where a file comes from (repository, path, commit); repeatable")
    ap.add_argument("--out", default=None, help="default: the package's data/offers.json")
    args = ap.parse_args(argv)
    try:
        files = list(args.files)
        sources = list(args.source)
        if args.from_sky is not None:
            sky = sky_files(args.from_sky, args.providers)
            files += sky
            sources += [f"SkyPilot's installed catalog {f.partition('=')[2]}" for f in sky]
        if not files:
            ap.error("give vms.csv files, or --from-sky")
        data = build(files, args.date, sources or ["(sources not given)"])
        out = Path(args.out) if args.out else Path(str(
            resources.files("espresso").joinpath("data/offers.json")))
        _io.write_text("snapshot", out, json.dumps(data, indent=0) + "\n", err=CatalogError)
    except CatalogError as exc:
        print(f"error: {exc}")
        return 2
    print(f"{len(data['offers'])} offers -> {out}")  # type: ignore[arg-type]
    for line in data["skipped"]:  # type: ignore[attr-defined]
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
