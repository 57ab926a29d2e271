//! Local snapshots: a compact, versioned, checksummed binary image of [`State`].
//!
//! Layout (little-endian): `b"KVIXSNAP"`, version `u32`, body length `u64`, XXH3-64 of
//! the body `u64`, then the body: indexes (model, tenant, block size, listeners with
//! instance, endpoint, replay endpoint, last sequence, publisher kind), and per worker
//! (instance, dp rank) its KV-cache groups besides full attention (count, then per
//! group its index, rule tag, rule parameter and block size; then the hit alignment,
//! 0 for none) and its blocks parents first as (engine hash, flags [bit 0: has
//! parent, bits 1..3: tier, bit 4: held in other groups], parent sequence hash if
//! any, local hash, the groups' bits if any). Written to `FILE.tmp`, fsynced, renamed over `FILE`,
//! directory fsynced: a crash leaves the old or the new snapshot, never a mix. A file
//! that fails any check is rejected whole before anything is applied.

use super::{IndexState, ListenerState, RecoveryError, State, WorkerBlocks};
use crate::ingest::feed::{SeedBlock, SeedGroups};
use crate::registry::{Endpoint, InstanceKey};
use crate::shard::hybrid::{GroupRule, GroupSpec};
use crate::types::{BlockHash, EngineHash, SeqHash, Tier};
use std::io::Write;
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 8] = b"KVIXSNAP";
/// 2: an instance is a tag (0: integer id `u64`, 1: name string). Version 1 wrote
/// the id alone, and is still read. 3: a worker's KV-cache groups and its blocks'
/// group bits; version 2 had none, and is still read.
const VERSION: u32 = 3;
const HEADER: usize = 8 + 4 + 8 + 8;

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn groups(&mut self, g: &SeedGroups) {
        self.u8(g.groups.len() as u8);
        for &(group, spec) in &g.groups {
            let (tag, param) = match spec.rule {
                GroupRule::SlidingWindow(w) => (0, w),
                GroupRule::ChunkedLocal(c) => (1, c),
                GroupRule::Mamba => (2, 0),
            };
            self.u8(group);
            self.u8(tag);
            self.u32(param);
            self.u32(spec.block_size);
        }
        self.u32(g.align.unwrap_or(0));
    }
    fn instance(&mut self, k: &InstanceKey) {
        match k {
            InstanceKey::Id(i) => {
                self.u8(0);
                self.u64(*i);
            }
            InstanceKey::Name(n) => {
                self.u8(1);
                self.str(n);
            }
        }
    }
}

