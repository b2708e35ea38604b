#!/usr/bin/env python3
"""A chat backend's turn with OpenAI-style and Anthropic-style tool lists: one Route call
with a `format`, `tools_json` put into the provider request as it is, and a
`load_tool_group` calls whose tools are added without duplicates. It builds the request
bodies (no provider account needed) and checks them against the providers' documented
tool shapes.

    TOOLROUTER_ADDR=127.0.0.1:50051 python3 examples/clients/chat_backend.py
"""

import json
import re

from toolrouter_client import check, client, pb

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # both providers' rule for tool names


def check_schema(schema, where):
    check(isinstance(schema, dict) and schema.get("type") == "object",
          f"{where}: the input schema is a JSON Schema object of type object")


def openai_body(tools, message, prompt):
    return {"model": "gpt-4o", "tools": tools,
            "messages": [{"role": "system", "content": prompt},
                         {"role": "user", "content": message}]}


def check_openai(body):
    names = [t["function"]["name"] for t in body["tools"]]
    check(len(body["tools"]) <= 128, "OpenAI takes at most 128 tools")
    check(len(set(names)) == len(names), "no tool twice")
    for t in body["tools"]:
        check(set(t) == {"type", "function"} and t["type"] == "function", f"{t}: chat tool shape")
        f = t["function"]
        check(set(f) <= {"name", "description", "parameters", "strict"}, f"{f['name']}: fields")
        check(NAME.match(f["name"]) is not None, f"{f['name']}: name")
        check_schema(f["parameters"], f["name"])


def anthropic_body(tools, message, prompt):
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": prompt, "tools": tools,
            "messages": [{"role": "user", "content": message}]}


def check_anthropic(body):
    names = [t["name"] for t in body["tools"]]
    check(len(set(names)) == len(names), "no tool twice")
    for t in body["tools"]:
        check(set(t) == {"name", "description", "input_schema"}, f"{t['name']}: Anthropic tool shape")
        check(NAME.match(t["name"]) is not None, f"{t['name']}: name")
        check_schema(t["input_schema"], t["name"])


def main():
    stub = client()
    message = "are my torrents seeding?"
    for fmt, name_of, body_of, check_body in [
        (pb.FORMAT_OPENAI_CHAT, lambda t: t["function"]["name"], openai_body, check_openai),
        (pb.FORMAT_ANTHROPIC, lambda t: t["name"], anthropic_body, check_anthropic),
    ]:
        chat = f"example-{fmt}"
        r = stub.Route(pb.RouteRequest(message=message, conversation_id=chat, format=fmt,
                                       include_prompt_section=True))
        tools = json.loads(r.tools_json)
        check(r.tokens > 0 and len(tools) > 0, "an answer with tools and their tokens")
        sent = {name_of(t) for t in tools}
        # The model calls load_tool_group for a group the answer does not have, then for the
        # same group again and for one the answer has: each time only the tools not sent
        # already are added, and the set of names sent grows with them.
        in_answer = {d.domain for d in r.domains}
        other = next((g.name for g in stub.ListGroups(pb.ListGroupsRequest()).groups
                      if g.active and not g.core and g.tool_count and g.name not in in_answer), None)
        check(other is not None,
              "another active group to load: configure at least two groups "
              "(e.g. `toolrouter settings set sonarr_url http://sonarr:8989`)")
        added = []
        for group in [other, other, r.domains[-1].domain]:
            loaded = stub.LoadToolGroup(pb.LoadToolGroupRequest(
                conversation_id=chat, group_name=group, format=fmt))
            new = [t for t in json.loads(loaded.tools_json) if name_of(t) not in sent]
            tools += new
            sent |= {name_of(t) for t in new}
            added.append(len(new))
        check(added[0] > 0 and added[1:] == [0, 0],
              f"a new group's tools are added once, a group sent already adds none: {added}")
        body = body_of(tools, message, r.prompt_section)
        check_body(body)
        print(f"{pb.Format.Name(fmt)}: {len(tools)} tools, {r.tokens} tokens, "
              f"{len(json.dumps(body))} bytes of request body")
    print("chat_backend: ok")


if __name__ == "__main__":
    main()
