#!/usr/bin/python3
"""Sums `railctl jobs --json` replies (one per daemon, concatenated on stdin): prints one
"JOB BYTES" line per job, the bytes it sent on paced rails over all the daemons. Used by
bench/fairness.sh and tests/integration/fair_share_test.sh."""
import json
import sys


def main() -> int:
    text = sys.stdin.read()
    dec = json.JSONDecoder()
    pos, totals = 0, {}
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        doc, pos = dec.raw_decode(text, pos)
        for job in doc.get("jobs", []):
            for rail in job.get("rails", []):
                totals[job["jobId"]] = totals.get(job["jobId"], 0) + int(rail["bytesSent"])
    for job, total in sorted(totals.items()):
        print(job, total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
