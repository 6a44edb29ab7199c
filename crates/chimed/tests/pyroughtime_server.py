"""pyroughtime 1.0.1's draft 07 server on a free loopback port, for roughtime_interop.rs.

pyroughtime has no server command, so this script runs its library's RoughtimeServer with a fresh
long-term key and a 30-day delegation, as its own test_server() does, and prints one JSON line
once the socket is bound:

    {"port": 40123, "public_key": "<base64>"}

It serves until its stdin closes (or it is killed). It answers draft 07 (0x80000007) only: a
32-byte nonce, SHA-512/256 tree hashes, MJD timestamps, RADI in microseconds, one signature per
request, and no ROUGHTIM header on its replies. It takes MIDP from the local time zone's clock, so
run it with TZ=UTC.
"""

import json
import sys
import threading
import time

from pyroughtime.pyroughtime import RoughtimeServer


def main() -> int:
    priv, publ = RoughtimeServer.create_key()
    cert, dpriv = RoughtimeServer.create_delegate_key(priv)
    server = RoughtimeServer(cert, dpriv)
    # start() binds, then joins its receive thread: run it on a thread of its own.
    threading.Thread(target=server.start, args=("127.0.0.1", 0), daemon=True).start()
    deadline = time.monotonic() + 10
    while getattr(server, "sock", None) is None:
        if time.monotonic() > deadline:
            print(json.dumps({"error": "socket not bound after 10 s"}), flush=True)
            return 1
        time.sleep(0.01)
    print(json.dumps({"port": server.sock.getsockname()[1], "public_key": publ.decode()}), flush=True)
    sys.stdin.read()
    server.run = False
    return 0


if __name__ == "__main__":
    sys.exit(main())
