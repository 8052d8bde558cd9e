#!/usr/bin/env python3
"""The load-balancer test: deploy/nginx/moshi.conf, as committed, in front of two real instances.

    python3 deploy/test-lb.py target/release/moshi-native [target/release/examples/soak_client]

Starts two `moshi-native serve --model demo --max-sessions 1` instances and an nginx (run as the
current user from a temporary prefix, on free ports) with the committed configuration, only its
addresses and listening port replaced. Then checks, through nginx:
  1. a real conversation (Ogg/Opus both ways, with the soak client) works through the proxy;
  2. two held conversations land on different instances (each instance's /metrics);
  3. a third is refused by nginx with HTTP 503 and Retry-After, and queued on no instance;
  4. after one instance is killed (SIGKILL), new clients reach the other one, and nginx really tried
     the dead one at least once on the way (its error log), so the failover path was exercised.
Exits non-zero on any failure. Needs nginx on the PATH (or NGINX=/path) and Python's standard library.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "deploy", "nginx", "moshi.conf")
SYNC = os.path.join(ROOT, "deploy", "nginx", "readyz-sync.sh")
# The addresses of the committed example instances and the port it listens on.
EXAMPLE_A, EXAMPLE_B, EXAMPLE_LISTEN = "127.0.0.1:8001", "127.0.0.1:8002", "listen 8080;"
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)
    print(f"ok: {what}", flush=True)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def http_get(port, path, timeout=5):
    """(status, body) of GET http://127.0.0.1:port/path; (None, error text) if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def metric(port, name):
    status, body = http_get(port, "/metrics")
    if status != 200:
        raise Failure(f"/metrics of the instance on port {port}: {status} {body}")
    for line in body.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            return float(parts[1])
    raise Failure(f"{name} missing from /metrics of port {port}")


def wait_for(what, cond, secs=20):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise Failure(f"timed out waiting for {what}")


class WsClient:
    """A minimal WebSocket client (RFC 6455) that opens /api/chat and holds the conversation."""

    def __init__(self, port, path="/api/chat", timeout=15):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise Failure("connection closed before an HTTP answer")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        if self.status == 101:
            want = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
            if self.headers.get("sec-websocket-accept") != want:
                raise Failure("wrong Sec-WebSocket-Accept")

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self):
        """(opcode, payload) of the next frame (server frames are not masked)."""
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(self._read(2), "big")
        elif n == 127:
            n = int.from_bytes(self._read(8), "big")
        return b0 & 0x0F, self._read(n)

    def wait_handshake(self):
        """Reads until the protocol's handshake message (binary, kind 0); False on error/close."""
        while True:
            op, payload = self.frame()
            if op == 2 and payload[:1] == b"\x00":
                return True
            if op == 8 or (op == 2 and payload[:1] == b"\x05"):
                return False

    def closed_by_peer(self, secs=10):
        """True once the connection ends (EOF, reset or a close frame) within secs."""
        self.sock.settimeout(secs)
        try:
            while True:
                op, _ = self.frame()
                if op == 8:
                    return True
        except (EOFError, ConnectionError):
            return True
        except socket.timeout:
            return False

    def close(self):
        """Ends the conversation and waits until nginx has closed the connection: nginx releases its
        count of the instance's connections (max_conns) before it closes the client's, so the next
        client sees the slot free in nginx too, not only in the instance's /metrics."""
        if self.status != 101:
            self.sock.close()
            return
        try:
            mask = os.urandom(4)
            payload = (1000).to_bytes(2, "big")
            masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            self.sock.sendall(bytes([0x88, 0x80 | len(payload)]) + mask + masked)
            self.sock.settimeout(10)
            while self.sock.recv(65536):
                pass
        except OSError:
            pass
        self.sock.close()


