#!/usr/bin/env python3
"""Markdown tables from one perf/bench.sh folder (its JSON reports), to stdout."""
import json
import os
import sys

out = sys.argv[1]


def load(name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def mb(x):
    return f"{x / 1e6:.2f}M"


def spread(name, key):
    """min–max of `key` over the repeated runs of NAME (its -rN.json files)."""
    import glob
    vals = sorted(json.load(open(f))["events"][key] for f in glob.glob(os.path.join(out, f"{name}-r*.json")))
    if len(vals) < 2:
        return ""
    fmt = mb if key == "blocks_applied_per_sec" else (lambda v: f"{v:.0f}")
    return f" ({fmt(vals[0])}–{fmt(vals[-1])})"


print(f"Machine and run: `{open(os.path.join(out, 'machine.txt')).read().strip()}`\n".replace("\n", "; ").rstrip("; "))
print()
print("Events: the median of the repeated runs, their range in parentheses.")
print()
print("| shards | workers | blocks stored / removed | blocks applied/s | RSS growth (settled) | bytes / live (block, worker) | same, at last sentinel | bytes / unique block |")
print("|---|---|---|---|---|---|---|---|")
for t in (1, 2):
    for w in (16, 64):
        e = load(f"events-t{t}-w{w}.json")["events"]
        s = e["sim"]
        grow = (e["rss_after_bytes"] - e["rss_before_bytes"]) / 2**20
        print(
            f"| {t} | {w} | {mb(s['blocks_stored'])} / {mb(s['blocks_removed'])} "
            f"| {mb(e['blocks_applied_per_sec'])}{spread(f'events-t{t}-w{w}', 'blocks_applied_per_sec')} "
            f"| {grow:.0f} MiB | {e['bytes_per_live_pair']:.1f}{spread(f'events-t{t}-w{w}', 'bytes_per_live_pair')} "
            f"| {e.get('bytes_per_live_pair_at_apply') or 0:.1f} "
            f"| {e['bytes_per_unique_block']:.1f} |"
        )
print()
sweep = [(i, f"events-t2-w16-i{i}.json") for i in (1, 2, 3)]
if all(os.path.exists(os.path.join(out, f)) for _, f in sweep):
    print("Ingest threads (--threads 2, 16 workers; the default is one per executor):")
    print()
    print("| --ingest-threads | blocks applied/s | bytes / live (block, worker) |")
    print("|---|---|---|")
    for i, f in sweep:
        e = load(f)["events"]
        name = f"events-t2-w16-i{i}"
        print(
            f"| {i} | {mb(e['blocks_applied_per_sec'])}{spread(name, 'blocks_applied_per_sec')} "
            f"| {e['bytes_per_live_pair']:.1f}{spread(name, 'bytes_per_live_pair')} |"
        )
    print()

closed = {("kvix", q["endpoint"], q["prompt_tokens"], q["connections"]): q for q in load("kvix-closed.json")["queries"]}
hello = {(q["prompt_tokens"], q["connections"]): q for q in load("hello-closed.json")["queries"]}
print("Closed loop (each connection sends its next request when the last is answered); latency in µs.\n")
print("| server | endpoint | prompt tokens | connections | req/s | p50 | p99 | p99.9 | p50 / hello p50 |")
print("|---|---|---|---|---|---|---|---|---|")
for (srv, ep, tok, conns), q in sorted(closed.items()):
    h = hello.get((tok, conns))
    ratio = f"{q['p50_us'] / h['p50_us']:.2f}x" if h and h["p50_us"] else "-"
    print(f"| kvix | /{ep} | {tok} | {conns} | {q['achieved_rps']:.0f} | {q['p50_us']:.0f} | {q['p99_us']:.0f} | {q['p999_us']:.0f} | {ratio} |")
for (tok, conns), q in sorted(hello.items()):
    print(f"| kvix-hello | /query | {tok} | {conns} | {q['achieved_rps']:.0f} | {q['p50_us']:.0f} | {q['p99_us']:.0f} | {q['p999_us']:.0f} | 1x |")
print()
print("Open loop, 16 connections, 1024-token /query; latency from the intended send time, in µs.\n")
print("| server | offered req/s | achieved req/s | p50 | p90 | p99 | p99.9 | unsent |")
print("|---|---|---|---|---|---|---|---|")
for name, f in (("kvix", "kvix-open.json"), ("kvix-hello", "hello-open.json")):
    for q in load(f)["queries"]:
        print(
            f"| {name} | {q['rate']:.0f} | {q['achieved_rps']:.0f} | {q['p50_us']:.0f} | {q['p90_us']:.0f} "
            f"| {q['p99_us']:.0f} | {q['p999_us']:.0f} | {q['unsent']} |"
        )
print()
churn = dict(line.split(": ") for line in open(os.path.join(out, "kvix-churn.txt")).read().split("\n") if line)
print(
    "Memory after churn (kvix --threads 2, 16-worker index): RSS loaded "
    f"{int(churn['rss_loaded_kib']) / 1024:.0f} MiB, after unregistering every worker "
    f"{int(churn['rss_after_unregister_kib']) / 1024:.0f} MiB, fresh process "
    f"{int(churn['rss_fresh_kib']) / 1024:.0f} MiB."
)
