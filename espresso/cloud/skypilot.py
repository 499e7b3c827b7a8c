"""Read SkyPilot's ``vms.csv`` catalogs into offers.

Columns are read by header name (their order differs between clouds): InstanceType,
AcceleratorName, AcceleratorCount, Price, Region are needed; SpotPrice, AvailabilityZone and
GpuInfo are used when present. Rows are grouped into one offer per (provider, region,
instance type): the lowest on-demand price over its zones, the zones where it holds, the
lowest spot price. What cannot become an offer is counted in :attr:`SkyPilotRead.skipped`
with the reason, never guessed: unknown accelerators, fractional GPUs, rows without a price,
GCP accelerators without a fixed host machine or without the host's price.

GCP lists GPUs as accelerator rows priced without their VM; the VM (a2/a3/g2 machine types
that fix the GPU count; one L4 takes the smallest, g2-standard-4; T4, V100 and P100 an N1
high-memory machine whose memory holds the GPUs', named ``n1-highmem-4+T4``) is priced from
the file's own host rows when it has them (a full ``vms.csv``), else from
``espresso/data/gcp_hosts.csv`` (a dated copy of those rows).
"""

from __future__ import annotations

import ast
import csv
import fnmatch
import io
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from .. import _io
from .. import _validate as v
from ..errors import CatalogError
from .networks import network_for
from .offers import Offer
from .specs import GpuSpec, SpecTable

PROVIDERS = ("aws", "gcp", "lambda", "azure", "oci", "runpod", "seeweb", "cudo", "fluidstack",
             "paperspace", "vast", "nebius", "do", "hyperbolic", "primeintellect", "shadeform")
_NEEDED = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "Region")
DEFAULT_GPUS_PER_OFFER = 32
"""Availability assumed when no quota is given: as many whole instances as hold 32 GPUs
(at least one)."""
MARKETPLACES = ("vast",)
"""Providers whose rows are single hosts listed by their owners: an offer has as many
instances as the file lists hosts of it in its region, not the assumed 32 GPUs."""


@dataclass
class SkyPilotRead:
    offers: list[Offer] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """Reason -> examples (``file:line accelerator instance``) of rows not turned into offers."""
    rows: int = 0
    unknown_providers: list[str] = field(default_factory=list)
    """Providers read that the package does not know (their defaults are stated)."""

    def skip(self, reason: str, example: str) -> None:
        self.skipped.setdefault(reason, []).append(example)

    def summary(self) -> list[str]:
        unknown = [f"provider {p!r} is not one the package knows"
                   f"{v.suggest(p, PROVIDERS)}: read like the other GPU clouds (network "
                   "default of its class, 32 GPUs per offer assumed; docs/catalog.md)"
                   for p in sorted(set(self.unknown_providers))]
        return unknown + [f"{len(ex)} row{'s' if len(ex) != 1 else ''} skipped: {reason} "
                          f"(e.g. {ex[0]})" for reason, ex in sorted(self.skipped.items())]


@dataclass
class _Group:
    """The rows of one (provider, region, instance type): its lowest on-demand price, the
    zones where that price holds, its lowest spot price."""

    gpu: str
    n: int
    price: float
    spot: float | None = None
    zones: set[str] = field(default_factory=set)
    vcpus: int | None = None
    """vCPUs of one instance (the file's vCPUs column; GCP's accelerator rows have none)."""
    memory_gib: float | None = None
    """Host memory of one instance (the file's MemoryGiB column), when given."""
    hosts: int = 0
    """Rows of it at the lowest price (a marketplace's hosts at that price)."""

    def add(self, price: float, spot: float | None, zone: str) -> None:
        if price < self.price:
            self.price, self.zones, self.hosts = price, set(), 0
        if price == self.price:
            self.hosts += 1
        if price == self.price and zone:
            self.zones.add(zone)
        if spot is not None and (self.spot is None or spot < self.spot):
            self.spot = spot


SIZE_SKIPPED = "another host size (vCPUs, memory) of GPUs already offered"
KEEP_SIZES = ("aws", "gcp", "azure", "oci")
"""Hyperscalers, whose host sizes stay offers of their own: their quotas count vCPUs per
instance family (docs/catalog.md, "Shared limits"), so a smaller size fits where a larger
does not, and their sizes have network figures of their own."""