/// Encode `state` as a complete snapshot file image.
pub fn encode(state: &State) -> Vec<u8> {
    let mut w = W(Vec::with_capacity(64 + state.blocks() * 25));
    w.u32(state.indexes.len() as u32);
    for ix in &state.indexes {
        w.str(&ix.model);
        w.str(&ix.tenant);
        w.u32(ix.block_size);
        w.u32(ix.listeners.len() as u32);
        for l in &ix.listeners {
            w.instance(&l.instance);
            w.u32(l.dp);
            w.str(&l.endpoint.endpoint);
            match &l.endpoint.replay_endpoint {
                Some(r) => {
                    w.u8(1);
                    w.str(r);
                }
                None => w.u8(0),
            }
            match l.last_seq {
                Some(s) => {
                    w.u8(1);
                    w.u64(s);
                }
                None => w.u8(0),
            }
            match &l.endpoint.publisher {
                Some(p) => {
                    w.u8(1);
                    w.str(p);
                }
                None => w.u8(0),
            }
        }
        w.u32(ix.workers.len() as u32);
        for wk in &ix.workers {
            w.instance(&wk.instance);
            w.u32(wk.dp);
            w.groups(&wk.groups);
            w.u64(wk.blocks.len() as u64);
            for b in &wk.blocks {
                w.u64(b.engine.0);
                // The parent is kept as its sequence hash (exact, see SeedBlock).
                let grouped = b.groups != 0;
                w.u8(b.parent_seq.is_some() as u8 | ((b.tier.0 & 7) << 1) | ((grouped as u8) << 4));
                if let Some(p) = b.parent_seq {
                    w.u64(p.0);
                }
                w.u64(b.local.0);
                if grouped {
                    w.u32(b.groups);
                }
            }
        }
    }
    let body = w.0;
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err("truncated body".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self) -> Result<String, String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "invalid UTF-8".to_string())
    }
    fn instance(&mut self, version: u32) -> Result<InstanceKey, String> {
        if version == 1 {
            return Ok(InstanceKey::Id(self.u64()?));
        }
        match self.u8()? {
            0 => Ok(InstanceKey::Id(self.u64()?)),
            1 => Ok(InstanceKey::Name(self.str()?)),
            t => Err(format!("unknown instance tag {t}")),
        }
    }
    /// A worker's groups (version 3 on; none before).
    fn groups(&mut self, version: u32) -> Result<SeedGroups, String> {
        if version < 3 {
            return Ok(SeedGroups::default());
        }
        let n = self.u8()?;
        let mut groups = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let group = self.u8()?;
            let (tag, param, block_size) = (self.u8()?, self.u32()?, self.u32()?);
            let rule = match tag {
                0 => GroupRule::SlidingWindow(param),
                1 => GroupRule::ChunkedLocal(param),
                2 => GroupRule::Mamba,
                t => return Err(format!("unknown group rule {t}")),
            };
            groups.push((group, GroupSpec { rule, block_size }));
        }
        let align = Some(self.u32()?).filter(|&a| a > 0);
        Ok(SeedGroups { groups, align })
    }
    /// A count, bounded by what the remaining bytes could hold (no huge allocations).
    fn count(&mut self, wide: bool, min_item: usize) -> Result<usize, String> {
        let n = if wide {
            self.u64()?
        } else {
            self.u32()? as u64
        };
        if n.saturating_mul(min_item as u64) > self.0.len() as u64 {
            return Err("count exceeds body".into());
        }
        Ok(n as usize)
    }
}

/// Decode a snapshot image; every check (magic, version, length, checksum, structure)
/// passes before a [`State`] is returned.
pub fn decode(data: &[u8]) -> Result<State, String> {
    if data.len() < HEADER || &data[..8] != MAGIC {
        return Err("not a kvix snapshot (bad magic or too short)".into());
    }
    let version = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes"));
    if !(1..=VERSION).contains(&version) {
        return Err(format!("unsupported snapshot version {version}"));
    }
    let len = u64::from_le_bytes(data[12..20].try_into().expect("8 bytes"));
    let sum = u64::from_le_bytes(data[20..28].try_into().expect("8 bytes"));
    let body = &data[HEADER..];
    if body.len() as u64 != len {
        return Err(format!(
            "truncated or padded: body is {} bytes, header says {len}",
            body.len()
        ));
    }
    if xxh3_64(body) != sum {
        return Err("checksum mismatch (corrupt)".into());
    }
    let mut r = R(body);
    let mut state = State::default();
    for _ in 0..r.count(false, 16)? {
        let model = r.str()?;
        let tenant = r.str()?;
        let block_size = r.u32()?;
        let mut listeners = Vec::new();
        for _ in 0..r.count(false, 16)? {
            let instance = r.instance(version)?;
            let dp = r.u32()?;
            let endpoint = r.str()?;
            let replay_endpoint = if r.u8()? == 1 { Some(r.str()?) } else { None };
            let last_seq = if r.u8()? == 1 { Some(r.u64()?) } else { None };
            let publisher = if r.u8()? == 1 { Some(r.str()?) } else { None };
            listeners.push(ListenerState {
                instance,
                dp,
                endpoint: Endpoint {
                    endpoint,
                    replay_endpoint,
                    publisher,
                },
                last_seq,
            });
        }
        let mut workers = Vec::new();
        for _ in 0..r.count(false, 17)? {
            let instance = r.instance(version)?;
            let dp = r.u32()?;
            let groups = r.groups(version)?;
            let n = r.count(true, 17)?;
            let mut blocks = Vec::with_capacity(n);
            for _ in 0..n {
                let engine = EngineHash(r.u64()?);
                let flags = r.u8()?;
                let parent_seq = if flags & 1 == 1 {
                    Some(SeqHash(r.u64()?))
                } else {
                    None
                };
                let tier = Tier((flags >> 1) & 7);
                if tier == Tier::PREDICTED {
                    // Snapshots hold the engines' state; a prediction is never written.
                    return Err("a block on the predicted tier".into());
                }
                let local = BlockHash(r.u64()?);
                let bits = if flags & (1 << 4) != 0 { r.u32()? } else { 0 };
                blocks.push(SeedBlock {
                    engine,
                    parent_engine: None,
                    parent_seq,
                    local,
                    tier,
                    groups: bits,
                });
            }
            workers.push(WorkerBlocks {
                instance,
                dp,
                blocks,
                groups,
            });
        }
        state.indexes.push(IndexState {
            model,
            tenant,
            block_size,
            listeners,
            workers,
        });
    }
    if !r.0.is_empty() {
        return Err("trailing bytes in body".into());
    }
    Ok(state)
}

