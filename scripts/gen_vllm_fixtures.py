#!/usr/bin/env python3
"""Generate byte-exact KV-event payloads with msgspec, as the publishers do.

The struct definitions mirror vllm/distributed/kv_events.py (array_like and
map-encoded variants, every field generation), SGLang's
python/sglang/srt/disaggregation/kv_events.py (shorter positional events,
attn_dp_rank, metadata, tagged-map events), the Mooncake master's RFC #1527
event maps, and the legacy Mooncake Store events. Output:
tests/data/wire_fixtures.json, {name: hex payload}. Every fixture is
documented where it is built. Rerun after changing a scenario:
    pip install msgspec xxhash && python3 scripts/gen_vllm_fixtures.py
Existing fixture names and bytes must never change (tests and the e2e suite
pin them); add new names instead.
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


# =====================================================================================
# Dialect coverage added with the Mooncake decoders. Names below are new; the ones
# above are pinned.
# =====================================================================================

# --- vLLM: every field generation ------------------------------------------------


class V0Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vLLM <= 0.9: no data_parallel_rank."""

    ts: float
    events: list[Any]


class V0BlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class V0BlockRemoved(KVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]


def newest_events(base):
    """Newest vLLM field order (hybrid KV-cache groups, locality), on `base`:
    positional events (KVCacheEvent) or tagged maps (MapEvent, current vLLM: no
    array_like, inside a positional batch)."""

    class BlockStored(base, tag="BlockStored"):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[Any] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None
        locality: str | None = None

    class BlockRemoved(base, tag="BlockRemoved"):
        block_hashes: list[int | bytes]
        medium: str | None
        group_idx: int | None = None
        locality: str | None = None

    return BlockStored, BlockRemoved


TailBlockStored, TailBlockRemoved = newest_events(KVCacheEvent)
CurBlockStored, CurBlockRemoved = newest_events(MapEvent)


# vllm_array_v0: [ts, events] without dp rank; 5-field BlockStored, 1-field BlockRemoved.
fx["vllm_array_v0"] = V0Batch(TS, [V0BlockStored([11, 12], None, tokens(1, 8), 4, None), V0BlockRemoved([12])])
# vllm_array_tail: dp 0; BlockStored with every optional field and every newer tail
# field (extra_keys, group_idx 0, kv_cache_spec_kind "full_attention", sliding window,
# locality); BlockRemoved with medium + group_idx + locality; AllBlocksCleared.
fx["vllm_array_tail"] = EventBatch(
    TS,
    [
        TailBlockStored(
            [21, 22], 20, tokens(1, 8), 4, 7, "GPU", "my-lora", [None, ["mm-hash", 0]], 0, "full_attention", None, "local"
        ),
        TailBlockRemoved([22], "GPU", 0, "local"),
        AllBlocksCleared(),
    ],
    0,
)
# vllm_array_aux_group: a hybrid model's batch: the sliding-window group's events
# (group_idx 1, kind "sliding_window") must be dropped, the full-attention one kept.
fx["vllm_array_aux_group"] = EventBatch(
    TS,
    [
        TailBlockStored([31], None, tokens(1, 4), 4, None, "GPU", None, None, 0, "full_attention"),
        TailBlockStored([31], None, tokens(1, 4), 4, None, "GPU", None, None, 1, "sliding_window", 128),
        TailBlockRemoved([31], "GPU", 1),
    ],
    0,
)
# vllm_map_current: current vLLM: positional batch (dp 1) of tagged-map events with
# bytes (sha256) hashes and the newest fields.
fx["vllm_map_current"] = EventBatch(
    TS,
    [
        CurBlockStored(
            [bytes(range(32)), bytes(range(32, 64))], None, tokens(1, 8), 4, None, "GPU", None,
            [None, None], 0, "full_attention", None, "local",
        ),
        CurBlockRemoved([bytes(range(32, 64))], "GPU", 0),
    ],
    1,
)

# --- SGLang -------------------------------------------------------------------------


