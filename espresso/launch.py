"""Compatibility alias of :mod:`espresso.runner.launch` (rank layout, hosts, torchrun
commands), where the launcher now lives with the rest of the runner."""

from __future__ import annotations

from .runner.launch import (
    MAX_PORT,
    Host,
    LaunchError,
    NodeAssignment,
    RankInfo,
    assign_hosts,
    check_runnable,
    hosts_from_dict,
    load_hosts,
    node_command,
    rank_layout,
    torchrun_commands,
)

__all__ = ["MAX_PORT", "Host", "LaunchError", "NodeAssignment", "RankInfo", "assign_hosts",
           "check_runnable", "hosts_from_dict", "load_hosts", "node_command", "rank_layout",
           "torchrun_commands"]
