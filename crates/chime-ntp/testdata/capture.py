#!/usr/bin/env python3
"""Capture NTP request/response pairs from a real chronyd for chime-ntp's known-answer tests.

Starts two private chronyd instances on free loopback ports (one serving as `local stratum 3`,
one with no time source, so unsynchronised), sends each request below, and writes
`<case>.request.bin` and, if chronyd answered, `<case>.response.bin` into chronyd-<version>/.
Ends the chronyd instances it started (by their PIDs) and nothing else. See README.md.

Usage: python3 capture.py [OUTDIR]   (needs root for chronyd -u root and for binding port 123)
"""

import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

CHRONYD = "/usr/sbin/chronyd"
HERE = os.path.dirname(os.path.abspath(__file__))


def free_udp_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_chronyd(tmp, name, port, local):
    conf = os.path.join(tmp, name + ".conf")
    with open(conf, "w") as f:
        f.write(f"port {port}\n")
        f.write("bindaddress 127.0.0.1\n")
        f.write("allow 127.0.0.1\n")
        if local:
            f.write("local stratum 3\n")
        f.write("cmdport 0\n")
        f.write(f"driftfile {tmp}/{name}.drift\n")
        f.write(f"pidfile {tmp}/{name}.pid\n")
    log = open(os.path.join(tmp, name + ".log"), "w")
    proc = subprocess.Popen([CHRONYD, "-x", "-d", "-u", "root", "-f", conf],
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, conf


def header(lvm, stratum=0, poll=6, precision=-20, root_delay=0, root_disp=0, refid=0,
           ref=0, org=0, rec=0, xmt=None):
    if xmt is None:
        xmt = int.from_bytes(os.urandom(8), "big")
    return struct.pack(">BBbbIII QQQQ", lvm, stratum, poll, precision, root_delay, root_disp,
                       refid, ref, org, rec, xmt)


def lvm(leap, version, mode):
    return (leap << 6) | (version << 3) | mode


def ef(ftype, length, fill=0xA5):
    return struct.pack(">HH", ftype, length) + bytes([fill]) * (length - 4)


def exchange(port, payload, src_port=0, timeout=0.5):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", src_port))
    s.settimeout(timeout)
    s.sendto(payload, ("127.0.0.1", port))
    try:
        data, _ = s.recvfrom(4096)
    except socket.timeout:
        data = None
    s.close()
    return data


def main():
    version = subprocess.run([CHRONYD, "--version"], capture_output=True, text=True).stdout
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "chronyd-4.3")
    os.makedirs(out, exist_ok=True)

    # A client request with non-zero fields that a server must not echo (except poll and the
    # transmit timestamp), and an origin timestamp with the low bit clear so that chronyd does not
    # try the interleaved mode.
    busy = dict(stratum=2, poll=6, precision=-23, root_delay=0x00000123, root_disp=0x00000456,
                refid=0xC0000201, ref=0xE1234567_00000000, org=0x01020304_05060708,
                rec=0x11121314_15161718)
    unknown_ef = ef(0x7A7A, 28)
    cases = [
        # (name, payload, source port or 0)
        ("v4-client", header(lvm(0, 4, 3), **busy), 0),
        ("v4-client-unsync-leap", header(lvm(3, 4, 3), poll=10), 0),
        ("v3-client", header(lvm(0, 3, 3), poll=4), 0),
        ("v2-client", header(lvm(0, 2, 3), poll=4), 0),
        ("v1-mode0", header(lvm(0, 1, 0), poll=4), 0),
        ("v4-symmetric-active", header(lvm(0, 4, 1), poll=6), 0),
        ("v3-symmetric-active", header(lvm(0, 3, 1), poll=6), 0),
        ("v4-unknown-ef", header(lvm(0, 4, 3)) + unknown_ef, 0),
        ("v4-two-efs", header(lvm(0, 4, 3)) + ef(0x7A7B, 16) + ef(0x7A7C, 32), 0),
        ("mac-v4-ef-and-sha1",
         header(lvm(0, 4, 3)) + unknown_ef + struct.pack(">I", 1) + bytes(20), 0),
        # Dropped by chronyd (and by chime-ntp).
        ("drop-v1-mode0-port123", header(lvm(0, 1, 0), poll=4), 123),
        ("drop-v0-client", header(lvm(0, 0, 3)), 0),
        ("drop-v5-client", header(lvm(0, 5, 3)), 0),
        ("drop-v2-mode0", header(lvm(0, 2, 0)), 0),
        ("drop-v4-passive", header(lvm(0, 4, 2)), 0),
        ("drop-v4-server", header(lvm(0, 4, 4)), 0),
        ("drop-v4-broadcast", header(lvm(0, 4, 5)), 0),
        ("drop-v2-control", header(lvm(0, 2, 6)), 0),
        ("drop-v2-private", header(lvm(0, 2, 7)), 0),
        ("drop-short-47", header(lvm(0, 4, 3))[:47], 0),
        ("drop-length-50", header(lvm(0, 4, 3)) + b"\x00\x00", 0),
        ("drop-ef-length-12", header(lvm(0, 4, 3)) + ef(0x7A7A, 12) + ef(0x7A7A, 28), 0),
        ("drop-ef-overrun", header(lvm(0, 4, 3)) + struct.pack(">HH", 0x7A7A, 64) + bytes(24), 0),
        ("drop-ef-last-16", header(lvm(0, 4, 3)) + ef(0x7A7A, 16), 0),
        # chronyd drops these because it has no key 1; chime-ntp answers them unauthenticated,
        # as rsntp does (see README.md).
        ("mac-v4-md5", header(lvm(0, 4, 3)) + struct.pack(">I", 1) + bytes(16), 0),
        ("mac-v3-sha1", header(lvm(0, 3, 3)) + struct.pack(">I", 1) + bytes(20), 0),
    ]
    # What chime-ntp's Mirror::request(now, nonce) sends, with nonce 0x0123456789abcdef.
    mirror_request = header(lvm(0, 4, 3), poll=0, precision=0, xmt=0x0123456789ABCDEF)

    with tempfile.TemporaryDirectory(prefix="chime-ntp-capture.") as tmp:
        sync_port, unsync_port = free_udp_port(), free_udp_port()
        sync, _ = start_chronyd(tmp, "sync", sync_port, local=True)
        unsync, _ = start_chronyd(tmp, "unsync", unsync_port, local=False)
        try:
            time.sleep(2)
            for name, payload, src in cases + [("mirror-request", mirror_request, 0)]:
                write_pair(out, name, payload, exchange(sync_port, payload, src))
            for name, payload in [("unsync-v4-client", header(lvm(0, 4, 3), poll=6)),
                                  ("unsync-mirror-request", mirror_request)]:
                write_pair(out, name, payload, exchange(unsync_port, payload))
        finally:
            for proc in (sync, unsync):
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            for name in ("sync", "unsync"):
                with open(os.path.join(tmp, name + ".conf")) as f:
                    print(f"--- {name}.conf\n{f.read()}", end="")
    print(version.strip())


def write_pair(out, name, request, response):
    with open(os.path.join(out, name + ".request.bin"), "wb") as f:
        f.write(request)
    path = os.path.join(out, name + ".response.bin")
    if response is not None:
        with open(path, "wb") as f:
            f.write(response)
    elif os.path.exists(path):
        os.remove(path)
    print(f"{name}: request {len(request)} bytes, "
          f"{'response ' + str(len(response)) + ' bytes' if response else 'no response'}")


if __name__ == "__main__":
    main()
