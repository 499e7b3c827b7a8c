"""``espresso gpus`` and ``espresso models``: what the built-in data holds."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from ..model import ModelSpec
from . import _common as c


def cmd_gpus(args: argparse.Namespace) -> int:
    catalog = c.load_catalog(args.catalog)
    if args.json:
        print(json.dumps(catalog.to_dict(), indent=2))
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

    p = sub.add_parser("models", help="list the model presets")
    p.add_argument("--json", action="store_true", help="print the presets as JSON")
    p.set_defaults(func=cmd_models)
