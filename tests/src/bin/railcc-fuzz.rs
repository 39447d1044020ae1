//! `railcc-fuzz [INPUTS]`: throws random and mutated inputs at every wire decoder (bootstrap,
//! TCP frames and hellos, RDMA connection data) and checks that none panics and that no
//! input makes one allocate more than `MAX_ALLOC` bytes at once. Prints the count; exits 1
//! on a finding. `RAILCC_FUZZ_INPUTS` or the argument sets the count (default 1,000,000).
//!
//! Hand-written rather than cargo-fuzz: cargo-fuzz needs a nightly toolchain and CI runs
//! stable; proptest's shrinking is not needed at millions of inputs, and a plain loop is ten
//! times faster.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The largest single allocation since the last reset.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: forwards to the system allocator, only recording sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        // SAFETY: forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        // SAFETY: forwarded.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// No decoder may allocate more than this for one input (the wire readers' bound is 64 KB).
const MAX_ALLOC: usize = 1 << 20;

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Valid encodings to mutate, so inputs reach past the first checks.
fn seeds() -> Vec<Vec<u8>> {
    use railcc_core::bootstrap::UniqueId;
    let id: UniqueId = "railcc1:00112233445566778899aabbccddeeff@127.0.0.1:4242"
        .parse()
        .unwrap_or(UniqueId {
            root: std::net::SocketAddr::from(([127, 0, 0, 1], 4242)),
            secret: railcc_core::auth::Secret([7; 16]),
        });
    let mut header = vec![0u8; 80];
    header[..4].copy_from_slice(&0x3146_4352u32.to_le_bytes());
    let mut abort = header.clone();
    abort[76] = 3;
    abort[16..40].copy_from_slice(b"peer closed (rank 3, pee");
    let mut table = vec![2u8, 2, 0, 0, 0];
    table.extend_from_slice(&[4, 127, 0, 0, 1, 0x10, 0x92]);
    vec![
        id.to_bytes().to_vec(),
        id.to_string().into_bytes(),
        header,
        abort,
        table,
        vec![
            1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 3, 32,
        ],
    ]
}

fn main() {
    let inputs: u64 = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("RAILCC_FUZZ_INPUTS").ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let seeds = seeds();
    let mut st = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = Vec::with_capacity(512);
    let (mut panics, mut worst) = (0u64, 0usize);
    std::panic::set_hook(Box::new(|_| {}));
    let t0 = Instant::now();
    for i in 0..inputs {
        buf.clear();
        let r = xorshift(&mut st);
        if r.is_multiple_of(2) {
            // Random bytes, random length.
            let len = (xorshift(&mut st) % 300) as usize;
            while buf.len() < len {
                buf.extend_from_slice(&xorshift(&mut st).to_le_bytes());
            }
            buf.truncate(len);
        } else {
            // A valid encoding with a few bytes changed, cut or extended.
            buf.extend_from_slice(&seeds[(r >> 8) as usize % seeds.len()]);
            for _ in 0..1 + xorshift(&mut st) % 4 {
                if buf.is_empty() {
                    break;
                }
                let at = (xorshift(&mut st) as usize) % buf.len();
                buf[at] = xorshift(&mut st) as u8;
            }
            match xorshift(&mut st) % 4 {
                0 => buf.truncate((xorshift(&mut st) as usize) % (buf.len() + 1)),
                1 => buf.extend_from_slice(&xorshift(&mut st).to_le_bytes()),
                _ => {}
            }
        }
        LARGEST.store(0, Ordering::Relaxed);
        let ok = std::panic::catch_unwind(|| {
            railcc_core::bootstrap::fuzz_decoders(&buf);
            railcc_transport_tcp::fuzz_decoders(&buf);
            railcc_transport_rdma::fuzz_decoders(&buf);
        })
        .is_ok();
        let big = LARGEST.load(Ordering::Relaxed);
        worst = worst.max(big);
        if !ok || big > MAX_ALLOC {
            panics += u64::from(!ok);
            eprintln!(
                "input {i}: {} (largest allocation {big} B): {:02x?}",
                if ok {
                    "allocation past the bound"
                } else {
                    "panic"
                },
                buf
            );
            if panics > 10 || big > MAX_ALLOC {
                std::process::exit(1);
            }
        }
    }
    println!(
        "fuzzed {inputs} inputs in {:.1} s: panics {panics}, largest allocation {worst} B (bound {MAX_ALLOC} B)",
        t0.elapsed().as_secs_f64()
    );
    if panics > 0 {
        std::process::exit(1);
    }
}
