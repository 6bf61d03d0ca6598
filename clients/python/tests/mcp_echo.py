"""A minimal MCP stdio server (stdlib only) for the tests: tools `echo` and `add`.

It runs inside the workspace's sandbox with the system python3, so it cannot depend on
any package: it speaks newline-delimited JSON-RPC 2.0 as the MCP stdio transport does.
"""
import json
import sys

TOOLS = [
    {
        "name": "echo",
        "description": "Returns its text argument.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
    {
        "name": "add",
        "description": "Adds two integers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
]


def answer(request):
    method = request.get("method")
    params = request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "py-echo", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        arguments = params.get("arguments") or {}
        if params.get("name") == "echo":
            text = str(arguments.get("text", ""))
        elif params.get("name") == "add":
            text = str(int(arguments["a"]) + int(arguments["b"]))
        else:
            return {"content": [{"type": "text", "text": "no such tool"}], "isError": True}
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    raise KeyError(method)


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    request = json.loads(line)
    if "id" not in request:
        continue  # a notification (e.g. notifications/initialized)
    try:
        reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}
    except Exception as error:  # noqa: BLE001
        reply = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": str(error)}}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
