#!/usr/bin/env python3
"""An MCP server's `tools/list`: one ListAllTools call with FORMAT_MCP, its `tools_json`
filtered to the active groups and answered as the JSON-RPC result, checked against the MCP
Tool shape (name, description, inputSchema of type object, optional annotations hints).

    TOOLROUTER_ADDR=127.0.0.1:50051 python3 examples/clients/mcp_tools_list.py
"""

import json

from toolrouter_client import check, client, pb

HINTS = {"title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}


def main():
    stub = client()
    r = stub.ListAllTools(pb.ListAllToolsRequest(format=pb.FORMAT_MCP))
    everything = json.loads(r.tools_json)
    # tools_json holds every tool, core domains first, in ListAllTools' order; gate by the
    # groups' activity the way the server wants.
    active = [g for g in r.groups if g.active]
    order = [g for g in r.groups if g.core] + [g for g in r.groups if not g.core]
    tools, i = [], 0
    for g in order:
        if g.active:
            tools += everything[i:i + g.tool_count]
        i += g.tool_count
    check(i == len(everything), "the groups' tool counts cover tools_json")
    response = {"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}}
    for t in response["result"]["tools"]:
        check(set(t) <= {"name", "description", "inputSchema", "annotations"}, f"{t['name']}: fields")
        check(isinstance(t["name"], str) and t["name"], "a name")
        check(t["inputSchema"].get("type") == "object", f"{t['name']}: inputSchema type object")
        ann = t.get("annotations", {})
        check(set(ann) <= HINTS and all(isinstance(v, bool) for v in ann.values()),
              f"{t['name']}: annotations are boolean hints")
        check(not (ann.get("readOnlyHint") and "destructiveHint" in ann),
              f"{t['name']}: a read-only tool carries no destructive hint")
    print(f"tools/list: {len(tools)} of {len(everything)} tools ({len(active)} active groups), "
          f"{len(json.dumps(response))} bytes")
    print("mcp_tools_list: ok")


if __name__ == "__main__":
    main()