/// Read the snapshot at `path`: `Ok(None)` if there is none, an error if it is unusable.
pub fn read(path: &Path) -> Result<Option<State>, RecoveryError> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(RecoveryError::Io {
                path: path.display().to_string(),
                err,
            });
        }
    };
    decode(&data)
        .map(Some)
        .map_err(|msg| RecoveryError::Snapshot {
            path: path.display().to_string(),
            msg,
        })
}

/// Move a snapshot kvix refused to `<path>.rejected-<unix seconds>` (a free name), so
/// that the next write does not destroy what may explain the refusal or still be
/// recovered by hand. Returns the new path. The rename stays in the snapshot's own
/// directory: where it fails, so would the writer's own rename, so the refused file
/// is not overwritten either way.
pub fn set_aside(path: &Path) -> std::io::Result<std::path::PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = format!("{}.rejected-{secs}", path.display());
    let mut to = std::path::PathBuf::from(&base);
    let mut n = 1;
    while to.try_exists()? {
        to = std::path::PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &to)?;
    Ok(to)
}

/// Write `image` to `path` atomically: temp file, fsync, rename, fsync the directory.
pub fn write(path: &Path, image: &[u8]) -> Result<(), RecoveryError> {
    let io = |err| RecoveryError::Io {
        path: path.display().to_string(),
        err,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(image).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Ok(d) = std::fs::File::open(dir) {
        // Makes the rename itself durable; not every filesystem supports it.
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(blocks: usize) -> State {
        State {
            indexes: vec![IndexState {
                model: "m".into(),
                tenant: "default".into(),
                block_size: 16,
                listeners: vec![ListenerState {
                    instance: InstanceKey::Id(u64::MAX),
                    dp: 1,
                    endpoint: Endpoint {
                        endpoint: "tcp://127.0.0.1:5557".into(),
                        replay_endpoint: Some("tcp://127.0.0.1:5560".into()),
                        publisher: Some("vLLM".into()),
                    },
                    last_seq: Some(42),
                }],
                workers: vec![WorkerBlocks {
                    instance: InstanceKey::Name("vllm-1".into()),
                    dp: 1,
                    blocks: (0..blocks as u64)
                        .map(|i| SeedBlock {
                            engine: EngineHash(i + 1),
                            parent_engine: None,
                            parent_seq: (i > 0).then_some(SeqHash(i)),
                            local: BlockHash(i * 31),
                            tier: Tier((i % 3) as u8),
                            groups: (i % 4) as u32,
                        })
                        .collect(),
                    groups: SeedGroups {
                        groups: vec![
                            (
                                0,
                                GroupSpec {
                                    rule: GroupRule::SlidingWindow(9),
                                    block_size: 16,
                                },
                            ),
                            (
                                2,
                                GroupSpec {
                                    rule: GroupRule::Mamba,
                                    block_size: 32,
                                },
                            ),
                        ],
                        align: Some(64),
                    },
                }],
            }],
        }
    }

    #[test]
    fn round_trip_and_every_corruption_is_rejected() {
        let s = sample(100);
        let img = encode(&s);
        assert_eq!(decode(&img).unwrap(), s);
        assert!(
            decode(&img[..img.len() - 1])
                .unwrap_err()
                .contains("truncated")
        );
        let mut flipped = img.clone();
        flipped[HEADER + 40] ^= 1;
        assert!(decode(&flipped).unwrap_err().contains("checksum"));
        assert!(decode(b"hello").is_err());
        let mut v2 = img.clone();
        v2[8] = 9;
        assert!(decode(&v2).unwrap_err().contains("version"));
    }

    /// A snapshot image of `version` around `body`.
    fn image(version: u32, body: &[u8]) -> Vec<u8> {
        let mut img = MAGIC.to_vec();
        img.extend_from_slice(&version.to_le_bytes());
        img.extend_from_slice(&(body.len() as u64).to_le_bytes());
        img.extend_from_slice(&xxh3_64(body).to_le_bytes());
        img.extend_from_slice(body);
        img
    }

    /// The start of a body holding one index "m"/"t" of block size 4.
    fn one_index() -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&1u32.to_le_bytes());
        for s in ["m", "t"] {
            body.extend_from_slice(&(s.len() as u32).to_le_bytes());
            body.extend_from_slice(s.as_bytes());
        }
        body.extend_from_slice(&4u32.to_le_bytes());
        body
    }

    #[test]
    fn version_1_images_still_read_with_integer_instances() {
        // Version 1: one listener of instance 9 (dp 0, no replay, no last sequence,
        // no publisher), no worker.
        let mut body = one_index();
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&9u64.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        let ep = "tcp://h:1";
        body.extend_from_slice(&(ep.len() as u32).to_le_bytes());
        body.extend_from_slice(ep.as_bytes());
        body.extend_from_slice(&[0, 0, 0]);
        body.extend_from_slice(&0u32.to_le_bytes());
        let s = decode(&image(1, &body)).unwrap();
        assert_eq!(s.indexes[0].listeners[0].instance, InstanceKey::Id(9));
        assert_eq!(s.indexes[0].listeners[0].endpoint.endpoint, ep);
    }

    #[test]
    fn version_2_images_still_read_without_groups() {
        // No listener; worker 7 (rank 1) with one block: engine hash 5, no parent,
        // device tier, local hash 6.
        let mut body = one_index();
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.push(0);
        body.extend_from_slice(&7u64.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&5u64.to_le_bytes());
        body.push(0);
        body.extend_from_slice(&6u64.to_le_bytes());
        let s = decode(&image(2, &body)).unwrap();
        let w = &s.indexes[0].workers[0];
        assert_eq!((&w.instance, w.dp), (&InstanceKey::Id(7), 1));
        assert_eq!(w.groups, SeedGroups::default());
        assert_eq!(
            w.blocks,
            vec![SeedBlock {
                engine: EngineHash(5),
                parent_engine: None,
                parent_seq: None,
                local: BlockHash(6),
                tier: Tier::DEVICE,
                groups: 0,
            }]
        );
    }

    #[test]
    fn write_is_atomic_and_readable() {
        let dir = std::env::temp_dir().join(format!("kvix-snap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.bin");
        assert!(read(&p).unwrap().is_none());
        write(&p, &encode(&sample(10))).unwrap();
        assert_eq!(read(&p).unwrap().unwrap(), sample(10));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
