"""Scrapes chimed's metrics endpoint once and parses it with the Prometheus project's own Python
OpenMetrics parser (prometheus-client), for metrics.rs. The parser is strict: a page without its
closing "# EOF", a counter sample without "_total" or a family described twice is refused. Run it
with the python of scripts/setup's metrics venv:

    python metrics_scrape.py URL

Prints one JSON object on stdout and exits 0 if the page parsed:
    {"status": 200, "content_type": "...",
     "samples": [{"name": "...", "labels": {...}, "value": 1.0, "type": "counter"}, ...]}
A page the parser rejects exits 1 with {"error": "..."}.
"""

import json
import sys
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families


def main() -> int:
    url = sys.argv[1]
    with urllib.request.urlopen(url, timeout=5) as response:
        status = response.status
        content_type = response.headers.get("Content-Type", "")
        body = response.read().decode("utf-8")
    try:
        samples = [
            {"name": s.name, "labels": s.labels, "value": s.value, "type": family.type}
            for family in text_string_to_metric_families(body)
            for s in family.samples
        ]
    except Exception as e:  # the parser raises ValueError and friends on a bad page
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    print(json.dumps({"status": status, "content_type": content_type, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
