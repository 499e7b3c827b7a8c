"""Build the built-in catalog (``espresso/data/offers.json``) from SkyPilot ``vms.csv`` files.

    python -m espresso.cloud.snapshot aws=PATH gcp=PATH lambda=PATH --date YYYY-MM-DD

keeps the GPUs with bf16 tensor cores, one offer per (provider, region, instance type), and
the default availability (instances holding 32 GPUs per offer). docs/catalog.md says where
the files come from and how to refresh them.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

from .. import _io
from ..errors import CatalogError
from .skypilot import DEFAULT_GPUS_PER_OFFER, read_skypilot


def build(paths: list[str], date: str, sources: list[str]) -> dict[str, object]:
    read = read_skypilot(paths, bf16_only=True)
    notes = [
        f"snapshot of SkyPilot catalogs (v8) taken {date}: {'; '.join(sources)}",
        f"availability is an assumption: {DEFAULT_GPUS_PER_OFFER} GPUs per offer (whole "
        "instances); give your quotas with --quota or --max-instances",
    ]
    return {"notes": notes, "offers": [o.to_dict() for o in read.offers],
            "skipped": read.summary()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m espresso.cloud.snapshot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="PROVIDER=vms.csv (or a file named after it)")
    ap.add_argument("--date", required=True, help="when the source files were taken")
    ap.add_argument("--source", action="append", default=[],
                    help="where a file comes from (repository, path, commit); repeatable")
    ap.add_argument("--out", default=None, help="default: the package's data/offers.json")
    args = ap.parse_args(argv)
    try:
        data = build(args.files, args.date, args.source or ["(sources not given)"])
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
