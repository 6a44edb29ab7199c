"""One Roughtime query with roughly's client library, offering exactly the versions given.

roughly's CLI (`roughly query`) always offers its whole version list and exits 0 even when the
query fails, so roughtime_interop.rs drives the library through this script to test one version at
a time. Run it with the python of roughly's venv:

    python roughly_query.py HOST PORT PUBLIC_KEY_BASE64 VERSION[,VERSION...] [TIMEOUT_SECS]

Prints one JSON object on stdout and exits 0 when a reply arrived and verified:
    {"ok": true, "version": 1, "midpoint": 1790000000, "radius": 3}
otherwise exits 1 with {"ok": false, "error": "timeout" | "verification" | "protocol",
"detail": "..."}.
"""

import asyncio
import base64
import json
import sys

import roughly.client
import roughly.errors


async def query(host: str, port: int, key: bytes, versions: list[int], timeout: float):
    async with asyncio.timeout(timeout):
        return await roughly.client.send_request(host, port, key, versions=versions)


def main() -> int:
    host, port, key_b64, versions_arg = sys.argv[1:5]
    timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    versions = [int(v, 0) for v in versions_arg.split(",")]
    key = base64.b64decode(key_b64)
    try:
        response = asyncio.run(query(host, int(port), key, versions, timeout))
    except TimeoutError:
        out = {"ok": False, "error": "timeout", "detail": f"no reply within {timeout} s"}
    except roughly.errors.VerificationError as e:
        out = {"ok": False, "error": "verification", "detail": f"{e.reason}: {e}"}
    except roughly.errors.RoughtimeError as e:
        out = {"ok": False, "error": "protocol", "detail": f"{type(e).__name__}: {e}"}
    else:
        srep = response.signed_response
        out = {
            "ok": True,
            "version": response.version,
            "midpoint": srep.midpoint,
            "radius": srep.radius,
        }
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
