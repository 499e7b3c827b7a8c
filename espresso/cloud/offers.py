"""Offer: a rentable instance type in one place at one price, and its resolution (joined
with the GPU spec table) into a catalog row."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .. import _validate as v
from ..errors import CatalogError
from ..gpu_type import GpuType
from .networks import GIVEN, default_network, network_for
from .specs import SpecTable

_REQUIRED = ("provider", "region", "instance_type", "gpu", "gpus_per_instance",
             "price_per_hour", "instances")


def offer_key(provider: str, region: str, instance_type: str) -> str:
    """The catalog key of an offer: ``provider/region/instance_type``."""
    return f"{provider}/{region}/{instance_type}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One instance type of one provider in one region (catalog ``offers:`` entries)."""

    provider: str
    region: str
    instance_type: str
    gpu: str
    """GPU model: a name of the spec table."""
    gpus_per_instance: int
    price_per_hour: float
    """USD per instance-hour, on demand."""
    instances: int
    """Instances available: your quota, or what the market has."""
    spot_price_per_hour: float | None = None
    """USD per instance-hour on the spot market (kept for spot planning)."""
    zones: tuple[str, ...] = ()
    intra_gbs: float | None = None
    """Per-GPU link inside the instance, GB/s one direction; default: the GPU spec's."""
    network_gbs: float | None = None
    """Per-GPU network between instances, GB/s one direction; default: the instance
    family's figure (espresso/data/instance_networks.yaml)."""
    network_source: str | None = None
    market: str = "on-demand"
    """``spot``: ``price_per_hour`` is the spot price and instances may be reclaimed (the
    row's key ends in ``:spot``)."""
    interruptions_per_hour: float | None = None
    """Interruptions per instance-hour (spot; default: the provider's)."""
    recovery_hours: float | None = None
    """Hours to replace a reclaimed instance (spot; default: the provider's)."""
    availability: str | None = None
    """What set ``instances`` (a quota's entry, ``--max-instances``; GpuType.availability)."""
    vcpus: int | None = None
    """vCPUs of one instance (for quota limits in vCPUs; SkyPilot's vCPUs column)."""
    pool: str | None = None
    """A limit shared with other offers, with ``pool_units`` per instance and ``pool_limit``
    in all (GpuType.pool; docs/catalog.md, "Shared limits")."""
    pool_units: float | None = None
    pool_limit: float | None = None

    @property
    def key(self) -> str:
        key = offer_key(self.provider, self.region, self.instance_type)
        return key + ":spot" if self.market == "spot" else key

    @classmethod
    def from_dict(cls, data: Any) -> Offer:
        data = dict(v.mapping("offer", data, err=CatalogError))
        where = f"offer {data.get('provider', '?')}/{data.get('region', '?')}/" \
                f"{data.get('instance_type', '?')}"
        v.known_keys(where, data, [f.name for f in fields(cls)], _REQUIRED, err=CatalogError)
        for f in ("provider", "region", "instance_type", "gpu"):
            data[f] = v.string(f"{where}: {f}", data[f], err=CatalogError)
        data["gpus_per_instance"] = v.integer(f"{where}: gpus_per_instance",
                                              data["gpus_per_instance"], minimum=1,
                                              maximum=1024, err=CatalogError)
        data["instances"] = v.integer(f"{where}: instances", data["instances"], minimum=0,
                                      maximum=1 << 30, err=CatalogError)
        data["price_per_hour"] = v.number(f"{where}: price_per_hour", data["price_per_hour"],
                                          minimum=0, maximum=1e7, err=CatalogError)
        for f in ("spot_price_per_hour", "interruptions_per_hour", "recovery_hours"):
            if data.get(f) is not None:
                data[f] = v.number(f"{where}: {f}", data[f], minimum=0, maximum=1e7,
                                   err=CatalogError)
        for f in ("intra_gbs", "network_gbs"):
            if data.get(f) is not None:
                data[f] = v.number(f"{where}: {f}", data[f], positive=True, minimum=1e-6,
                                   maximum=1e9, err=CatalogError)
        zones = data.get("zones", ())
        if isinstance(zones, str) or not isinstance(zones, (list, tuple)):
            msg = f"{where}: zones: expected a list of zone names, got {zones!r}"
            raise CatalogError(msg)
        data["zones"] = tuple(v.string(f"{where}: zones[]", z, err=CatalogError) for z in zones)
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["zones"] = list(self.zones)
        if out["market"] == "on-demand":
            out["market"] = None
        return {k: val for k, val in out.items() if val is not None and val != []}

    def resolve(self, specs: SpecTable, *, network_gbs: float | None = None,
                availability: str | None = None) -> GpuType:
        """The catalog row: this offer joined with its GPU's spec. Its network between
        instances: the offer's own ``network_gbs``, else the instance family's published
        figure, else ``network_gbs`` (GB/s per GPU, the user's assumption), else the default
        for its provider class and GPU count (:func:`espresso.cloud.networks.default_network`);
        the last two are marked as assumptions in the row's ``network_source``.
        ``availability``: the row's when the offer states none (the catalog's assumption)."""
        where = f"offer {self.key}"
        try:
            spec = specs[self.gpu]
        except CatalogError as exc:
            msg = f"{where}: {exc}"
            raise CatalogError(msg) from None
        net_src = self.network_source
        network = self.network_gbs
        if network is None:
            net = network_for(self.instance_type)
            if net is None and network_gbs is not None:
                network = network_gbs
                net_src = (f"{network_gbs * 8 * self.gpus_per_instance:g} Gbps (assumption, "
                           f"{network_gbs:g} GB/s per GPU {GIVEN})")
            else:
                net = net or default_network(self.provider, self.gpus_per_instance)
                network = net.per_gpu_gbs(self.gpus_per_instance)
                net_src = net.label
        n = self.gpus_per_instance
        return GpuType(
            name=self.key, gpu=spec.name, vendor=spec.vendor, memory_gb=spec.memory_gb,
            bf16_tflops=spec.bf16_tflops, mem_bandwidth_gbs=spec.mem_bandwidth_gbs,
            price_per_hour=self.price_per_hour / n,
            spot_price_per_hour=(None if self.spot_price_per_hour is None
                                 else self.spot_price_per_hour / n),
            count=self.instances * n, gpus_per_node=n,
            intra_node_gbs=self.intra_gbs or spec.intra_node_gbs, inter_node_gbs=network,
            efficiency=spec.efficiency, memory_bytes=spec.memory_bytes,
            fp8_tflops=spec.fp8_tflops or 0.0, bf16=spec.bf16,
            provider=self.provider, region=self.region,
            zones=self.zones, instance_type=self.instance_type, network_source=net_src,
            market=self.market, interruptions_per_hour=self.interruptions_per_hour,
            recovery_hours=self.recovery_hours, availability=self.availability or availability,
            vcpus=self.vcpus,
            pool=self.pool, pool_units=self.pool_units, pool_limit=self.pool_limit)


def offer_of(row: GpuType) -> Offer:
    """The offer a catalog row was resolved from (for saving a catalog)."""
    assert row.provider is not None and row.region is not None and row.instance_type
    n = row.gpus_per_node
    return Offer(provider=row.provider, region=row.region, instance_type=row.instance_type,
                 gpu=row.model, gpus_per_instance=n,
                 price_per_hour=round(row.price_per_hour * n, 10),
                 instances=row.instances,
                 spot_price_per_hour=(None if row.spot_price_per_hour is None
                                      else round(row.spot_price_per_hour * n, 10)),
                 zones=row.zones, intra_gbs=row.intra_node_gbs, network_gbs=row.inter_node_gbs,
                 network_source=row.network_source, market=row.market,
                 interruptions_per_hour=row.interruptions_per_hour,
                 recovery_hours=row.recovery_hours, availability=row.availability,
                 vcpus=row.vcpus,
                 pool=row.pool, pool_units=row.pool_units, pool_limit=row.pool_limit)
