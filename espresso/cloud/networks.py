"""Network bandwidth between instances of a type (built-in: ``data/instance_networks.yaml``)."""

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
def _families() -> list[tuple[re.Pattern[str], Network]]:
    text = resources.files("espresso").joinpath("data/instance_networks.yaml").read_text()
    out = []
    for row in yaml.safe_load(text)["families"]:
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
