//! One rank of an integration test. The first argument names the scenario; rank and job come
//! from `RAILCC_*` variables set by the test. Prints `ok: ...` and exits 0 on success, or
//! prints the error and exits 1.

use railcc_collectives::plan::CollArgs;
use railcc_collectives::reference::{count_wrong, fill_input};
use railcc_collectives::sim::Mem;
use railcc_collectives::{Bufs, CollKind, Communicator, Config, DataType, P2p, ReduceOp};
use std::process::ExitCode;

const SEED: u64 = 77;

fn main() -> ExitCode {
    // Warnings (a rail given up on, say) on stderr, as railcc's own binary prints them.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RAILCC_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let scenario = std::env::args().nth(1).unwrap_or_default();
    match run(&scenario) {
        Ok(msg) => {
            println!("ok: {msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn comm() -> Result<Communicator, String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    Communicator::from_env(cfg).map_err(|e| e.to_string())
}

fn run(scenario: &str) -> Result<String, String> {
    let c = comm()?;
    // The harness's kill clock starts once every rank has joined (tests/src/lib.rs).
    if let Some(d) = std::env::var_os("RAILCC_TEST_READY_DIR") {
        let marker = std::path::Path::new(&d).join(c.rank().to_string());
        std::fs::write(&marker, b"")
            .map_err(|e| format!("ready marker {}: {e}", marker.display()))?;
    }
    let (r, p) = (c.rank(), c.nranks());
    let e2s = |e: railcc_collectives::Error| e.to_string();
    match scenario {
        "all" => all_collectives(&c),
        "mismatch-count" => {
            let n = if r == 0 { 100 } else { 200 };
            let send = vec![1f32; n];
            let mut recv = vec![0f32; n];
            c.all_reduce(&send, &mut recv, ReduceOp::Sum).map_err(e2s)?;
            Ok("no error".into())
        }
        "mismatch-dtype" => {
            if r == 0 {
                let mut b = vec![1f32; 64];
                c.all_reduce_in_place(&mut b, ReduceOp::Sum).map_err(e2s)?;
            } else {
                let mut b = vec![1i32; 64];
                c.all_reduce_in_place(&mut b, ReduceOp::Sum).map_err(e2s)?;
            }
            Ok("no error".into())
        }
        "bad-root" => {
            let mut b = vec![0u8; 16];
            c.broadcast_in_place(&mut b, p).map_err(e2s)?;
            Ok("no error".into())
        }
        "short-buffer" => {
            let send = vec![1f64; 1000];
            let mut recv = vec![0f64; 999];
            c.all_reduce(&send, &mut recv, ReduceOp::Sum).map_err(e2s)?;
            Ok("no error".into())
        }
        "mismatch-op" => {
            let op = if r == 0 { ReduceOp::Sum } else { ReduceOp::Max };
            let mut b = vec![1f32; 64];
            c.all_reduce_in_place(&mut b, op).map_err(e2s)?;
            Ok("no error".into())
        }
        "mismatch-root" => {
            let mut b = vec![0u8; 256];
            c.broadcast_in_place(&mut b, usize::from(r == 0))
                .map_err(e2s)?;
            Ok("no error".into())
        }
        "mismatch-collective" => {
            // Same bytes on the wire per rank, different collectives.
            if r == 0 {
                let mut b = vec![1f32; 64 * p];
                c.all_reduce_in_place(&mut b, ReduceOp::Sum).map_err(e2s)?;
            } else {
                let send = vec![1f32; 64];
                let mut recv = vec![0f32; 64 * p];
                c.all_gather(&send, &mut recv).map_err(e2s)?;
            }
            Ok("no error".into())
        }
        "misaligned" => {
            let bytes = vec![0u8; 4 * 65];
            let mut out = vec![0u8; 4 * 65];
            let a = CollArgs {
                coll: CollKind::AllReduce,
                nranks: p,
                count: 64,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                root: 0,
            };
            // One byte into an allocation that malloc aligns to 16: misaligned for f32.
            let off = 1 + (4 - bytes.as_ptr() as usize % 4) % 4;
            c.collective(
                a,
                Bufs::OutOfPlace {
                    send: &bytes[off..off + 256],
                    recv: &mut out[..256],
                },
            )
            .map_err(e2s)?;
            Ok("no error".into())
        }
        "count-overflow" => {
            let a = CollArgs {
                coll: CollKind::AllGather,
                nranks: p,
                count: usize::MAX / 3,
                dtype: DataType::F64,
                op: ReduceOp::Sum,
                root: 0,
            };
            let (send, mut recv) = (vec![0u8; 64], vec![0u8; 64]);
            c.collective(
                a,
                Bufs::OutOfPlace {
                    send: &send,
                    recv: &mut recv,
                },
            )
            .map_err(e2s)?;
            Ok("no error".into())
        }
        "send-to-self" => {
            let b = vec![1u32; 16];
            c.send(&b, r).map_err(e2s)?;
            Ok("no error".into())
        }
        "peer-out-of-range" => {
            let mut b = vec![1u32; 16];
            c.recv(&mut b, p + 3).map_err(e2s)?;
            Ok("no error".into())
        }
        "abort-while-blocked" => abort_while_blocked(&c),
        "soak" => soak(&c),
        "registered" => registered(&c),
        "dmabuf-refused" => dmabuf_refused(&c),
        "repeat" => repeat(&c),
        "barrier" => {
            c.barrier().map_err(e2s)?;
            Ok("barrier".into())
        }
        // The last rank arrives 500 ms late: nobody may leave the barrier before it arrived.
        "barrier-late" => {
            c.barrier().map_err(e2s)?; // everyone connected and ready
            let late = c.rank() + 1 == c.nranks();
            if late {
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            let t = std::time::Instant::now();
            c.barrier().map_err(e2s)?;
            let waited = t.elapsed();
            if !late && waited < std::time::Duration::from_millis(400) {
                return Err(format!(
                    "left the barrier after {waited:?}, before the late rank arrived"
                ));
            }
            Ok(format!("barrier: waited {waited:?} for the late rank"))
        }
        _ => Err(format!("unknown scenario '{scenario}'")),
    }
}

/// Resident memory of this process in kB (VmRSS).
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Every collective, dtype and op, checked, over and over for `RAILCC_SOAK_SECS` (default
/// 1800); RSS after the first pass (caches warm) and at the end. Rank 0 decides when to stop
/// and tells the others through a broadcast, so every rank makes the same calls.
fn soak(c: &Communicator) -> Result<String, String> {
    let secs: u64 = std::env::var("RAILCC_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1800);
    let t0 = std::time::Instant::now();
    let (mut passes, mut rss_start) = (0u64, 0u64);
    let mut samples = Vec::new();
    loop {
        all_collectives(c).map_err(|e| format!("pass {passes}: {e}"))?;
        passes += 1;
        if passes == 1 {
            rss_start = rss_kb();
        }
        if passes % 50 == 0 {
            samples.push(rss_kb());
        }
        let mut go = [u8::from(t0.elapsed().as_secs() < secs)];
        c.broadcast_in_place(&mut go, 0)
            .map_err(|e| e.to_string())?;
        if go[0] == 0 {
            break;
        }
    }
    let end = rss_kb();
    Ok(format!(
        "soak: {passes} passes of every collective/dtype/op in {:.0} s, 0 errors; RSS after pass 1 {rss_start} kB, at the end {end} kB ({:+.1}%); every 50 passes: {samples:?}",
        t0.elapsed().as_secs_f64(),
        (end as f64 - rss_start as f64) / rss_start.max(1) as f64 * 100.0
    ))
}

/// Rank 0 blocks receiving from rank 1, which never sends; another thread aborts after 300
/// ms. The receive must return within 250 ms of the abort (README: milliseconds; it takes a
/// few), and later calls must fail.
fn abort_while_blocked(c: &Communicator) -> Result<String, String> {
    if c.rank() != 0 {
        std::thread::sleep(std::time::Duration::from_secs(3));
        return Ok("idle".into());
    }
    let mut b = vec![0u32; 1024];
    let aborted_at = std::sync::Mutex::new(None);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            *aborted_at.lock().map_err(|e| e.to_string())? = Some(std::time::Instant::now());
            c.abort();
            Ok::<(), String>(())
        });
        c.recv(&mut b, 1)
    });
    let returned = std::time::Instant::now();
    let at = aborted_at
        .lock()
        .map_err(|e| e.to_string())?
        .ok_or("the abort thread never ran")?;
    let e = match r {
        Ok(()) => return Err("the receive succeeded after an abort".into()),
        Err(e) => e,
    };
    let took = returned.duration_since(at);
    if took > std::time::Duration::from_millis(250) {
        return Err(format!(
            "the receive returned {took:?} after the abort: {e}"
        ));
    }
    let later = c.barrier().err().map(|e| e.to_string()).unwrap_or_default();
    if !later.contains("aborted") {
        return Err(format!(
            "a call after abort did not fail naming it: '{later}'"
        ));
    }
    let async_err = c.async_error().map(|e| e.to_string()).unwrap_or_default();
    Ok(format!(
        "receive returned {took:?} after the abort with '{e}'; later call: '{later}'; async error: '{async_err}'"
    ))
}

/// All-reduce of `RAILCC_TEST_BYTES` (default 16 MB) `RAILCC_TEST_ITERS` times (default 20),
/// every result checked: for failures injected while it runs (a rail set down).
fn repeat(c: &Communicator) -> Result<String, String> {
    let var = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (n, iters) = (
        var("RAILCC_TEST_BYTES", 16 << 20) / 4,
        var("RAILCC_TEST_ITERS", 20),
    );
    let (r, p) = (c.rank(), c.nranks());
    let send: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2654435761) ^ r as u32)
        .collect();
    let mut recv = vec![0u32; n];
    // The expected sum, computed once: the check between all-reduces is then a comparison,
    // so the gaps between them (which the rail tests' byte counters see) stay short.
    let want: Vec<u32> = (0..n)
        .map(|i| {
            (0..p as u32).fold(0u32, |a, q| {
                a.wrapping_add((i as u32).wrapping_mul(2654435761) ^ q)
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    for it in 0..iters {
        recv.fill(0);
        c.all_reduce(&send, &mut recv, ReduceOp::Sum)
            .map_err(|e| format!("iteration {it}: {e}"))?;
        if recv != want {
            let i = (0..n).find(|&i| recv[i] != want[i]).unwrap_or(0);
            return Err(format!(
                "iteration {it}: element {i} is {} not {}",
                recv[i], want[i]
            ));
        }
    }
    Ok(format!(
        "{iters} all-reduces of {} B checked in {:.1} s",
        n * 4,
        t0.elapsed().as_secs_f64()
    ))
}

/// Collectives on buffers registered with the communicator (and on slices of them) give the
/// reference results; a double deregistration and an empty region are refused by name.
/// GPUDirect registration with a descriptor that is not a dma-buf (this executable): over
/// TCP the communicator refuses it at once; over RDMA the NIC's registration fails at the
/// first transfer and every rank's send/recv returns an error that says so (no hang, no read).
fn dmabuf_refused(c: &Communicator) -> Result<String, String> {
    let n = 1 << 16;
    let send = vec![1u8; n];
    let mut recv = vec![0u8; n];
    let exe = std::fs::File::open("/proc/self/exe").map_err(|e| e.to_string())?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&exe);
    let rdma = c.transport().starts_with("rdma");
    // SAFETY: both vectors outlive the registrations (the communicator drops them at the end).
    let reg = |p: *const u8| unsafe { c.register_dmabuf(p as u64, n, fd, 0) };
    let (a, b) = (reg(send.as_ptr()), reg(recv.as_mut_ptr()));
    if !rdma {
        return match a {
            Err(e) if e.to_string().contains("only over RDMA") => Ok(format!("refused: {e}")),
            other => Err(format!(
                "over {} expected a refusal, got {other:?}",
                c.transport()
            )),
        };
    }
    a.and(b).map_err(|e| e.to_string())?;
    let args = CollArgs {
        coll: CollKind::SendRecv,
        nranks: c.nranks(),
        count: n,
        dtype: DataType::U8,
        op: ReduceOp::Sum,
        root: 0,
    };
    // SAFETY: host vectors stand in for device memory: the transport never reads them because
    // the registration fails first.
    match unsafe { c.collective_device(args, send.as_ptr() as u64, recv.as_mut_ptr() as u64) } {
        Err(e) if e.to_string().contains("dmabuf") => Ok(format!("failed cleanly: {e}")),
        other => Err(format!(
            "expected a dma-buf registration error, got {other:?}"
        )),
    }
}

fn registered(c: &Communicator) -> Result<String, String> {
    let (r, p) = (c.rank(), c.nranks());
    let e2s = |e: railcc_collectives::Error| e.to_string();
    let n = 100_003usize;
    let send: Vec<f32> = (0..n).map(|i| (i % 97) as f32 + r as f32).collect();
    let mut recv = vec![0f32; n + 64];
    // SAFETY: both vectors outlive the registrations, which are removed below before they drop.
    let ids = unsafe {
        [
            c.register(send.as_ptr() as *const u8, n * 4).map_err(e2s)?,
            c.register(recv.as_ptr() as *const u8, recv.len() * 4)
                .map_err(e2s)?,
        ]
    };
    let want = |i: usize| p as f32 * (i % 97) as f32 + (p * (p - 1) / 2) as f32;
    for round in 0..3 {
        // The whole buffer, then a slice starting inside the registered region.
        let off = round * 16;
        c.all_reduce(&send[off..], &mut recv[..n - off], ReduceOp::Sum)
            .map_err(e2s)?;
        if let Some(i) = (0..n - off).find(|&i| recv[i] != want(i + off)) {
            return Err(format!("round {round}: element {i} is {}", recv[i]));
        }
    }
    let mut all = vec![0f32; n * p];
    c.all_gather(&send, &mut all).map_err(e2s)?;
    // Every element of every rank's block (send[i] = i % 97 + rank).
    if let Some(k) = (0..n * p).find(|&k| all[k] != (k % n % 97) as f32 + (k / n) as f32) {
        return Err(format!(
            "all_gather: element {} of rank {}'s block is {}",
            k % n,
            k / n,
            all[k]
        ));
    }
    for id in ids {
        c.deregister(id).map_err(e2s)?;
    }
    let again = c.deregister(ids[0]).err().map(e2s).unwrap_or_default();
    if !again.contains("not registered") {
        return Err(format!(
            "second deregister: expected 'not registered', got '{again}'"
        ));
    }
    // SAFETY: an empty region registers nothing.
    let empty = unsafe { c.register(send.as_ptr() as *const u8, 0) }
        .err()
        .map(e2s)
        .unwrap_or_default();
    if !empty.contains("not a valid region") {
        return Err(format!("empty region: expected a refusal, got '{empty}'"));
    }
    // Unregistered buffers still work after the regions are gone.
    c.all_reduce(&send, &mut recv[..n], ReduceOp::Sum)
        .map_err(e2s)?;
    if let Some(i) = (0..n).find(|&i| recv[i] != want(i)) {
        return Err(format!("after deregister: element {i} is {}", recv[i]));
    }
    Ok(format!("registered buffers on {p} ranks"))
}

/// Every collective, dtype and op, in place and out of place, at awkward counts, each checked
/// against the reference; then grouped point-to-point as an all-to-all.
fn all_collectives(c: &Communicator) -> Result<String, String> {
    let (r, p) = (c.rank(), c.nranks());
    let colls = [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllToAll,
        CollKind::SendRecv,
    ];
    let mut checks = 0usize;
    for coll in colls {
        let reduces = matches!(
            coll,
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
        );
        for dt in DataType::ALL {
            let ops: &[ReduceOp] = if reduces {
                &ReduceOp::ALL
            } else {
                &[ReduceOp::Sum]
            };
            for &op in ops {
                let mut counts = vec![0usize, 1, 7, 1000];
                if matches!(
                    (dt, op),
                    (DataType::F32, ReduceOp::Sum)
                        | (DataType::Bf16, ReduceOp::Avg)
                        | (DataType::I64, ReduceOp::Max)
                ) {
                    counts.push(300_007);
                }
                for count in counts {
                    for in_place in [false, true] {
                        let a = CollArgs {
                            coll,
                            nranks: p,
                            count,
                            dtype: dt,
                            op,
                            root: p - 1,
                        };
                        check_one(c, &a, in_place).map_err(|e| {
                            format!("{coll:?} {dt} {op} count {count} in_place {in_place}: {e}")
                        })?;
                        checks += 1;
                    }
                }
            }
        }
    }
    // All-to-all written as a group of sends and receives, including a send to self.
    let n = 513;
    let send: Vec<u32> = (0..p * n).map(|i| (r * 1_000_000 + i) as u32).collect();
    let mut recv = vec![0u32; p * n];
    {
        let mut chunks: Vec<&mut [u32]> = recv.chunks_mut(n).collect();
        let mut ops: Vec<P2p<u32>> = Vec::new();
        for (j, dst) in chunks.iter_mut().enumerate() {
            ops.push(P2p::Send {
                peer: j,
                buf: &send[j * n..(j + 1) * n],
            });
            ops.push(P2p::Recv { peer: j, buf: dst });
        }
        c.group(&mut ops).map_err(|e| e.to_string())?;
    }
    for j in 0..p {
        for i in 0..n {
            let want = (j * 1_000_000 + r * n + i) as u32;
            if recv[j * n + i] != want {
                return Err(format!(
                    "group all-to-all: element {i} from rank {j} is {} not {want}",
                    recv[j * n + i]
                ));
            }
        }
    }
    c.barrier().map_err(|e| e.to_string())?;
    // Which algorithm the large all-reduces ran (tests that force one check it took effect).
    let big = CollArgs {
        coll: CollKind::AllReduce,
        nranks: p,
        count: 300_007,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
    };
    Ok(format!(
        "{checks} collective checks and a grouped all-to-all on {p} ranks; all_reduce of 300007 float by {}",
        c.algo_for(&big).name()
    ))
}

fn check_one(c: &Communicator, a: &CollArgs, in_place: bool) -> Result<(), String> {
    let es = a.dtype.size();
    let r = c.rank();
    let input = fill_input(a, r, SEED);
    let recv_bytes = a.recv_elems() * es;
    let guard = 32;
    let body = if in_place {
        a.in_place_backing(r, &input, &vec![0x77; recv_bytes])
    } else {
        vec![0x77; recv_bytes]
    };
    let mut recv = Mem::zeroed(body.len() + guard);
    let len = recv.bytes().len();
    recv.bytes_mut().fill(0x77);
    recv.bytes_mut()[..body.len()].copy_from_slice(&body);
    let send = Mem::from_bytes(&input);
    {
        let body = &mut recv.bytes_mut()[..len - guard];
        let bufs = if in_place {
            Bufs::InPlace(body)
        } else {
            Bufs::OutOfPlace {
                send: send.bytes(),
                recv: body,
            }
        };
        c.collective(*a, bufs).map_err(|e| e.to_string())?;
    }
    if recv.bytes()[len - guard..].iter().any(|b| *b != 0x77) {
        return Err("wrote past the end of the receive buffer".into());
    }
    let out = &recv.bytes()[a.recv_range(r, in_place)];
    let wrong = count_wrong(a, r, out, SEED);
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements"));
    }
    // A rooted reduce leaves the other ranks' receive memory as it was.
    let prior = &body[a.recv_range(r, in_place)];
    if a.coll == CollKind::Reduce && r != a.root && out != prior {
        return Err("reduce changed a non-root rank's receive buffer".into());
    }
    if !in_place && send.bytes() != input.as_slice() {
        return Err("the send buffer was modified".into());
    }
    Ok(())
}
