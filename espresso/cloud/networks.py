"""Network bandwidth between instances of a type (built-in: ``data/instance_networks.yaml``):
the published figure of a known instance family, else a stated default by provider class and
GPUs per instance (:func:`default_network`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml


@dataclass(frozen=True, slots=True)
class Network:
    gbps: float
    """Whole instance, one direction, Gbit/s."""
    source: str
    assumption: bool = False
    note: str = ""
    fabric: str = ""
    """The fabric the figure needs (``efa``, ``gpudirect-tcpx``, ...), switched on per task;
    empty when plain networking gives it."""

    def per_gpu_gbs(self, gpus: int) -> float:
        """GB/s per GPU, one direction."""
        return self.gbps / 8.0 / gpus

    @property
    def label(self) -> str:
        what = "assumption" if self.assumption else self.source
        return f"{self.gbps:g} Gbps ({what}{', ' + self.note if self.note else ''})"


@cache
def _table() -> dict[str, list[dict[str, object]]]:
    text = resources.files("espresso").joinpath("data/instance_networks.yaml").read_text()
    data: dict[str, list[dict[str, object]]] = yaml.safe_load(text)
    return data


@cache
def _families() -> list[tuple[re.Pattern[str], Network]]:
    out = []
    for row in _table()["families"]:
        out.append((re.compile(str(row["match"])),
                    Network(float(row["gbps"]), str(row["source"]),
                            bool(row.get("assumption", False)), str(row.get("note", "")),
                            str(row.get("fabric", "")))))
    return out


def network_for(instance_type: str) -> Network | None:
    """The network figure of an instance type, or None when the table has none."""
    for pattern, net in _families():
        if pattern.fullmatch(instance_type):
            return net
    return None


_UNKNOWN = "instance types without a published figure"
GIVEN = "given with --network-gbs"


def not_in_table(label: str) -> bool:
    """A row's ``network_source`` is a default (:func:`default_network`) or the user's
    ``--network-gbs``, not an entry of the table."""
    return _UNKNOWN in label or GIVEN in label


def default_network(provider: str, gpus_per_instance: int) -> Network:
    """The assumed network of an instance type the table does not know: by the provider's
    class (hyperscaler, marketplace, other GPU clouds) and the instance's GPUs. Always an
    assumption (``Network.assumption``); docs/catalog.md, "Unknown instance types"."""
    for row in _table()["defaults"]:
        providers = row.get("providers")
        if isinstance(providers, list) and provider not in providers:
            continue
        if gpus_per_instance < int(str(row.get("min_gpus", 1))):
            continue
        return Network(float(str(row["gbps"])), f"default for {row['class']} instances",
                       assumption=True,
                       note=f"{row['class']} default for {_UNKNOWN} (docs/catalog.md); "
                            "--network-gbs replaces it")
    msg = "instance_networks.yaml: the defaults have no catch-all entry"
    raise AssertionError(msg)