def _other_host_sizes(groups: dict[tuple[str, str, str], _Group], specs: SpecTable,
                      out: SkyPilotRead) -> list[tuple[str, str, str]]:
    """Instance types of one provider and region that hold the same GPUs behind the same
    network and differ only in their host (vCPUs, memory) and price, such as Cudo's thirteen
    sizes of one A40 machine or Nebius's eight of one L40S: one offer is kept, the
    cheapest whose host memory is at least its GPUs' memory (training loads checkpoints and
    pins batches there), else the one with the most memory, else the cheapest. The cost
    model uses GPUs, links and price, so a dearer size would never be chosen over the kept
    one, and counting each size as its own 32 GPUs would multiply an assumed capacity (and
    the search's work) by the number of sizes. A marketplace's types are hosts, not sizes;
    a hyperscaler's sizes are kept (:data:`KEEP_SIZES`)."""
    by: dict[tuple[object, ...], list[tuple[str, str, str]]] = {}
    for key, grp in groups.items():
        provider, region, it = key
        if provider in MARKETPLACES or provider in KEEP_SIZES:
            continue
        net = network_for(it)
        by.setdefault((provider, region, grp.gpu, grp.n, net), []).append(key)
    drop: list[tuple[str, str, str]] = []
    for (_p, _r, gpu, n, _net), keys in by.items():
        if len(keys) < 2:
            continue
        need = specs[gpu].memory_gb * n
        enough = [k for k in keys if (groups[k].memory_gib or 0) >= need]
        if enough:
            keep = min(enough, key=lambda k: (groups[k].price, k))
        elif any(groups[k].memory_gib for k in keys):
            keep = max(keys, key=lambda k: (groups[k].memory_gib or 0, -groups[k].price, k))
        else:
            keep = min(keys, key=lambda k: (groups[k].price, k))
        for k in sorted(keys):
            if k != keep:
                drop.append(k)
                out.skip(SIZE_SKIPPED, f"{k[0]} {k[1]} {k[2]} (kept {keep[2]})")
    return drop


_PROVIDER_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
_NOT_A_PROVIDER = {"vms", "gpu", "gpus", "csv", "catalog", "catalogs", "v8", "v7", "v6", "data",
                   "skypilot", "tmp", "home", "examples"}


def provider_of(path: str | Path) -> str:
    """The provider a file belongs to, from its name: a known provider named anywhere in the
    path (``aws_gpu_vms.csv``, ``gcp/vms.csv``), else the name SkyPilot's layout gives it
    (``catalogs/v8/hyperstack/vms.csv``, ``hyperstack_vms.csv``)."""
    parts: list[str] = [p.lower() for p in re.split(r"[\\/_.\-\s]+", str(path)) if p]
    for p in reversed(parts):
        if p in PROVIDERS:
            return p
    file = Path(path)
    stem = file.stem.lower()
    # SkyPilot keeps catalogs/v8/<cloud>/vms.csv; a file named <cloud>_vms.csv names it too.
    in_layout = stem == "vms" and re.fullmatch(r"v\d+", file.parent.parent.name) is not None
    guess = (file.parent.name.lower() if in_layout else
             stem.split("_", 1)[0] if stem.endswith("vms") and "_" in stem else "")
    if _PROVIDER_NAME.fullmatch(guess) and guess not in _NOT_A_PROVIDER:
        return guess
    msg = (f"{path}: cannot tell the cloud provider from the file name; name the file after "
           f"it (e.g. aws_vms.csv, or PROVIDER/vms.csv as SkyPilot keeps it) or write "
           f"PROVIDER=FILE (known providers: {', '.join(PROVIDERS)}; others are read too)")
    raise CatalogError(msg)


def _check_provider(provider: str, where: str) -> None:
    """A provider name: a known one, or any plain name (a GPU cloud the package has not seen
    is read like the others, with the defaults of its class stated)."""
    if not _PROVIDER_NAME.fullmatch(provider):
        msg = (f"{where}: provider {provider!r} is not a provider name (lowercase letters, "
               f"digits and '-', starting with a letter){v.suggest(provider, PROVIDERS)}")
        raise CatalogError(msg)


