#!/usr/bin/env python3
"""Cross-language interop test: a Python grpcio client against the Rust toolrouter daemon.

What it does:
  1. generates Python stubs from proto/toolrouter/v1/router.proto into a temp dir
     (nothing generated is kept in the repo);
  2. starts `toolrouter serve` on a free loopback port with a temp SQLite database and the
     built-in demo registry, and waits (max 30 s) for grpc.health.v1 to report SERVING;
  3. sets settings through the `toolrouter settings set` CLI (which writes the table and asks
     the daemon to invalidate its cache);
  4. checks Route, LoadToolGroup (success, idempotent, NOT_FOUND, INVALID_ARGUMENT),
     ListGroups and InvalidateSettings against SPEC.md sections 5-7;
  5. stops the daemon with SIGTERM (SIGKILL after 10 s) and checks it exits 0.

It prints one line per check and closes with `N passed, M failed`; the exit code is 0 only
when nothing failed.

Environment:
  TOOLROUTER_BIN   the daemon binary (default: <repo>/target/release/toolrouter)
  INTEROP_KEEP     if set to 1, keep the temp dir (stubs, database, daemon log) and print it
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "proto"
PROTO_FILE = "toolrouter/v1/router.proto"
BIN = os.environ.get("TOOLROUTER_BIN") or str(REPO / "target" / "release" / "toolrouter")

READY_DEADLINE_S = 30.0
RPC_TIMEOUT_S = 10.0
CLI_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0

ROUTE_MESSAGE = "are my torrents seeding?"
PROMPT_HEADER = (
    "## Available Tool Groups\n\n"
    "Use `load_tool_group` to load tools from a group before using them.\n\n"
)

# The daemon reads TOOLROUTER_<FLAG> from the environment (SPEC §7); strip them so that a
# developer's shell cannot change fallback policy, keyword mode, etc. under the test.
DAEMON_ENV = {k: v for k, v in os.environ.items() if not k.startswith("TOOLROUTER_")}

# gRPC Python honours http_proxy/https_proxy; never send loopback traffic through a proxy.
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, fn, *args):
        """Run one check; print PASS/FAIL; return fn's value (None on failure)."""
        try:
            value = fn(*args)
        except AssertionError as e:
            self.failed += 1
            print(f"FAIL  {name}: {e}", flush=True)
            return None
        except Exception as e:  # an RPC error or a crash in the check itself
            self.failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {describe_error(e)}", flush=True)
            return None
        self.passed += 1
        print(f"PASS  {name}", flush=True)
        return value if value is not None else True

    def fail(self, name, msg):
        self.failed += 1
        print(f"FAIL  {name}: {msg}", flush=True)


def describe_error(e):
    try:
        import grpc  # noqa: F401  (only to detect RpcError)

        if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
            return f"gRPC {e.code().name}: {e.details()!r}"
    except ImportError:
        pass
    return str(e) or repr(e)


# ---------------------------------------------------------------- setup helpers


def generate_stubs(out_dir):
    """Generate router_pb2 / router_pb2_grpc into out_dir with grpc_tools' protoc."""
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc",
        "-I", str(PROTO_DIR),
        "--python_out", str(out_dir),
        "--grpc_python_out", str(out_dir),
        PROTO_FILE,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"protoc exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
    )
    for name in ("router_pb2.py", "router_pb2_grpc.py"):
        assert (out_dir / "toolrouter" / "v1" / name).is_file(), f"protoc did not write {name}"


def free_port():
    """Ask the kernel for a free loopback port (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path, lines=30):
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no daemon log)"
    tail = text.splitlines()[-lines:]
    return "\n".join("    | " + line for line in tail) if tail else "    | (daemon log is empty)"


def wait_serving(daemon, channel, health_pb2, health_pb2_grpc):
    """Poll grpc.health.v1.Health/Check("") until SERVING, for at most READY_DEADLINE_S."""
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + READY_DEADLINE_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        code = daemon.poll()
        assert code is None, f"daemon exited with code {code} before it was ready"
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                return
            last = f"status {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}"
        except Exception as e:  # UNAVAILABLE while the port is not open yet, etc.
            last = describe_error(e)
        time.sleep(0.1)
    raise AssertionError(f"not SERVING within {READY_DEADLINE_S:.0f} s (last: {last})")


def settings_set(key, value, db_url, addr):
    cmd = [BIN, "settings", "set", key, value, "--database", db_url, "--addr", addr]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=DAEMON_ENV
    )
    assert proc.returncode == 0, (
        f"`{' '.join(cmd[1:])}` exited {proc.returncode}; "
        f"stderr: {proc.stderr.strip()!r}; stdout: {proc.stdout.strip()!r}"
    )


def stop_daemon(daemon):
    """SIGTERM, then SIGKILL after STOP_GRACE_S; return (exit code, killed?)."""
    if daemon.poll() is not None:
        return daemon.returncode, False
    daemon.send_signal(signal.SIGTERM)
    try:
        return daemon.wait(timeout=STOP_GRACE_S), False
    except subprocess.TimeoutExpired:
        daemon.kill()
        return daemon.wait(), True


def expect_rpc_error(call, code, what):
    """Run call(); assert it fails with status `code`; return the error's details string."""
    import grpc

    try:
        resp = call()
    except grpc.RpcError as e:
        assert e.code() == code, (
            f"{what}: expected {code.name}, got {e.code().name} ({e.details()!r})"
        )
        return e.details() or ""
    raise AssertionError(f"{what}: expected {code.name}, but the call succeeded: {resp}")