def render_conf(ports, lb_port):
    text = open(CONF).read()
    for old, new, count in [
        (EXAMPLE_A, f"127.0.0.1:{ports[0]}", 2),
        (EXAMPLE_B, f"127.0.0.1:{ports[1]}", 2),
        (EXAMPLE_LISTEN, f"listen 127.0.0.1:{lb_port};", 1),
    ]:
        # The test must run the committed file: if its example lines change, say so rather than
        # silently testing something else.
        if text.count(old) != count:
            raise Failure(f"{CONF}: expected {count} x '{old}', found {text.count(old)}")
        text = text.replace(old, new)
    return text


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    t0 = time.monotonic()
    binary = os.path.abspath(sys.argv[1])
    soak_client = os.path.abspath(sys.argv[2]) if len(sys.argv) == 3 else None
    nginx = os.environ.get("NGINX") or shutil.which("nginx") or "/usr/sbin/nginx"
    tmp = tempfile.mkdtemp(prefix="moshi-lb-")
    # Run as root, nginx's workers switch to an unprivileged user that must reach its temp folders here.
    os.chmod(tmp, 0o755)
    procs = {}
    try:
        a, b, lb = free_ports(3)
        ports = {"A": a, "B": b}
        for name, port in ports.items():
            log = open(os.path.join(tmp, f"serve-{name}.log"), "w")
            procs[name] = subprocess.Popen(
                [binary, "serve", "--model", "demo", "--host", "127.0.0.1", "--port", str(port),
                 "--max-sessions", "1"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        for name, port in ports.items():
            wait_for(f"instance {name} ready", lambda p=port: http_get(p, "/readyz")[0] == 200, 60)

        with open(os.path.join(tmp, "moshi.conf"), "w") as f:
            f.write(render_conf([a, b], lb))
        # A minimal main configuration around the committed file: everything under the temporary
        # prefix, so nginx runs without root and touches nothing of the system's own nginx.
        with open(os.path.join(tmp, "nginx.conf"), "w") as f:
            f.write(
                f"daemon off;\nworker_processes 2;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log info;\n"
                f"events {{ worker_connections 256; }}\n"
                f"http {{\n  access_log {tmp}/access.log;\n"
                + "".join(f"  {k}_temp_path {tmp}/{k};\n" for k in
                          ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"])
                + f"  include {tmp}/moshi.conf;\n}}\n"
            )
        cmd = [nginx, "-p", tmp, "-c", f"{tmp}/nginx.conf", "-e", f"{tmp}/error.log"]
        subprocess.run(cmd + ["-t", "-q"], check=True)
        procs["nginx"] = subprocess.Popen(cmd)
        wait_for("nginx listening", lambda: http_get(lb, "/")[0] == 200)
        check(http_get(lb, "/metrics")[0] == 404, "/metrics is not exposed through the balancer")

        # 1. Audio both ways through the proxy.
        if soak_client:
            out = subprocess.run(
                [soak_client, "--url", f"ws://127.0.0.1:{lb}/api/chat", "--clients", "1", "--secs", "2",
                 "--session-secs", "2"],
                capture_output=True, text=True, timeout=60,
            )
            total = json.loads(out.stdout.strip().splitlines()[-1])
            check(out.returncode == 0 and total["sessions"] >= 1 and total["audio_messages"] > 0
                  and total["error_messages"] == 0 and total["connect_errors"] == 0
                  and total["refused"] == 0,
                  f"conversations with audio both ways through nginx for 2 s: {total}")
            for port in ports.values():
                wait_for("the slot freed", lambda p=port: metric(p, "moshi_sessions_active") == 0)
            # The instance may count a session ended a moment before nginx has processed its closed
            # connection (nothing of nginx's count is observable from here).
            time.sleep(0.5)

        def active():
            return {n: metric(p, "moshi_sessions_active") for n, p in ports.items()}

        # 2. Two conversations, two instances.
        c1 = WsClient(lb)
        check(c1.status == 101 and c1.wait_handshake(), "client 1 admitted through nginx")
        wait_for("client 1 counted", lambda: sum(active().values()) == 1)
        first = next(n for n, v in active().items() if v == 1)
        c2 = WsClient(lb)
        check(c2.status == 101 and c2.wait_handshake(), "client 2 admitted through nginx")
        wait_for("client 2 counted", lambda: sum(active().values()) == 2)
        check(active() == {"A": 1, "B": 1}, f"clients 1 and 2 on different instances: {active()}")

        # 3. Both full: refused at the balancer, queued nowhere.
        c3 = WsClient(lb)
        check(c3.status == 503 and c3.headers.get("retry-after") == "5",
              f"client 3 refused by nginx with 503 and Retry-After (got {c3.status}, {c3.headers})")
        c3.close()
        waiting = {n: metric(p, "moshi_sessions_waiting") for n, p in ports.items()}
        check(waiting == {"A": 0, "B": 0}, f"client 3 queued on no instance: {waiting}")

        # 4. Kill client 1's instance; free the other; new clients reach the survivor.
        survivor = "B" if first == "A" else "A"
        c2.close()
        wait_for("client 2's slot freed", lambda: metric(ports[survivor], "moshi_sessions_active") == 0)
        procs[first].send_signal(signal.SIGKILL)
        procs[first].wait()
        killed_at = time.monotonic()
        check(c1.closed_by_peer(), f"client 1 disconnected when instance {first} died")
        for k in range(3):
            c = WsClient(lb)
            check(c.status == 101 and c.wait_handshake(),
                  f"new client {k + 1} after the kill admitted (status {c.status})")
            check(metric(ports[survivor], "moshi_sessions_active") == 1,
                  f"new client {k + 1} on the surviving instance {survivor}")
            c.close()
            wait_for("its slot freed", lambda: metric(ports[survivor], "moshi_sessions_active") == 0)
        log = open(os.path.join(tmp, "error.log"), errors="replace").read()
        dead = f"127.0.0.1:{ports[first]}"
        check(re.search(r"connect\(\) failed .*" + re.escape(dead), log) is not None,
              f"nginx tried the dead instance {dead} and went on to the other (its error log)")
        # With the survivor full, the dead instance does not count as room.
        hold = WsClient(lb)
        check(hold.status == 101 and hold.wait_handshake(), "survivor taken again")
        c5 = WsClient(lb)
        check(c5.status == 503, f"one instance dead and the other full: 503 (got {c5.status})")
        c5.close()
        hold.close()

        # 5. An instance that is loading (port bound, nothing answered: what `serve` looks like
        # before its model is loaded) on the dead one's port. readyz-sync.sh marks it down, so that
        # nginx sends it nothing once the dead instance's max_fails mark has expired.
        dead_port = ports[first]
        loading = socket.socket()
        loading.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        loading.bind(("127.0.0.1", dead_port))
        loading.listen(16)
        conf = os.path.join(tmp, "moshi.conf")

        def sync(expect):
            reloads = open(os.path.join(tmp, "error.log"), errors="replace").read().count("reconfiguring")
            env = dict(os.environ, NGINX_TEST=" ".join(cmd + ["-t", "-q"]),
                       NGINX_RELOAD=" ".join(cmd + ["-s", "reload"]))
            out = subprocess.run(["bash", SYNC, conf], env=env, capture_output=True, text=True, timeout=30)
            check(out.returncode == 0 and out.stdout.count(expect) == 2,
                  f"readyz-sync: {expect!r} in both upstreams ({out.stdout.strip()!r} {out.stderr.strip()!r})")
            wait_for("nginx reloaded", lambda: open(os.path.join(tmp, "error.log"), errors="replace")
                     .read().count("reconfiguring") > reloads)
            time.sleep(0.5)  # the old worker processes stop accepting

        sync(f"127.0.0.1:{dead_port} ")
        check(re.search(rf"server 127\.0\.0\.1:{dead_port} [^;]* down;", open(conf).read()) is not None,
              "the loading instance is down in the configuration")
        # Past fail_timeout (10 s, compared in whole seconds by nginx, so up to 11) since nginx last
        # failed to reach the port, so max_fails alone would let nginx try it again: only `down` keeps
        # the next clients away from it.
        time.sleep(max(0.0, 12.5 - (time.monotonic() - killed_at)))
        for k in range(3):
            try:
                c = WsClient(lb, timeout=5)
                admitted = c.status == 101 and c.wait_handshake()
            except socket.timeout:
                raise Failure(f"client {k + 1} while an instance loads: no answer in 5 s (sent to the loading one)")
            check(admitted,
                  f"client {k + 1} while an instance loads: admitted by {survivor}, not held by the loading one")
            c.close()
            wait_for("its slot freed", lambda: metric(ports[survivor], "moshi_sessions_active") == 0)
        # Loaded again: a real instance on that port; readyz-sync takes `down` away.
        loading.close()
        log = open(os.path.join(tmp, f"serve-{first}-again.log"), "w")
        procs[first] = subprocess.Popen(
            [binary, "serve", "--model", "demo", "--host", "127.0.0.1", "--port", str(dead_port),
             "--max-sessions", "1"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        wait_for(f"instance {first} ready again", lambda: http_get(dead_port, "/readyz")[0] == 200, 60)
        sync(f"127.0.0.1:{dead_port} ")
        check(" down;" not in open(conf).read(), "no instance down in the configuration any more")
        c1, c2 = WsClient(lb), WsClient(lb)
        check(c1.status == 101 and c1.wait_handshake() and c2.status == 101 and c2.wait_handshake(),
              "two clients admitted after the instance came back")
        wait_for("both counted", lambda: sum(active().values()) == 2)
        check(active() == {"A": 1, "B": 1}, f"and on different instances again: {active()}")
        c1.close()
        c2.close()
        print(f"load-balancer test passed in {time.monotonic() - t0:.1f} s")
        return 0
    except (Failure, OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        print(f"load-balancer test FAILED after {time.monotonic() - t0:.1f} s: {e}", file=sys.stderr)
        for name in ["error.log", "serve-A.log", "serve-B.log", "serve-A-again.log", "serve-B-again.log"]:
            path = os.path.join(tmp, name)
            if os.path.exists(path):
                print(f"--- {name} (last lines)", file=sys.stderr)
                print("".join(open(path, errors="replace").readlines()[-15:]), file=sys.stderr)
        return 1
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
