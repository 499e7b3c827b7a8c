"""``espresso gpus`` and ``espresso models``: what the built-in data holds."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from rich.table import Table

from ..model import ModelSpec
from . import _common as c

if TYPE_CHECKING:
    from ..catalog import Catalog


def _models_table(catalog: Any, title: str) -> Table:
    """One row per GPU model of an offers catalog: spec, offers, cheapest per-GPU price."""
    table = Table(title=title, caption="$/GPU-h: the cheapest offer's instance price / GPUs; "
                  "`espresso offers` lists every offer")
    for col in ("GPU", "vendor", "mem GB", "TFLOPS", "HBM GB/s", "offers", "providers",
                "min $/GPU-h", "TFLOPS/$"):
        table.add_column(col, justify="left" if col in ("GPU", "vendor", "providers")
                         else "right", no_wrap=True)
    models: dict[str, list[Any]] = {}
    for g in catalog:
        models.setdefault(g.model, []).append(g)
    for name, rows in models.items():
        g = rows[0]
        cheapest = min(r.price_per_hour for r in rows)
        table.add_row(name, g.vendor or "", f"{g.memory_gb:g}", f"{g.bf16_tflops:g}",
                      f"{g.mem_bandwidth_gbs:g}", str(len(rows)),
                      ", ".join(sorted({r.provider or "local" for r in rows})),
                      f"{cheapest:.3f}",
                      f"{g.bf16_tflops / cheapest:.0f}" if cheapest > 0 else "inf")
    return table


def _check_filters(args: argparse.Namespace, catalog: Any) -> None:
    """A filter that names nothing in the catalog is a typo, not an empty answer."""
    import fnmatch

    from .. import _validate as v
    from ..errors import CatalogError

    known = {"--provider": sorted({g.provider or "local" for g in catalog}),
             "--gpu": sorted({g.model for g in catalog}),
             "--region": sorted({g.region or "" for g in catalog} - {""})}
    for flag, given in (("--provider", args.provider), ("--gpu", args.gpu),
                        ("--region", args.region)):
        for item in given or ():
            hit = (any(fnmatch.fnmatchcase(r, item) for r in known[flag]) if flag == "--region"
                   else item in known[flag])
            if not hit:
                shown = (_regions_by_provider(catalog) if flag == "--region" else
                         ", ".join(known[flag][:30]) + (", ..." if len(known[flag]) > 30 else ""))
                msg = (f"{flag} {item!r}{v.suggest(item, known[flag])}: the catalog has "
                       f"no such {flag[2:]}; it has: {shown or 'none'}")
                raise CatalogError(msg)


def _regions_by_provider(catalog: Catalog, per: int = 6) -> str:
    """Each provider's regions, the first few of each (a marketplace's regions are places
    with commas in them, such as 'Texas, US, NA': quoted)."""
    by: dict[str, set[str]] = {}
    for g in catalog:
        if g.region:
            by.setdefault(g.provider or "local", set()).add(g.region)
    parts = []
    for prov, regions in sorted(by.items()):
        names = [repr(r) if "," in r else r for r in sorted(regions)]
        parts.append(f"{prov}: {', '.join(names[:per])}"
                     + (f", ... ({len(names)})" if len(names) > per else ""))
    return "; ".join(parts)


def cmd_offers(args: argparse.Namespace) -> int:
    import fnmatch

    catalog = c.load_available(args)
    _check_filters(args, catalog)
    rows = [g for g in catalog
            if (not args.provider or (g.provider or "local") in args.provider)
            and (not args.region or any(fnmatch.fnmatchcase(g.region or "", p)
                                        for p in args.region))
            and (not args.gpu or g.model in args.gpu)]
    rows.sort(key=lambda g: (g.price_per_hour, g.name))
    if args.json:
        print(json.dumps([{**g.to_dict(), "instance_price_per_hour": g.instance_price_per_hour,
                           "instances": g.instances} for g in rows], indent=2))
        return c.EXIT_OK
    shown = rows if args.limit is None else rows[:args.limit]
    table = Table(title=f"Offers ({len(rows)} of {len(catalog)}"
                  f"{', cheapest GPU-hour first' if rows else ''})",
                  caption="net: network between instances, GB/s per GPU; "
                          "intra: link inside an instance")
    for col in ("provider", "region", "instance", "GPU", "GPUs", "$/h", "$/GPU-h", "spot $/h",
                "avail", "intra", "net", "net source"):
        table.add_column(col, justify="left" if col in ("provider", "region", "instance", "GPU",
                                                         "net source") else "right",
                         no_wrap=True)
    for g in shown:
        spot = (None if g.spot_price_per_hour is None
                else g.spot_price_per_hour * g.gpus_per_node)
        table.add_row(g.provider or "local", g.region or "-", g.instance_label, g.model,
                      str(g.gpus_per_node), f"{g.instance_price_per_hour:,.3f}",
                      f"{g.price_per_hour:.3f}", "-" if spot is None else f"{spot:,.3f}",
                      str(g.instances), f"{g.intra_node_gbs:g}", f"{g.inter_node_gbs:.3g}",
                      g.network_source or "-")
    con = c.console()
    con.print(table)
    if len(shown) < len(rows):
        con.print(f"... {len(rows) - len(shown)} more (--limit, --provider, --region, --gpu)")
    for note in catalog.notes:
        con.print(f"[dim]Catalog: {note}[/]")
    return c.EXIT_OK


def cmd_gpus(args: argparse.Namespace) -> int:
    catalog = c.load_catalog(args.catalog, getattr(args, "network_gbs", None))
    if args.json:
        print(json.dumps(catalog.to_dict(), indent=2))
        return c.EXIT_OK
    title = f"GPU catalog ({'built-in' if args.catalog is None else args.catalog})"
    if catalog.has_offers:
        c.console().print(_models_table(catalog, title))
        return c.EXIT_OK
    table = Table(title=f"GPU catalog ({'built-in' if args.catalog is None else args.catalog})")
    for col in ("GPU", "mem GB", "TFLOPS", "HBM GB/s", "intra", "inter", "/node", "$/h",
                "spot $/h", "count", "TFLOPS/$", "TFLOPS/GB"):
        table.add_column(col, justify="left" if col == "GPU" else "right", no_wrap=True)
    for g in catalog:
        table.add_row(
            g.name, f"{g.memory_gb:g}", f"{g.bf16_tflops:g}", f"{g.mem_bandwidth_gbs:g}",
            f"{g.intra_node_gbs:g}", f"{g.inter_node_gbs:g}", str(g.gpus_per_node),
            f"{g.price_per_hour:.3f}",
            "-" if g.spot_price_per_hour is None else f"{g.spot_price_per_hour:.3f}",
            str(g.count),
            f"{g.bf16_tflops / g.price_per_hour:.0f}" if g.price_per_hour > 0 else "inf",
            f"{g.bf16_tflops / g.memory_gb:.2f}",
        )
    c.console().print(table)
    return c.EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    names = ModelSpec.preset_names()
    if args.json:
        out = {n: {**ModelSpec.preset(n).to_dict(), "num_params": ModelSpec.preset(n).num_params}
               for n in names}
        print(json.dumps(out, indent=2))
        return c.EXIT_OK
    table = Table(title="Model presets", caption="published: the size the preset's source states")
    for col in ("model", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "MLP",
                "embeddings", "params", "published"):
        table.add_column(col, justify="left" if col in ("model", "MLP", "embeddings") else "right",
                         no_wrap=True)
    for n in names:
        m = ModelSpec.preset(n)
        table.add_row(
            n, str(m.num_layers), str(m.hidden_size), str(m.num_heads), str(m.num_kv_heads),
            str(m.ffn_hidden_size), str(m.vocab_size), "gated" if m.gated_mlp else "plain",
            "tied" if m.tied_embeddings else "untied", f"{m.num_params / 1e9:.3f} B",
            f"{ModelSpec.published_params(n) / 1e9:.3f} B",
        )
    c.console().print(table)
    return c.EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("gpus", help="list a GPU catalog")
    c.add_catalog_arg(p)
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    p.set_defaults(func=cmd_gpus)

    p = sub.add_parser("offers", help="list a catalog's offers (instance types, places, prices)",
                       description="List the catalog's offers, cheapest GPU-hour first.")
    c.add_catalog_arg(p)
    c.add_availability_args(p)
    p.add_argument("--provider", action="append", help="only this provider (repeatable)")
    p.add_argument("--region", action="append", help="only regions matching (shell pattern)")
    p.add_argument("--gpu", action="append", help="only this GPU model (repeatable)")
    p.add_argument("--limit", type=int, default=40, help="rows shown (default 40)")
    p.add_argument("--json", action="store_true", help="print the offers as JSON")
    p.set_defaults(func=cmd_offers)

    p = sub.add_parser("models", help="list the model presets")
    p.add_argument("--json", action="store_true", help="print the presets as JSON")
    p.set_defaults(func=cmd_models)
