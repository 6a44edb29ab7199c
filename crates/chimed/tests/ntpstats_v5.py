"""ntpstats (PyPI), an independent NTPv5 client of draft -09: probes chimed for the v4 -> v5
upgrade, then asks it over v5. Prints one JSON object; exits non-zero on any error.
Usage: ntpstats_v5.py HOST PORT"""
import json
import sys

from ntpstats.sntp import query_v5, supports_v5

host, port = sys.argv[1], int(sys.argv[2])
upgrade = supports_v5(host, port=port, timeout=2.0)
r = query_v5(host, port=port, timeout=2.0)
print(json.dumps({"upgrade": upgrade, "draft": r.draft, "version": r.version,
                  "stratum": r.stratum, "leap": r.leap, "flags": r.flags,
                  "timescale": r.timescale, "era": r.era, "offset": r.offset,
                  "delay": r.delay, "root_delay": r.root_delay}))
