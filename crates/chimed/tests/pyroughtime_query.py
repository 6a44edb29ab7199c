"""One Roughtime query with pyroughtime 1.0.1's client, in one of its two modes.

pyroughtime has no command line of its own, so roughtime_interop.rs drives its library through
this script. Run it with the python of pyroughtime's venv:

    python pyroughtime_query.py HOST PORT PUBLIC_KEY_BASE64 google|draft07 [TIMEOUT_SECS]

* google (`newver=False`): Google's original protocol, no header, a 64-byte nonce, full SHA-512
  hashes and the "--" delegation context. pyroughtime still puts a VER tag (0x80000007) in the
  headerless request, a quirk a Google-protocol server has to tolerate.
* draft07 (`newver=True`, its default): a ROUGHTIM header, VER 0x80000007, a 32-byte nonce,
  SHA-512/256 hashes and MJD timestamps.

Prints one JSON object on stdout and exits 0 when a reply arrived and verified:
    {"ok": true, "midpoint_us": 1795299081287234, "radius_us": 16, "pathlen": 0}
otherwise exits 1 with {"ok": false, "error": "timeout" | "verification", "detail": "..."}.
"""

import datetime
import json
import sys

from pyroughtime.pyroughtime import RoughtimeClient, RoughtimeError


def main() -> int:
    host, port, key_b64, mode = sys.argv[1:5]
    timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    if mode not in ("google", "draft07"):
        print(json.dumps({"ok": False, "error": "usage", "detail": f"unknown mode {mode}"}))
        return 2
    client = RoughtimeClient()
    try:
        r = client.query(host, int(port), key_b64, timeout=timeout, newver=mode == "draft07")
    except RoughtimeError as e:
        kind = "timeout" if "Timeout" in str(e) else "verification"
        out = {"ok": False, "error": kind, "detail": str(e)}
    else:
        # MIDP is Unix microseconds in Google mode and an MJD timestamp in draft 07; pyroughtime
        # turns either into a naive UTC datetime.
        since_epoch = r["datetime"] - datetime.datetime(1970, 1, 1)
        midpoint_us = since_epoch // datetime.timedelta(microseconds=1)
        out = {"ok": True, "midpoint_us": midpoint_us, "radius_us": r["radi"], "pathlen": r["pathlen"]}
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
