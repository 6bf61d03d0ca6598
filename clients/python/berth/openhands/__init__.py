"""Berth workspaces for the OpenHands SDK (extra ``berth-client[openhands]``, Python >= 3.12)."""

from ._workspace import BerthCommandResult, BerthWorkspace

__all__ = ["BerthCommandResult", "BerthWorkspace"]