def _float(text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        val = float(text)
    except ValueError:
        return None
    return val if math.isfinite(val) else None


def _price(text: str | None) -> float | None:
    """A price in USD per hour, to 8 decimals: files written by float arithmetic carry its
    noise (Cudo's 0.36979999999999996 is 0.3698), which would not survive a round trip."""
    val = _float(text)
    return None if val is None else round(val, 8)


def _memory_mib(info: str | None) -> float | None:
    if not info:
        return None
    m = re.search(r"'SizeInMiB':\s*([0-9.]+)", info)
    if m:
        return float(m.group(1))
    try:  # a well-formed Python literal
        data = ast.literal_eval(info)
        return float(data["Gpus"][0]["MemoryInfo"]["SizeInMiB"])
    except (ValueError, SyntaxError, KeyError, IndexError, TypeError):
        return None


def _model(specs: SpecTable, acc: str, instance_type: str,
           mem_mib: float | None) -> GpuSpec | None:
    name = acc.strip()
    if name.upper() == "H100" and "nvl" in instance_type.lower():
        return None  # the H100 NVL (94 GB, PCIe): no spec in the table, not the SXM's
    if (name.upper() == "A100" and mem_mib is not None and mem_mib >= 70_000
            and "A100-80GB" in specs):
        return specs["A100-80GB"]
    if name.upper() == "H100" and "pcie" in instance_type.lower() and "H100-PCIe" in specs:
        return specs["H100-PCIe"]
    if name in specs:
        return specs[name]
    found = specs.by_alias(name)
    return found[0] if len(found) == 1 else None


# GCP machine types that fix their GPU model and count (the VM is priced separately).
_GCP_MACHINES = {
    "A100": {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g", 8: "a2-highgpu-8g",
             16: "a2-megagpu-16g"},
    "A100-80GB": {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g",
                  8: "a2-ultragpu-8g"},
    "H100": {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"},
    "H100-MEGA": {8: "a3-megagpu-8g"},
    "H200": {8: "a3-ultragpu-8g"},
    "B200": {8: "a4-highgpu-8g"},
    # L4 sits on G2 machines: 2, 4 and 8 GPUs fix the machine; 1 GPU takes the smallest.
    "L4": {1: "g2-standard-4", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
}

# GPUs attached to an N1 machine of the user's choice: the host taken is the cheapest N1
# high-memory machine whose memory holds its GPUs' (the host-size rule of
# _other_host_sizes; GPU memory 8-16 GB each). The offer's instance type names the host and
# SkyPilot's accelerator name ("n1-highmem-4+T4"): one host serves several GPU models.
_GCP_N1_HOSTS = {
    "T4": {1: "n1-highmem-4", 2: "n1-highmem-8", 4: "n1-highmem-16"},
    "V100": {1: "n1-highmem-4", 2: "n1-highmem-8", 4: "n1-highmem-16", 8: "n1-highmem-32"},
    "P100": {1: "n1-highmem-4", 2: "n1-highmem-8", 4: "n1-highmem-16"},
}


def _gcp_host(acc: str, n: int) -> tuple[str, str]:
    """(host machine, offer's instance type) of ``n`` GCP accelerators ``acc``: the machine
    type that fixes them, or an N1 host with them attached (:func:`gcp_attached` reads the
    name back); ("", "") when neither holds them."""
    fixed = _GCP_MACHINES.get(acc, {}).get(n, "")
    if fixed:
        return fixed, fixed
    n1 = _GCP_N1_HOSTS.get(acc, {}).get(n, "")
    return (n1, f"{n1}+{acc}") if n1 else ("", "")


def gcp_attached(instance_type: str) -> tuple[str, str] | None:
    """(host machine, SkyPilot accelerator name) of an offer whose GPUs are attached to an
    N1 host (``n1-highmem-4+T4``), else None."""
    host, sep, acc = instance_type.partition("+")
    return (host, acc) if sep and host.startswith("n1-") and acc else None


@cache
def _builtin_gcp_hosts() -> dict[tuple[str, str], tuple[float, float | None]]:
    text = resources.files("espresso").joinpath("data/gcp_hosts.csv").read_text()
    return _hosts(csv.DictReader(line for line in io.StringIO(text) if not line.startswith("#")))


def _hosts(rows: Iterable[dict[str, str]]) -> dict[tuple[str, str], tuple[float, float | None]]:
    out: dict[tuple[str, str], tuple[float, float | None]] = {}
    for r in rows:
        it = (r.get("InstanceType") or "").strip()
        price = _float(r.get("Price"))
        if not it or (r.get("AcceleratorName") or "").strip() or not price:
            continue
        zone = (r.get("AvailabilityZone") or r.get("Region") or "").strip()
        out[(it, zone)] = (price, _float(r.get("SpotPrice")))
    return out


def read_skypilot(paths: Sequence[str | Path], *, specs: SpecTable | None = None,
                  providers: Sequence[str] | None = None, regions: Sequence[str] | None = None,
                  gpus: Sequence[str] | None = None, bf16_only: bool = False,
                  gpus_per_offer: int = DEFAULT_GPUS_PER_OFFER) -> SkyPilotRead:
    """Offers from SkyPilot ``vms.csv`` files. ``paths`` items may be ``PROVIDER=FILE``.
    ``regions`` are shell patterns (``us-*``); ``gpus`` GPU model names of the spec table;
    ``bf16_only`` keeps GPUs with bf16 tensor cores. Each offer gets the instances that hold
    ``gpus_per_offer`` GPUs (at least one): an assumption a quota replaces."""
    specs = SpecTable.builtin() if specs is None else specs
    out = SkyPilotRead()
    groups: dict[tuple[str, str, str], _Group] = {}
    want_gpus = {g for g in gpus} if gpus else None
    if want_gpus:
        for g in want_gpus:
            specs[g]  # an unknown name is an error, with suggestions
    for item in paths:
        text_path = str(item)
        provider, _, file = text_path.partition("=") if "=" in text_path else ("", "", text_path)
        provider = provider.strip().lower() or provider_of(file)
        _check_provider(provider, text_path)
        if provider not in PROVIDERS:
            out.unknown_providers.append(provider)
        if providers and provider not in providers:
            continue
        text = _io.read_text("catalog", file, err=CatalogError)
        reader = csv.DictReader(io.StringIO(text))
        missing = [c for c in _NEEDED if c not in (reader.fieldnames or [])]
        if missing:
            msg = (f"{file}: not a SkyPilot vms.csv: missing column(s) {', '.join(missing)} "
                   f"(has: {', '.join(reader.fieldnames or [])})")
            raise CatalogError(msg)
        rows = list(reader)
        hosts = _hosts(rows) if provider == "gcp" else {}
        if provider == "gcp" and not hosts:
            hosts = _builtin_gcp_hosts()
        for line, r in enumerate(rows, start=2):
            acc = (r.get("AcceleratorName") or "").strip()
            if not acc:
                continue  # a CPU machine (or a GCP host row, used above)
            out.rows += 1
            it = (r.get("InstanceType") or "").strip()
            region = (r.get("Region") or "").strip()
            zone = (r.get("AvailabilityZone") or "").strip()
            where = f"{Path(file).name}:{line} {acc} {it or '(accelerator)'} {region}"
            if regions and not any(fnmatch.fnmatchcase(region, pat) for pat in regions):
                continue
            count = _float(r.get("AcceleratorCount"))
            if count is None or count < 1 or count != int(count):
                out.skip("fractional or missing GPU count", where)
                continue
            n = int(count)
            spec = _model(specs, acc, it, _memory_mib(r.get("GpuInfo")))
            if spec is None:
                out.skip("accelerator without a GPU spec", where)
                continue
            if want_gpus is not None and spec.name not in want_gpus:
                continue
            if bf16_only and not spec.bf16:
                out.skip("no bf16 tensor cores (not kept for training)", where)
                continue
            price = _price(r.get("Price"))
            spot = _price(r.get("SpotPrice"))
            if spot is not None and spot <= 0:
                spot = None  # (marketplaces write 0.00 where they have no spot price)
            if not price or price <= 0:
                out.skip("no on-demand price", where)
                continue
            if provider == "gcp" and not it:
                machine, it = _gcp_host(acc, n)
                if not it:
                    out.skip("GCP accelerator without a fixed host machine type", where)
                    continue
                host = hosts.get((machine, zone or region))
                if host is None:
                    out.skip("GCP host machine price unknown", where)
                    continue
                # Sums of catalog prices, kept to the catalogs' own precision.
                price = round(price + host[0], 8)
                spot = (round(spot + host[1], 8) if spot is not None and host[1] is not None
                        else None)
            key = (provider, region, it)
            cpus = _float(r.get("vCPUs"))
            mem = _float(r.get("MemoryGiB"))
            grp = groups.setdefault(key, _Group(spec.name, n, price, vcpus=(
                int(cpus) if cpus is not None and cpus >= 1 and cpus == int(cpus)
                and provider != "gcp" else None), memory_gib=(
                mem if mem is not None and mem > 0 and provider != "gcp" else None)))
            if grp.gpu != spec.name or grp.n != n:
                out.skip("instance type listed with two GPU models or counts", where)
                continue
            grp.add(price, spot, zone)
    for key in _other_host_sizes(groups, specs, out):
        del groups[key]
    for (provider, region, it), grp in sorted(groups.items()):
        market = provider in MARKETPLACES
        out.offers.append(Offer(
            provider=provider, region=region, instance_type=it, gpu=grp.gpu,
            gpus_per_instance=grp.n, price_per_hour=grp.price, spot_price_per_hour=grp.spot,
            instances=grp.hosts if market else max(1, gpus_per_offer // grp.n),
            zones=tuple(sorted(grp.zones)), vcpus=grp.vcpus,
            availability=(f"marketplace: {grp.hosts} host{'s' if grp.hosts > 1 else ''} "
                          f"listed at this price" if market else None)))
    return out
