"""Shared by the example clients: Python stubs for toolrouter.v1, generated from the repo's
proto into a temp folder at import time (grpcio-tools), and a channel to the daemon at
TOOLROUTER_ADDR (`host:port` or `http://host:port`, as the CLI takes it; default
127.0.0.1:50051)."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto"
_stubs = Path(tempfile.mkdtemp(prefix="toolrouter-stubs-"))
subprocess.run(
    [sys.executable, "-m", "grpc_tools.protoc", "-I", str(PROTO_DIR),
     "--python_out", str(_stubs), "--grpc_python_out", str(_stubs),
     "toolrouter/v1/router.proto"],
    check=True,
)
sys.path.insert(0, str(_stubs))

from toolrouter.v1 import router_pb2 as pb  # noqa: E402
from toolrouter.v1 import router_pb2_grpc as pb_grpc  # noqa: E402


def client():
    # The CLI's TOOLROUTER_ADDR may be a URL (http://host:port); grpcio takes host:port.
    addr = os.environ.get("TOOLROUTER_ADDR", "127.0.0.1:50051")
    scheme, sep, rest = addr.partition("://")
    if sep:
        check(scheme.lower() == "http",
              f"TOOLROUTER_ADDR {addr!r}: these examples speak plain HTTP/2 (host:port or http://)")
        addr = rest.rstrip("/")
    channel = grpc.insecure_channel(addr, options=[("grpc.enable_http_proxy", 0)])
    return pb_grpc.ToolRouterStub(channel)


def check(ok, what):
    """Fails the example (exit 1) with `what` when `ok` is false."""
    if not ok:
        sys.exit(f"FAILED: {what}")
