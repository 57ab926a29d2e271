#!/usr/bin/env python3
"""How long the index's runs are, read from a `/dump`.

A run is a chain of blocks, each the only child of the one before, with the same
holders (worker, dp rank, tier). A path-compressed tree pays its per-node words
(parent, child, holders) once per run instead of once per block, so the mean run
says what such a tree would save on this index.

    curl -s http://HOST:PORT/dump -o dump.json
    python3 perf/run_lengths.py dump.json

Reads the whole dump into memory (about 3x its size).
"""
import collections
import re
import sys

EVENT = re.compile(
    rb'\{"worker_id":(\d+),"storage_tier":"(\w+)","residency_domain":"\w+",'
    rb'"event":\{"event_id":\d+,"data":\{"stored":\{"parent_hash":(null|\d+),'
    rb'"kvix_parent_seq":(?:null|\d+),"start_position":(?:null|\d+),'
    rb'"blocks":\[([^\]]*)\]\}\},"dp_rank":(\d+)\}'
)
BLOCK = re.compile(rb'"block_hash":(\d+)')


def main(path):
    data = open(path, "rb").read()
    parent, holders = {}, collections.defaultdict(set)
    children = collections.defaultdict(set)
    events = 0
    for m in EVENT.finditer(data):
        events += 1
        worker, tier, ph, blocks, dp = m.groups()
        holder = (int(worker), int(dp), tier)
        prev = None if ph == b"null" else int(ph)
        for b in BLOCK.finditer(blocks):
            h = int(b.group(1))
            if prev is not None:
                parent[h] = prev
                children[prev].add(h)
            holders[h].add(holder)
            prev = h
    if not events:
        sys.exit("no stored events in the dump")

    def continues(h, same_holders):
        p = parent.get(h)
        return (p in holders and len(children[p]) == 1
                and (not same_holders or holders[p] == holders[h]))

    blocks = len(holders)
    pairs = sum(len(s) for s in holders.values())
    runs = sum(1 for h in holders if not continues(h, True))
    chains = sum(1 for h in holders if not continues(h, False))
    print(f"events {events}, blocks {blocks}, (block, holder) pairs {pairs} "
          f"({pairs / blocks:.2f} a block)")
    print(f"runs (single-child chains, same holders): {runs}, mean {blocks / runs:.1f} blocks")
    print(f"single-child chains, any holders: {chains}, mean {blocks / chains:.1f} blocks")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
