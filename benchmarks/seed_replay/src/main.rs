//! The seed's KvCache (paged mode) driven by a replay trace: the Rust side of
//! scripts/bench-seed-replay. The C++ side, pagedkv_bench_replay, reads the same trace through
//! pagedkv's KvCache and SeedKvCache; the trace format, the K/V values and the checksum are
//! defined in benchmarks/replay_trace.hpp, and this file must compute them the same way.
//!
//! Usage: seed_replay TRACE
//! Prints one line: `replay impl=rust model=... wall_ms=... cpu_ms=... checksum=0x...` plus the
//! wall time per kind of op. Only the cache calls are timed; generating K/V inputs and summing
//! what was read are not.
#![allow(dead_code)]

mod kv_cache;
mod radix_tree;

use half::f16;
use kv_cache::{KvCache, KvCacheConfig, KvCacheMode, KvEvictionPolicy};
use std::collections::HashMap;
use std::time::Instant;

const GOLD: u64 = 0x9E37_79B9_7F4A_7C15;
const CHAIN_START: u64 = 0x5EED;
const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x100_0000_01b3;

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The chain value of position `pos` holding `token`, after `prev` (CHAIN_START before pos 0):
/// equal for equal token prefixes, so a prefix hit reads the bytes a recompute would write.
fn chain_next(prev: u64, token: u64, pos: u64) -> u64 {
    mix64(prev ^ token.wrapping_mul(GOLD) ^ (pos << 1))
}

/// Keys (kv 0) or values (kv 1) of one token in one layer, [heads, head_dim] fp16 bits.
fn fill_row(out: &mut [f16], chain: u64, layer: usize, heads: usize, dim: usize, kv: u64) {
    for h in 0..heads {
        let s = mix64(chain ^ ((layer as u64) << 40) ^ ((h as u64) << 24) ^ (kv + 1));
        for d in 0..dim {
            let bits = (s.wrapping_add((d as u64).wrapping_mul(GOLD)) >> 48) as u16 & 0xBBFF;
            out[h * dim + d] = f16::from_bits(bits);
        }
    }
}

fn fnv(acc: u64, w: u64) -> u64 {
    (acc ^ w).wrapping_mul(FNV_PRIME)
}

fn fnv_halves(mut acc: u64, data: &[f16]) -> u64 {
    for w in data.chunks_exact(4) {
        let word = w[0].to_bits() as u64
            | (w[1].to_bits() as u64) << 16
            | (w[2].to_bits() as u64) << 32
            | (w[3].to_bits() as u64) << 48;
        acc = fnv(acc, word);
    }
    acc
}

fn cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

/// Page faults so far (getrusage), as the C++ side counts them.
fn page_faults() -> i64 {
    #[repr(C)]
    struct Rusage {
        utime: [i64; 2],
        stime: [i64; 2],
        longs: [i64; 14], // ru_maxrss .. ru_nivcsw; ru_minflt and ru_majflt are 4 and 5
    }
    extern "C" {
        fn getrusage(who: i32, usage: *mut Rusage) -> i32;
    }
    let mut u = Rusage {
        utime: [0; 2],
        stime: [0; 2],
        longs: [0; 14],
    };
    unsafe { getrusage(0, &mut u) }; // RUSAGE_SELF
    u.longs[4] + u.longs[5]
}

/// Wall and CPU time of the timed part, by kind of op.
#[derive(Default)]
struct Timer {
    on: bool,
    wall: [f64; 5],
    cpu: u64,
}
const KINDS: [&str; 5] = ["admit", "decode", "read", "rollback", "finish"];

impl Timer {
    fn time<R>(&mut self, kind: usize, f: impl FnOnce() -> R) -> R {
        if !self.on {
            return f();
        }
        let c0 = cpu_ns();
        let t0 = Instant::now();
        let r = f();
        self.wall[kind] += t0.elapsed().as_secs_f64() * 1e3;
        self.cpu += cpu_ns() - c0;
        r
    }
}

struct Seq {
    tokens: Vec<u64>,
    chain: Vec<u64>,
}

impl Seq {
    fn push(&mut self, token: u64) {
        let prev = self.chain.last().copied().unwrap_or(CHAIN_START);
        self.chain
            .push(chain_next(prev, token, self.tokens.len() as u64));
        self.tokens.push(token);
    }
}