class SgFullBatch(msgspec.Struct, array_like=True, gc=False):
    """SGLang EventBatch without omit_defaults: attn_dp_rank always present (3rd)."""

    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class SgFullEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class SgMBlockStored(SgFullEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list
    block_size: int
    lora_id: int | None
    medium: str | None = None


class SgMBlockRemoved(SgFullEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class SgMeta(msgspec.Struct, omit_defaults=True, gc=False):
    cache_salt: str


class SgBlockStoredMeta(SgMBlockStored, tag="BlockStored", kw_only=True):
    metadata: SgMeta


class SgMapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class SgMapBlockStored(SgMapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None


class SgMapBlockRemoved(SgMapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


# sglang_array_medium: attn_dp_rank 2 (3rd batch element); HiCache media:
# stored on CPU_PINNED, removed from DISK.
fx["sglang_array_medium"] = SgFullBatch(
    TS, [SgMBlockStored([41, 42], 40, tokens(1, 8), 4, None, "CPU_PINNED"), SgMBlockRemoved([41], "DISK")], 2
)
# sglang_array_metadata: BlockStoredWithMetadata: medium GPU, then {"cache_salt": "tenant-a"}.
fx["sglang_array_metadata"] = SgFullBatch(
    TS, [SgBlockStoredMeta([51], None, tokens(1, 4), 4, None, "GPU", metadata=SgMeta("tenant-a"))], 0
)
# sglang_map_events: newest SGLang: tagged-map events (cache_salt, session_id) in a
# positional batch with attn_dp_rank 3; medium EXTERNAL (L4 pool).
fx["sglang_map_events"] = SgFullBatch(
    TS,
    [
        SgMapBlockStored([61], None, tokens(1, 4), 4, None, "EXTERNAL", "tenant-b", "sess-1"),
        SgMapBlockRemoved([61], "EXTERNAL"),
    ],
    3,
)
# sglang_bigram_tokens: EAGLE / DSv4 token ids as (token, next_token) pairs, 2 blocks of 2.
fx["sglang_bigram_tokens"] = SgFullBatch(
    TS, [SgMBlockStored([71, 72], None, [[10, 11], [11, 12], [12, 13], [13, 14]], 2, None, "GPU")], 0
)

# --- Mooncake RFC #1527 (master publisher) ----------------------------------------------


class RfcEvent(msgspec.Struct, gc=False):
    """RFC #1527 stored/removed event, with the master's legacy aliases (type,
    block_hashes, parent_block_hash) and object_key, in the master's key order."""

    event_id: int
    timestamp: int | None
    event_type: str
    model_name: str | None
    block_size: int | None
    additional_salt: str | None
    lora_name: str | None
    tenant_id: str
    backend_id: str
    medium: str | None
    dp_rank: int | None
    seq_hashes: list[int]
    base_block_idx: int | None = None
    parent_hash: int | None = None
    token_ids: list[int] | None = None
    object_key: str | None = None
    type: str | None = None
    block_hashes: list[int] | None = None
    parent_block_hash: int | None = None


class RfcCleared(msgspec.Struct, gc=False):
    event_id: int
    timestamp: int | None
    event_type: str
    model_name: str | None
    block_size: int | None
    additional_salt: str | None
    lora_name: str | None
    tenant_id: str
    backend_id: str
    medium: str | None
    dp_rank: int | None


class RfcBatch(msgspec.Struct, array_like=True, gc=False):
    """[timestamp, [events], dp_rank]: the master's trailer dp_rank is 0."""

    ts: float
    events: list[Any]
    dp_rank: int | None = 0


class RfcMapBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[Any]
    dp_rank: int | None = 0


MS = 1739145600000
S = [1234567890, 9876543210, 1122334455]
# mc_rfc_stored_seq: RFC example: 3 seq hashes, base_block_idx 5, parent_hash, no
# tokens; full envelope (model, block size 64, salt, tenant, backend worker-0, gpu,
# dp 0) and the compat aliases type/block_hashes/parent_block_hash repeating the
# same hashes (must not double-count).
fx["mc_rfc_stored_seq"] = RfcBatch(
    1739145600.0,
    [
        RfcEvent(
            42, MS, "stored", "llama-3.1-8b", 64, "w8a8", None, "default", "worker-0", "gpu", 0,
            S, 5, 9999999999, None, None, "BlockStored", S, 9999999999,
        )
    ],
)
# mc_rfc_stored_tokens: a non-standard-hash publisher: seq hashes plus token_ids
# (2 blocks of block_size 2), lora_name, dp_rank 1 on the event, root (base 0).
fx["mc_rfc_stored_tokens"] = RfcBatch(
    1739145600.0,
    [RfcEvent(7, MS, "stored", "llama-3.1-8b", 2, None, "sql", "default", "worker-1", "gpu", 1, [501, 502], 0, None, [1, 2, 3, 4])],
)
# mc_rfc_removed: removed one block on cpu, base_block_idx 7.
fx["mc_rfc_removed"] = RfcBatch(
    1739145601.0,
    [RfcEvent(43, MS + 1000, "removed", "llama-3.1-8b", 64, None, None, "default", "worker-0", "cpu", 0, [1122334455], 7)],
)
# mc_rfc_cleared: cleared, envelope only (disk stream of mooncake-daemon-0).
fx["mc_rfc_cleared"] = RfcBatch(
    1739145602.0, [RfcCleared(44, MS + 2000, "cleared", None, None, None, None, "default", "mooncake-daemon-0", "disk", None)]
)
# mc_rfc_object_key_only: master events whose hashes live in object_key only:
# stored "0x00000000075bcd15" (hex u64 -> seq hash 123456789), stored "987654321"
# (decimal), stored an opaque sha256-style key (no seq hash: empty), removed the hex key.
# Master style: no model/block size/lora/dp on the events, tenant per object, medium cpu/disk.
OPAQUE = "llama-3.1-8b@tp0@" + "ab" * 32
fx["mc_rfc_object_key_only"] = RfcBatch(
    1739145603.0,
    [
        RfcEvent(1, MS, "stored", None, None, None, None, "default", "mooncake-daemon-0", "cpu", None, [], 0, None, None, "0x00000000075bcd15"),
        RfcEvent(2, MS, "stored", None, None, None, None, "tenant-a", "mooncake-daemon-0", "disk", None, [], 0, None, None, "987654321"),
        RfcEvent(3, MS, "stored", None, None, None, None, "default", "mooncake-daemon-0", "cpu", None, [], 0, None, None, OPAQUE),
        RfcEvent(4, MS, "removed", None, None, None, None, "default", "mooncake-daemon-0", "cpu", None, [], None, None, None, "0x00000000075bcd15"),
    ],
)
# mc_rfc_map_batch: the same stored event in a map batch {ts, events, dp_rank: 2}.
fx["mc_rfc_map_batch"] = RfcMapBatch(
    1739145600.0,
    [RfcEvent(8, None, "stored", None, 64, None, None, "default", "worker-2", "gpu", None, [777], 0)],
    2,
)

# --- legacy Mooncake Store events ---------------------------------------------------


class LegacyBatch(msgspec.Struct, array_like=True, gc=False):
    """The conductor spec's EventBatch { events }: no timestamp."""

    events: list[Any]


class LegacyTsBatch(msgspec.Struct, array_like=True, gc=False):
    """The store publisher's [ts, [events]]."""

    ts: float
    events: list[Any]


class LegacyEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class BlockStoreEvent(LegacyEvent):
    """The conductor spec's layout."""

    ts: float
    mooncake_key: str
    addr_list: list[str]
    block_hash: int
    parent_block_hash: int
    token_id: list[int]
    block_size: int
    model_name: str
    lora_name: str
    lora_id: int


class BlockUpdateEvent(LegacyEvent):
    ts: float
    mooncake_key: str
    addr_list: list[str]


class RemoveAllEvent(LegacyEvent):
    pass


class StoreBlockStoreEvent(LegacyEvent, tag="BlockStoreEvent"):
    """Mooncake Store publisher layout (subscriber guide): text hashes, replica pairs."""

    mooncake_key: str
    replicas: list[list[str]]
    model_name: str
    block_size: int
    block_hash: str
    parent_block_hash: str
    token_ids: list[int]


class StoreBlockUpdateEvent(LegacyEvent, tag="BlockUpdateEvent"):
    mooncake_key: str
    replicas: list[list[str]]


class MapLegacyEvent(msgspec.Struct, gc=False, tag_field="type", tag=True):
    pass


class MBlockStoreEvent(MapLegacyEvent, tag="BlockStoreEvent"):
    ts: float
    mooncake_key: str
    addr_list: list[str]
    block_hash: int
    parent_block_hash: int
    token_id: list[int]
    block_size: int
    model_name: str
    lora_name: str
    lora_id: int


class MRemoveAllEvent(MapLegacyEvent, tag="RemoveAllEvent"):
    pass


# mc_legacy_conductor: the conductor spec's layout, batch without timestamp: a root block (parent 0 =
# none) with 2 replicas, a child block with lora "sql"/id 3, an update of the first
# key to 1 replica, then RemoveAllEvent.
fx["mc_legacy_conductor"] = LegacyBatch(
    [
        BlockStoreEvent(1732300000.5, "key-a", ["10.0.0.1:6000", "10.0.0.2:6000"], 0xA1, 0, [101, 15], 2, "deepseek", "", 0),
        BlockStoreEvent(1732300000.5, "key-b", ["10.0.0.1:6000"], 0xA2, 0xA1, [100, 55], 2, "deepseek", "sql", 3),
        BlockUpdateEvent(1732300001.0, "key-a", ["10.0.0.3:6000"]),
        RemoveAllEvent(),
    ]
)
# mc_legacy_store: the store publisher's layout in a [ts, [events]] batch: text hashes
# ("0x41234125", parent "0x51512342"), replica [type, location] pairs, then an update.
fx["mc_legacy_store"] = LegacyTsBatch(
    TS,
    [
        StoreBlockStoreEvent(
            "key_12345",
            [["memory", "tcp://192.168.1.10:6000"], ["disk", "/data/blocks/block_12345.bin"], ["local_disk", "tcp://192.168.1.10:7000"]],
            "llama2-7b", 4, "0x41234125", "0x51512342", [1, 2, 3, 4],
        ),
        StoreBlockUpdateEvent("key_12345", [["memory", "tcp://192.168.1.10:6000"]]),
    ],
)
# mc_legacy_map: map-form legacy events: a BlockStoreEvent with the conductor spec's field
# names, then RemoveAllEvent; in a [ts, [events], dp_rank 0] batch.
fx["mc_legacy_map"] = EventBatch(
    TS,
    [
        MBlockStoreEvent(1732300000.5, "key-c", ["10.0.0.9:6000"], 0xC1, 0, [7, 8], 2, "deepseek", "", 0),
        MRemoveAllEvent(),
    ],
    0,
)

# --- the conductor spec's worked example ------------------------------------------------------------
# Instance "vllm-1", block size 2, tokens [101, 15, 100, 55, 89, 63] -> blocks H1..H3,
# dp2. Target state: H1 on GPU dp0 + GPU dp1 + CPU + DISK; H2 on GPU dp0 + CPU; H3 on
# DISK. Expected /query for those tokens: longest_matched 6, GPU 4, DP {0: 4, 1: 2},
# CPU 4, DISK 4. Applying the four payloads below (any order; each on the listener
# registered for vllm-1, the disk one on its Mooncake master listener) yields it.
import xxhash  # noqa: E402

SEED = 1337


def local_hash(toks):
    return xxhash.xxh3_64_intdigest(b"".join(t.to_bytes(4, "little") for t in toks), seed=SEED)


def chain(parent, local):
    if parent is None:
        return local
    return xxhash.xxh3_64_intdigest(parent.to_bytes(8, "little") + local.to_bytes(8, "little"), seed=SEED)


EXAMPLE_TOKENS = [101, 15, 100, 55, 89, 63]
SEQ = []
for i in range(0, 6, 2):
    SEQ.append(chain(SEQ[-1] if SEQ else None, local_hash(EXAMPLE_TOKENS[i : i + 2])))
# vLLM engine hashes are private to the engine; any stable values do.
E1, E2 = 0x5EED0001, 0x5EED0002
# conductor_gpu_dp0: vLLM dp 0 stores H1, H2 on GPU (tokens carried).
fx["conductor_gpu_dp0"] = EventBatch(TS, [BlockStored([E1, E2], None, EXAMPLE_TOKENS[:4], 2, None, "GPU")], 0)
# conductor_gpu_dp1: vLLM dp 1 stores H1 on GPU.
fx["conductor_gpu_dp1"] = EventBatch(TS, [BlockStored([E1], None, EXAMPLE_TOKENS[:2], 2, None, "GPU")], 1)
# conductor_cpu_dp0: vLLM dp 0 CPU offload of H1, H2 (same engine hashes, medium CPU).
fx["conductor_cpu_dp0"] = EventBatch(TS, [BlockStored([E1, E2], None, EXAMPLE_TOKENS[:4], 2, None, "CPU")], 0)
# conductor_disk_rfc: Mooncake master (RFC #1527) stores H1 and H3 on disk, by kvix seq
# hash, without tokens: H1 as seq_hashes [S1] at base 0 (object_key = its hex), H3 as
# object_key-only (decimal S3) at base 2 with parent_hash S2. Batch dp trailer 0.
fx["conductor_disk_rfc"] = RfcBatch(
    TS,
    [
        RfcEvent(1, MS, "stored", None, None, None, None, "default", "mooncake-daemon-0", "disk", None, [SEQ[0]], 0, None, None, f"0x{SEQ[0]:016x}"),
        RfcEvent(2, MS, "stored", None, None, None, None, "default", "mooncake-daemon-0", "disk", None, [], 2, SEQ[1], None, str(SEQ[2])),
    ],
)
print("conductor example seq hashes:", [f"{h:#018x}" for h in SEQ])


# --- black-box scenario of tests/e2e_dialects.rs (block size 4, prompt tokens 1..16) --
# SGLang (positional, attn_dp_rank 1): blocks 1..8 on GPU, offloaded to CPU_PINNED,
# then the second block leaves the GPU (it stays on the host).
fx["e2e_sglang_store"] = SgFullBatch(TS, [SgMBlockStored([901, 902], None, tokens(1, 8), 4, None, "GPU")], 1)
fx["e2e_sglang_offload"] = SgFullBatch(TS, [SgMBlockStored([901, 902], None, tokens(1, 8), 4, None, "CPU_PINNED")], 1)
fx["e2e_sglang_remove_gpu"] = SgFullBatch(TS, [SgMBlockRemoved([902], "GPU")], 1)
# RFC #1527 with a non-standard hash (seq_hashes 701.. plus token_ids), LoRA "sql", dp 0.
fx["e2e_rfc_store_tokens"] = RfcBatch(
    TS, [RfcEvent(1, MS, "stored", "m", 4, None, "sql", "default", "w", "gpu", 0, [701, 702, 703], 0, None, tokens(1, 12))]
)
# RFC #1527 Mooncake master style: standardized seq hashes of tokens 1..16, no tokens, disk.
E2E_SEQ = []
for i in range(0, 16, 4):
    E2E_SEQ.append(chain(E2E_SEQ[-1] if E2E_SEQ else None, local_hash(tokens(i + 1, i + 4))))
fx["e2e_rfc_seq_disk"] = RfcBatch(
    TS, [RfcEvent(1, MS, "stored", None, None, None, None, "default", "daemon", "disk", None, E2E_SEQ, 0, None, None)]
)
fx["e2e_rfc_removed_disk"] = RfcBatch(
    TS, [RfcEvent(2, MS, "removed", None, None, None, None, "default", "daemon", "disk", None, E2E_SEQ[3:], 3)]
)
fx["e2e_rfc_cleared_disk"] = RfcBatch(
    TS, [RfcCleared(3, MS, "cleared", None, None, None, None, "default", "daemon", "disk", None)]
)
# RFC #1527 event naming another tenant: indexed under (model, "tenant-x") only.
fx["e2e_rfc_other_tenant"] = RfcBatch(
    TS, [RfcEvent(4, MS, "stored", "m", 4, None, None, "tenant-x", "w", "gpu", 0, [801], 0, None, tokens(1, 4))]
)
# Legacy Mooncake Store (the conductor spec's layout): blocks 1..8 in the host pool, then RemoveAll.
fx["e2e_legacy_store"] = LegacyBatch(
    [
        BlockStoreEvent(1732300000.5, "k1", ["10.0.0.1:6000"], 0xB1, 0, tokens(1, 4), 4, "m", "", 0),
        BlockStoreEvent(1732300000.5, "k2", ["10.0.0.1:6000"], 0xB2, 0xB1, tokens(5, 8), 4, "m", "", 0),
    ]
)
fx["e2e_legacy_remove_all"] = LegacyBatch([RemoveAllEvent()])
# vLLM multimodal: block 2 carries an image whose Dynamo routing hash is 0xdeadbeef,
# in extra_keys marker form (16 hex digits + 48 zeros); then the vLLM 0.19+ pair form.
def mm_marker(h):
    return f"{h:016x}" + "0" * 48


fx["e2e_vllm_mm"] = EventBatch(
    TS, [BlockStored([951, 952, 953], None, tokens(1, 12), 4, None, "GPU", None, [None, [mm_marker(0xDEADBEEF)], None])]
)
fx["e2e_vllm_mm_pairs"] = EventBatch(
    TS, [BlockStored([961, 962, 963], None, tokens(1, 12), 4, None, "GPU", None, [None, [[mm_marker(0xDEADBEEF), 1]], None])]
)
print("e2e seq hashes:", E2E_SEQ)


out = {name: enc.encode(v).hex() for name, v in fx.items()}
here = os.path.dirname(os.path.abspath(__file__))
path = os.path.join(here, "..", "tests", "data", "wire_fixtures.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
    f.write("\n")
print(f"wrote {len(out)} fixtures to {os.path.normpath(path)}")