# ---------------------------------------------------------------- the checks


def run_checks(res, pb, stub, db_url, addr):
    import grpc

    reasons = pb.Reason

    # --- settings through the CLI, then Route -------------------------------------------
    if not res.check(
        "cli: settings set qbittorrent_url exits 0",
        settings_set, "qbittorrent_url", "http://127.0.0.1:8080", db_url, addr,
    ):
        print("      (Route checks below expect qbittorrent to be active)", flush=True)

    route = res.check(
        f"route: {ROUTE_MESSAGE!r} answers",
        lambda: stub.Route(pb.RouteRequest(message=ROUTE_MESSAGE), timeout=RPC_TIMEOUT_S),
    )

    def route_domains():
        got = [
            (d.domain, reasons.Name(d.reason), list(d.matched_keywords)) for d in route.domains
        ]
        want = [
            ("system", "REASON_CORE", []),
            ("qbittorrent", "REASON_KEYWORD", ["torrent", "seeding"]),
        ]
        assert got == want, f"domains: want {want}, got {got}"

    def route_not_fallback():
        assert route.fallback is False, "fallback: want false (a keyword hit), got true"

    def route_first_tool():
        assert len(route.tools) > 0, "no tools in the answer"
        first = route.tools[0]
        assert first.name == "load_tool_group", (
            f"first tool: want 'load_tool_group', got {first.name!r}"
        )
        assert first.domain == "", f"load_tool_group.domain: want '', got {first.domain!r}"
        schema = json.loads(first.input_schema_json)
        enum = schema["properties"]["group_name"]["enum"]
        assert "qbittorrent" in enum, f"group_name enum lacks active 'qbittorrent': {enum}"
        assert "sonarr" not in enum, f"group_name enum lists inactive 'sonarr': {enum}"
        assert "system" not in enum, f"group_name enum lists core 'system': {enum}"

    def route_tools_domains():
        second = route.tools[1]
        assert (second.name, second.domain) == ("search_tools", ""), (
            f"second tool: want the search_tools meta-tool, got {second.name!r}"
        )
        others = {t.domain for t in route.tools[2:]}
        assert others == {"system", "qbittorrent"}, (
            f"tools after the meta-tools: want domains {{system, qbittorrent}}, got {others}"
        )
        for t in route.tools:
            assert t.tier in ("read", "modify", "destructive"), f"{t.name}: tier {t.tier!r}"

    def route_version():
        assert route.registry_version != 0, "registry_version is 0"

    if route is not None:
        res.check("route: domains = [system CORE, qbittorrent KEYWORD torrent+seeding]",
                  route_domains)
        res.check("route: fallback is false", route_not_fallback)
        res.check("route: first tool is load_tool_group (enum has active groups only)",
                  route_first_tool)
        res.check("route: search_tools second, other tools from system and qbittorrent",
                  route_tools_domains)
        res.check("route: registry_version is nonzero", route_version)
    else:
        res.fail("route: response checks", "not run: Route failed")

    # --- LoadToolGroup -------------------------------------------------------------------
    res.check(
        "cli: settings set sonarr_url exits 0",
        settings_set, "sonarr_url", "http://127.0.0.1:8989", db_url, addr,
    )

    def load(conv, group):
        return stub.LoadToolGroup(
            pb.LoadToolGroupRequest(conversation_id=conv, group_name=group),
            timeout=RPC_TIMEOUT_S,
        )

    def load_first():
        r = load("py-1", "sonarr")
        assert r.already_loaded is False, "already_loaded: want false on the first load"
        assert r.text.startswith("Loaded "), f"text should start with 'Loaded ': {r.text!r}"
        assert "from group 'Sonarr':" in r.text, (
            f"text should contain \"from group 'Sonarr':\": {r.text!r}"
        )
        assert r.group.name == "sonarr", f"group.name: want 'sonarr', got {r.group.name!r}"
        assert len(r.tools) > 0, "no tools returned"
        assert r.group.tool_count == len(r.tools), (
            f"group.tool_count {r.group.tool_count} != {len(r.tools)} tools returned"
        )
        assert all(t.domain == "sonarr" for t in r.tools), (
            f"tool domains: {[t.domain for t in r.tools]}"
        )
        n = len(r.tools)
        want = f"Loaded {n} tool{'' if n == 1 else 's'} from group '{r.group.display_name}':"
        want += "".join(f"\n- {t.name}: {t.description}" for t in r.tools)
        assert r.text == want, f"text (SPEC §5 format):\n want {want!r}\n got  {r.text!r}"
        return r

    first = res.check("load: py-1/sonarr succeeds, already_loaded false, text format",
                      load_first)

    def load_again():
        r = load("py-1", "sonarr")
        assert r.already_loaded is True, "already_loaded: want true on the second load"
        if first is not None and first is not True:
            assert [t.name for t in r.tools] == [t.name for t in first.tools], (
                "the second load returned different tools"
            )

    res.check("load: second py-1/sonarr gives already_loaded true", load_again)

    def load_unknown():
        details = expect_rpc_error(
            lambda: load("py-1", "nope"), grpc.StatusCode.NOT_FOUND, "LoadToolGroup('nope')"
        )
        prefix = "Tool group 'nope' not found. Available groups: "
        assert details.startswith(prefix), f"details: want prefix {prefix!r}, got {details!r}"
        available = details[len(prefix):].split(", ")
        for g in ("qbittorrent", "sonarr"):
            assert g in available, f"available groups lack active {g!r}: {available}"
        assert "system" not in available, f"available groups list core 'system': {available}"
        assert available == sorted(available), f"available groups not by name: {available}"

    res.check("load: unknown group 'nope' is NOT_FOUND with the available groups",
              load_unknown)

    def load_no_conversation():
        details = expect_rpc_error(
            lambda: load("", "sonarr"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "LoadToolGroup(conversation_id='')",
        )
        want = "Required parameter 'conversation_id' is missing."
        assert details == want, f"details: want {want!r}, got {details!r}"

    res.check("load: empty conversation_id is INVALID_ARGUMENT", load_no_conversation)

    # --- ListGroups ----------------------------------------------------------------------
    groups = res.check(
        "list_groups: answers",
        lambda: stub.ListGroups(pb.ListGroupsRequest(), timeout=RPC_TIMEOUT_S),
    )

    def lg_names():
        names = [g.name for g in groups.groups]
        assert names == sorted(names), f"groups not sorted by name: {names}"
        assert len(names) == len(set(names)), f"duplicate group names: {names}"
        for n in ("system", "qbittorrent", "sonarr"):
            assert n in names, f"group {n!r} missing from {names}"

    def lg_fields():
        by = {g.name: g for g in groups.groups}
        s = by["system"]
        assert s.display_name == "System", f"system.display_name: {s.display_name!r}"
        assert s.core and s.active, f"system: core={s.core} active={s.active}, want both true"
        q = by["qbittorrent"]
        assert q.display_name == "qBittorrent", f"qbittorrent.display_name: {q.display_name!r}"
        assert not q.core, "qbittorrent.core should be false"
        assert q.active, "qbittorrent should be active after qbittorrent_url was set"
        assert "qbittorrent_url" in q.settings_keys, f"settings_keys: {list(q.settings_keys)}"
        for kw in ("torrent", "seeding"):
            assert kw in q.keywords, f"qbittorrent.keywords lack {kw!r}: {list(q.keywords)}"
        assert q.tool_count > 0, "qbittorrent.tool_count is 0"
        so = by["sonarr"]
        assert so.active, "sonarr should be active after sonarr_url was set"
        assert "sonarr_url" in so.settings_keys, f"settings_keys: {list(so.settings_keys)}"

    def lg_prompt():
        ps = groups.prompt_section
        assert ps.startswith(PROMPT_HEADER), (
            f"prompt_section: want prefix {PROMPT_HEADER!r}, got {ps[:120]!r}"
        )
        lines = [
            f"- {g.name}: {g.description}"
            for g in sorted(groups.groups, key=lambda g: g.name)
            if g.active and not g.core and g.tool_count > 0
        ]
        want = PROMPT_HEADER + "\n".join(lines)
        assert ps == want, f"prompt_section (SPEC §6):\n want {want!r}\n got  {ps!r}"

    def lg_version():
        v = groups.registry_version
        assert v != 0, "registry_version is 0"
        if route is not None:
            assert v == route.registry_version, (
                f"ListGroups.registry_version {v} != Route.registry_version "
                f"{route.registry_version}"
            )

    if groups is not None:
        res.check("list_groups: every domain, sorted by name", lg_names)
        res.check("list_groups: system / qbittorrent / sonarr fields", lg_fields)
        res.check("list_groups: prompt_section header and one line per loadable group",
                  lg_prompt)
        res.check("list_groups: registry_version nonzero and equal to Route's", lg_version)
    else:
        res.fail("list_groups: response checks", "not run: ListGroups failed")

    # --- InvalidateSettings --------------------------------------------------------------
    def invalidate():
        r = stub.InvalidateSettings(pb.InvalidateSettingsRequest(), timeout=RPC_TIMEOUT_S)
        active = list(r.active_domains)
        assert active == sorted(active), f"active_domains not by name: {active}"
        for n in ("system", "qbittorrent", "sonarr"):
            assert n in active, f"active_domains lack {n!r}: {active}"

    res.check("invalidate_settings: active_domains sorted, include the configured ones",
              invalidate)

    # --- ReloadRegistry ------------------------------------------------------------------
    def reload():
        r = stub.ReloadRegistry(pb.ReloadRegistryRequest(), timeout=RPC_TIMEOUT_S)
        assert r.domains > 0 and r.tools > 0, f"empty reload answer: {r}"
        before = stub.ListGroups(pb.ListGroupsRequest(), timeout=RPC_TIMEOUT_S)
        assert r.registry_version == before.registry_version, (
            "reloading the same manifests keeps the version: "
            f"{r.registry_version} != {before.registry_version}")
        assert r.domains == len(before.groups), f"{r.domains} domains, {len(before.groups)} groups"

    res.check("reload_registry: same manifests, same version and domain count", reload)

    # --- UpsertDomain (v2): a refusal listing many problems --------------------------------
    def upsert_many_problems():
        # 300 tools with a bad tier: every problem would not fit in the status header a C-core
        # client accepts (8 KiB of metadata), so the daemon lists what fits and counts the rest.
        tools = [{"name": f"bad_{i}", "description": f"tool number {i}", "tier": "nope #?"}
                 for i in range(300)]
        manifest = json.dumps({"name": "py_refused", "tools": tools})
        # Past the soft limit grpcio refuses at random (about half the calls at 11 KiB), so
        # one call proves little: ten must all come through.
        for _ in range(10):
            details = expect_rpc_error(
                lambda: stub.UpsertDomain(pb.UpsertDomainRequest(manifest_json=manifest),
                                          timeout=RPC_TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, "UpsertDomain(300 bad tiers)")
        lines = details.split("\n")
        assert lines[0] == "The domain is refused; nothing changed.", f"head: {lines[0]!r}"
        assert "tier" in lines[1], f"first problem: {lines[1]!r}"
        assert lines[-1].startswith("... and ") and "more problems" in lines[-1], (
            f"last line: {lines[-1]!r}")

    res.check("upsert_domain: a refusal with 300 problems reaches a C-core client as INVALID_ARGUMENT",
              upsert_many_problems)

    # --- SearchTools (v2) ----------------------------------------------------------------
    def search():
        r = stub.SearchTools(
            pb.SearchToolsRequest(query="pause the seeding torrents", conversation_id="py-s",
                                  load=True),
            timeout=RPC_TIMEOUT_S,
        )
        assert len(r.hits) > 0, "no hits"
        top = r.hits[0]
        assert top.tool.domain == "qbittorrent" and top.active, f"top hit: {top}"
        assert top.score > 0 and len(top.matched_terms) > 0, f"unexplained top hit: {top}"
        assert list(r.loaded_groups)[:1] == ["qbittorrent"], f"loaded: {list(r.loaded_groups)}"
        assert "qbittorrent" in r.text, f"text: {r.text!r}"
        again = stub.Route(pb.RouteRequest(message="thanks", conversation_id="py-s"),
                           timeout=RPC_TIMEOUT_S)
        loaded = [d.domain for d in again.domains if d.reason == reasons.Value("REASON_LOADED")]
        assert "qbittorrent" in loaded, f"route after the search load: {list(again.domains)}"

    res.check("search_tools: ranks qbittorrent first, loads it into the conversation", search)


# ---------------------------------------------------------------- main


class Session:
    """What the finally block must clean up."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.daemon = None
        self.log_file = None
        self.log_path = None
        self.channel = None


def start_daemon(sess, attempt):
    port = free_port()
    addr = f"127.0.0.1:{port}"
    db_url = "sqlite://" + str((sess.tmp / "toolrouter.db").resolve())
    sess.log_path = sess.tmp / f"daemon-{attempt}.log"
    sess.log_file = open(sess.log_path, "wb")
    sess.daemon = subprocess.Popen(
        [BIN, "serve", "--listen", addr, "--database", db_url],
        stdin=subprocess.DEVNULL,
        stdout=sess.log_file,
        stderr=subprocess.STDOUT,
        cwd=sess.tmp,
        env=DAEMON_ENV,
    )
    print(f"      daemon pid {sess.daemon.pid} on {addr}, database {db_url}", flush=True)
    return addr, db_url


def session(res, sess):
    stubs = sess.tmp / "stubs"
    stubs.mkdir()
    if not res.check("stubs: grpc_tools.protoc generates router_pb2{,_grpc}",
                     generate_stubs, stubs):
        return
    sys.path.insert(0, str(stubs))

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from toolrouter.v1 import router_pb2 as pb
    from toolrouter.v1 import router_pb2_grpc as pb_grpc

    if not (os.path.isfile(BIN) and os.access(BIN, os.X_OK)):
        res.fail("daemon: binary", f"{BIN} is missing or not executable "
                 "(build it with `cargo build --release` or set TOOLROUTER_BIN)")
        return

    # The port is free when we pick it but could be taken before the daemon binds it: if the
    # daemon dies before it is ready, try again on another port (3 attempts in all).
    ready_error = None
    for attempt in range(1, 4):
        addr, db_url = start_daemon(sess, attempt)
        sess.channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
        try:
            wait_serving(sess.daemon, sess.channel, health_pb2, health_pb2_grpc)
            ready_error = None
            break
        except AssertionError as e:
            ready_error = str(e)
            sess.channel.close()
            sess.channel = None
            if sess.daemon.poll() is None:  # alive but not ready in time: no retry
                break
            print(f"      attempt {attempt}: {ready_error}", flush=True)
            if attempt < 3:  # the last attempt's log is printed at the end
                print(log_tail(sess.log_path, 10), flush=True)
            sess.daemon.wait()
            sess.daemon = None
            sess.log_file.close()
            sess.log_file = None
    if ready_error is not None:
        res.fail("daemon: grpc.health.v1 reports SERVING for '' within 30 s", ready_error)
        return
    res.passed += 1
    print("PASS  daemon: grpc.health.v1 reports SERVING for '' within 30 s", flush=True)

    def health_named():
        r = health_pb2_grpc.HealthStub(sess.channel).Check(
            health_pb2.HealthCheckRequest(service="toolrouter.v1.ToolRouter"),
            timeout=RPC_TIMEOUT_S,
        )
        assert r.status == health_pb2.HealthCheckResponse.SERVING, (
            f"status {health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)}"
        )

    res.check("daemon: health SERVING for 'toolrouter.v1.ToolRouter'", health_named)

    stub = pb_grpc.ToolRouterStub(sess.channel)
    run_checks(res, pb, stub, db_url, f"http://{addr}")


def main():
    # A SIGTERM to this script (e.g. a CI timeout) still runs the cleanup below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    res = Results()
    sess = Session(Path(tempfile.mkdtemp(prefix="toolrouter-interop-")))
    try:
        session(res, sess)
    except Exception:
        res.fail("interop harness", "unexpected error:\n" + traceback.format_exc().rstrip())
    finally:
        if sess.channel is not None:
            sess.channel.close()
        if sess.daemon is not None:
            code, killed = stop_daemon(sess.daemon)
            if killed:
                res.fail("daemon: exits 0 on SIGTERM",
                         f"still running {STOP_GRACE_S:.0f} s after SIGTERM; killed it")
            elif code != 0:
                res.fail("daemon: exits 0 on SIGTERM", f"exit code {code}")
            else:
                res.passed += 1
                print("PASS  daemon: exits 0 on SIGTERM", flush=True)
        if sess.log_file is not None:
            sess.log_file.close()
        if res.failed and sess.log_path is not None:
            print("      daemon log (tail):", flush=True)
            print(log_tail(sess.log_path), flush=True)
        if os.environ.get("INTEROP_KEEP") == "1":
            print(f"      kept {sess.tmp}", flush=True)
        else:
            shutil.rmtree(sess.tmp, ignore_errors=True)
    print(f"{res.passed} passed, {res.failed} failed", flush=True)
    return 0 if res.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