fn main() {
    let path = std::env::args().nth(1).expect("usage: seed_replay TRACE");
    let text = std::fs::read_to_string(&path).expect("cannot read the trace");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("pagedkv-replay-trace 1"),
        "not a replay trace"
    );
    let model: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(model[0], "model");
    let name = model[1].to_string();
    let num: Vec<usize> = model[2..7].iter().map(|s| s.parse().unwrap()).collect();
    let (layers, heads, dim, block_size, total_blocks) = (num[0], num[1], num[2], num[3], num[4]);
    let row = heads * dim;

    let config = KvCacheConfig {
        mode: KvCacheMode::Paged,
        block_size,
        total_blocks,
        eviction_policy: KvEvictionPolicy::LruInactive,
        ..Default::default()
    };
    let mut cache = KvCache::new_with_config(layers, heads, 1 << 20, dim, config);
    let mut seqs: HashMap<u64, Seq> = HashMap::new();
    let mut timer = Timer::default();
    let mut checksum = FNV_START;
    let mut faults = 0i64;
    let (mut reads, mut read_bytes, mut written_bytes) = (0u64, 0u64, 0u64);
    let mut kin: Vec<f16> = Vec::new();
    let mut vin: Vec<f16> = Vec::new();

    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let num = |i: usize| -> u64 { f[i].parse().unwrap() };
        match f[0] {
            "T" => {
                timer.on = true;
                faults = -page_faults();
            }
            "A" => {
                let id = num(1);
                let n = num(2) as usize;
                let prompt: Vec<u32> = (0..n).map(|i| num(3 + i) as u32).collect();
                let mut s = Seq {
                    tokens: Vec::new(),
                    chain: Vec::new(),
                };
                for &t in &prompt {
                    s.push(t as u64);
                }
                let m = timer
                    .time(0, || cache.allocate_sequence(id, &prompt))
                    .expect("admit");
                // Layer-major input, [layer][pos - m][heads * dim], as a prefill produces it.
                let rows = n - m;
                kin.resize(layers * rows * row, f16::ZERO);
                vin.resize(layers * rows * row, f16::ZERO);
                for l in 0..layers {
                    for p in m..n {
                        let at = (l * rows + p - m) * row;
                        fill_row(&mut kin[at..at + row], s.chain[p], l, heads, dim, 0);
                        fill_row(&mut vin[at..at + row], s.chain[p], l, heads, dim, 1);
                    }
                }
                let (kin, vin) = (&kin, &vin);
                timer.time(0, || {
                    for l in 0..layers {
                        for p in m..n {
                            let at = (l * rows + p - m) * row;
                            cache
                                .append_token(
                                    id,
                                    l,
                                    p,
                                    &kin[at..at + row],
                                    &vin[at..at + row],
                                    Some(s.tokens[p]),
                                )
                                .expect("prefill");
                        }
                    }
                    cache.advance_sequence_by(id, rows);
                });
                if timer.on {
                    written_bytes += (2 * layers * rows * row * 2) as u64;
                }
                seqs.insert(id, s);
            }
            "D" => {
                let b = num(1) as usize;
                let ids: Vec<u64> = (0..b).map(|i| num(2 + 2 * i)).collect();
                let mut pos = Vec::with_capacity(b);
                for i in 0..b {
                    let s = seqs.get_mut(&ids[i]).unwrap();
                    pos.push(s.tokens.len());
                    s.push(num(3 + 2 * i));
                }
                kin.resize(layers * b * row, f16::ZERO);
                vin.resize(layers * b * row, f16::ZERO);
                for l in 0..layers {
                    for i in 0..b {
                        let c = seqs[&ids[i]].chain[pos[i]];
                        let at = (l * b + i) * row;
                        fill_row(&mut kin[at..at + row], c, l, heads, dim, 0);
                        fill_row(&mut vin[at..at + row], c, l, heads, dim, 1);
                    }
                }
                let toks: Vec<u64> = ids
                    .iter()
                    .zip(&pos)
                    .map(|(id, &p)| seqs[id].tokens[p])
                    .collect();
                let (kin, vin) = (&kin, &vin);
                timer.time(1, || {
                    cache.set_active_sequences(&ids);
                    for l in 0..layers {
                        for i in 0..b {
                            let at = (l * b + i) * row;
                            cache
                                .append_token(
                                    ids[i],
                                    l,
                                    pos[i],
                                    &kin[at..at + row],
                                    &vin[at..at + row],
                                    Some(toks[i]),
                                )
                                .expect("decode");
                        }
                    }
                    for &id in &ids {
                        cache.advance_sequence(id);
                    }
                });
                if timer.on {
                    written_bytes += (2 * layers * b * row * 2) as u64;
                }
            }
            "P" => {
                let (id, layer) = (num(1), num(2) as usize);
                let view = timer
                    .time(2, || cache.get_packed_layer(id, layer))
                    .expect("read");
                let len = seqs[&id].tokens.len();
                assert_eq!(view.length, len, "sequence {id}: packed length");
                assert_eq!(view.key.len(), heads * len * dim);
                checksum = fnv(fnv(fnv(checksum, id), layer as u64), len as u64);
                checksum = fnv_halves(checksum, &view.key);
                checksum = fnv_halves(checksum, &view.value);
                reads += 1;
                read_bytes += (2 * view.key.len() * 2) as u64;
            }
            "B" => {
                let (id, len) = (num(1), num(2) as usize);
                timer.time(3, || cache.rollback_sequence(id, len));
                let s = seqs.get_mut(&id).unwrap();
                s.tokens.truncate(len);
                s.chain.truncate(len);
            }
            "F" => {
                let id = num(1);
                timer.time(4, || cache.remove_sequence(id));
                seqs.remove(&id);
            }
            other => panic!("unknown op {other}"),
        }
    }

    faults += page_faults();
    let wall: f64 = timer.wall.iter().sum();
    let by_kind: Vec<String> = KINDS
        .iter()
        .zip(&timer.wall)
        .map(|(k, w)| format!("{k}_ms={w:.1}"))
        .collect();
    println!(
        "replay impl=rust model={name} wall_ms={wall:.1} cpu_ms={:.1} {} reads={reads} read_mib={:.0} written_mib={:.0} faults={faults} checksum=0x{checksum:016x}",
        timer.cpu as f64 / 1e6,
        by_kind.join(" "),
        read_bytes as f64 / 1048576.0,
        written_bytes as f64 / 1048576.0
    );
}
