"""Berth workspaces for AgentScope 2.0 (extra ``berth-client[agentscope]``).

.. code-block:: python

    from agentscope.app import create_app
    from berth.agentscope import BerthWorkspaceManager, IsolationPolicy

    app = create_app(
        storage=storage,
        message_bus=bus,
        workspace_manager=BerthWorkspaceManager("http://replica-1:7070,http://replica-2:7070",
                                                token=SERVICE_TOKEN,
                                                isolation=IsolationPolicy.PER_AGENT),
    )
"""

from agentscope.app.workspace_manager import IsolationPolicy

from ._backend import BerthBackend
from ._manager import BerthWorkspaceManager
from ._mcp import BerthMCPClient, BerthMCPTool
from ._workspace import BerthWorkspace

__all__ = ["BerthBackend", "BerthMCPClient", "BerthMCPTool", "BerthWorkspace", "BerthWorkspaceManager", "IsolationPolicy"]
