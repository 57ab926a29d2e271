#!/usr/bin/env python3
"""Generate byte-exact engine KV-event payloads with msgspec, as the engines do.

The struct definitions mirror vllm/distributed/kv_events.py (array_like and
map-encoded variants) and SGLang's shorter positional events. Output:
tests/data/wire_fixtures.json, {name: hex payload}. Rerun after changing a
scenario:  pip install msgspec && python3 scripts/gen_vllm_fixtures.py
"""
import json
import os
from typing import Any

import msgspec

# --- current vLLM, positional (array_like=True, tag=True) -------------------------


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


# --- map-encoded vLLM (structs as maps with a "type" tag) ------------------------


class MapBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class MBlockStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class MBlockRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None = None


class MAllBlocksCleared(MapEvent, tag="AllBlocksCleared"):
    pass


# --- SGLang: shorter positional BlockStored, attn_dp_rank ------------------------


class SgBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class SgEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class SgBlockStored(SgEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None


def tokens(a, b):
    return list(range(a, b + 1))


enc = msgspec.msgpack.Encoder()
TS = 1732300000.25
fx = {}

# The end-to-end scenario, block size 4. Worker 1: positional (array_like) vLLM.
fx["w1_s0_store"] = EventBatch(TS, [BlockStored([101, 102, 103], None, tokens(1, 12), 4, None, "GPU")])
fx["w1_s1_store_child"] = EventBatch(TS, [BlockStored([104], 103, tokens(13, 16), 4, None, "GPU")])
fx["w1_s2_clear"] = EventBatch(TS, [AllBlocksCleared()])
# Worker 2, dp rank 0: map-encoded vLLM with data_parallel_rank.
fx["w2d0_s0_store"] = MapBatch(TS, [MBlockStored([201, 202], None, tokens(1, 8), 4, medium="GPU")], 0)
fx["w2d0_s1_remove"] = MapBatch(TS, [MBlockRemoved([202], medium="GPU")], 0)
# Worker 2, dp rank 1: positional batch whose events are maps (vLLM versions in between).
fx["w2d1_s0_store"] = EventBatch(TS, [MBlockStored([301, 302], None, [1, 2, 3, 4, 99, 98, 97, 96], 4)], 1)
# Worker 1 restarted publisher: a fresh stream from seq 0 after the clear.
fx["w1_restart_s0_store"] = EventBatch(TS, [BlockStored([111, 112], None, tokens(1, 8), 4, None, "GPU")])

# Dialect coverage (decoder tests).
fx["vllm_array_full"] = EventBatch(
    TS,
    [
        BlockStored([-5, 2**64 - 1], None, tokens(1, 8), 4, None, "GPU", "my-lora", [None, None]),
        BlockRemoved([-5], "GPU"),
        AllBlocksCleared(),
    ],
    3,
)
fx["vllm_array_minimal"] = EventBatch(TS, [BlockStored([7], None, tokens(1, 4), 4, None, None)])
fx["vllm_bytes_hashes"] = EventBatch(
    TS, [BlockStored([bytes(range(32))], bytes(range(1, 33)), tokens(1, 4), 4, None, "CPU")]
)
fx["vllm_map"] = MapBatch(
    TS,
    [MBlockStored([1, 2], 9, tokens(1, 8), 4, lora_name="sql"), MBlockRemoved([1]), MAllBlocksCleared()],
    2,
)
fx["sglang_array"] = SgBatch(TS, [SgBlockStored([5, 6], None, tokens(1, 8), 4)], 1)

out = {name: enc.encode(v).hex() for name, v in fx.items()}
here = os.path.dirname(os.path.abspath(__file__))
path = os.path.join(here, "..", "tests", "data", "wire_fixtures.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
    f.write("\n")
print(f"wrote {len(out)} fixtures to {os.path.normpath(path)}")
