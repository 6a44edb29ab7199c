"""Malfeasance reports through roughly 0.3.0's library, for roughtime_interop.rs.

roughly's CLI writes and checks reports only for servers listed in an "ecosystem" file and keeps
the verdict to itself, so the tests drive its library through this script. Run it with the python
of roughly's venv:

    python roughly_report.py check FILE
        Checks a report (chime's RFC 10049 form {"responses": [...]} or roughly's bare list) with
        roughly.ecosystem.confirm_malfeasance. Prints {"valid": true, "malfeasance": false|true},
        or {"valid": false, "error": "..."} for a report it rejects. Exit 0 either way.

    python roughly_report.py make FILE KEY_BASE64@HOST:PORT [...]
        Queries the servers in turn with roughly's chained nonces, offering version 1, and writes
        roughly's own report of them to FILE. Prints {"written": n}.
"""

import asyncio
import base64
import json
import sys

import roughly.ecosystem as eco


def check(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    entries = data["responses"] if isinstance(data, dict) else data
    try:
        return {"valid": True, "malfeasance": eco.confirm_malfeasance(entries)}
    except eco.BadReport as e:
        return {"valid": False, "error": str(e)}


def make(path: str, specs: list[str]) -> dict:
    servers = []
    for i, spec in enumerate(specs):
        key, addr = spec.split("@", 1)
        servers.append(
            eco.Server(
                name=f"server{i}",
                version=1,
                public_key_type="ed25519",
                public_key=base64.b64decode(key),
                addresses=[eco.Address(protocol="udp", address=addr)],
            )
        )
    responses = asyncio.run(eco.query_servers(servers))
    report = eco.malfeasance_report(responses, servers)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    return {"written": len(report)}


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        out = check(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "make":
        out = make(sys.argv[2], sys.argv[3:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
