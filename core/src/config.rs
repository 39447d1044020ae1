//! The one place for configuration. Every field has a `RAILCC_*` variable, a default and a line
//! of documentation; `railcc config` prints the table. Nothing else in railcc reads the process
//! environment: NCCL's variables come through [`crate::nccl_env`], launchers' variables are
//! interpreted by [`crate::launch`] over [`process_env`], and the few other values read from the
//! environment (the kernel cache's default folder, the local rank) have accessors here.

use crate::error::{Error, Result};
use crate::launch::{self, LaunchInfo};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Which collective algorithm to use; `Auto` lets the size-based selector decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgoChoice {
    Auto,
    Ring,
    Direct,
    RecursiveDoubling,
    Tree,
    /// Hierarchical: inside each host, then across hosts one ring per local rank, then inside
    /// each host again (every host must hold the same number of ranks; else the ring).
    Hier,
}

impl std::str::FromStr for AlgoChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(AlgoChoice::Auto),
            "ring" => Ok(AlgoChoice::Ring),
            "direct" | "oneshot" | "one-shot" => Ok(AlgoChoice::Direct),
            "rdouble" | "recursive_doubling" | "recursive-doubling" => {
                Ok(AlgoChoice::RecursiveDoubling)
            }
            "tree" | "dtree" => Ok(AlgoChoice::Tree),
            "hier" | "hierarchical" => Ok(AlgoChoice::Hier),
            _ => Err(format!(
                "unknown algorithm '{s}' (expected auto, ring, direct, rdouble, tree, hier)"
            )),
        }
    }
}

impl std::fmt::Display for AlgoChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AlgoChoice::Auto => "auto",
            AlgoChoice::Ring => "ring",
            AlgoChoice::Direct => "direct",
            AlgoChoice::RecursiveDoubling => "rdouble",
            AlgoChoice::Tree => "tree",
            AlgoChoice::Hier => "hier",
        })
    }
}

/// How much libnccl prints on stderr: NCCL_DEBUG's levels, in NCCL's order. Each level prints
/// what the ones below it print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    /// Nothing (NCCL_DEBUG unset, or a value NCCL does not know).
    None,
    /// NCCL prints its version; libnccl prints nothing yet.
    Version,
    /// Each error a call returns (`NCCL WARN ...`).
    Warn,
    /// Also each communicator's path when it is made (`NCCL INFO ...`).
    Info,
    /// As Info: railcc has no trace messages.
    Trace,
}

impl DebugLevel {
    /// Whether errors are printed (WARN and above).
    pub fn warns(self) -> bool {
        self >= DebugLevel::Warn
    }

    /// Whether communicators' paths are printed (INFO and above).
    pub fn informs(self) -> bool {
        self >= DebugLevel::Info
    }
}

impl std::str::FromStr for DebugLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "none" => Ok(DebugLevel::None),
            "version" => Ok(DebugLevel::Version),
            "warn" => Ok(DebugLevel::Warn),
            "info" => Ok(DebugLevel::Info),
            "trace" => Ok(DebugLevel::Trace),
            _ => Err(format!(
                "unknown level '{s}' (expected none, version, warn, info or trace)"
            )),
        }
    }
}

impl std::fmt::Display for DebugLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DebugLevel::None => "none",
            DebugLevel::Version => "version",
            DebugLevel::Warn => "warn",
            DebugLevel::Info => "info",
            DebugLevel::Trace => "trace",
        })
    }
}

macro_rules! config {
    ($( $(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr, $env:literal; )*) => {
        /// Effective configuration. Build with [`Config::default`] and set fields in code, or
        /// with [`Config::from_env`] to apply `RAILCC_*` variables over the defaults.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $( $field: $default, )* }
            }
        }

        impl Config {
            /// Applies variables from `lookup` (normally the process environment) over `self`.
            pub fn apply_vars(mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
                $(
                    if let Some(v) = lookup($env) {
                        self.$field = parse_value::<$ty>(&v).map_err(|e| {
                            Error::invalid(format!("{}={v:?}: {e}", $env))
                        })?;
                    }
                )*
                Ok(self)
            }

            /// Rows of (variable, value, source, documentation) for `railcc config`.
            pub fn describe(&self, lookup: impl Fn(&str) -> Option<String>) -> Vec<ConfigRow> {
                vec![$(
                    ConfigRow {
                        var: $env,
                        value: show_value(&self.$field),
                        from_env: lookup($env).is_some(),
                        doc: concat!($($doc),*).trim(),
                    },
                )*]
            }
        }
    };
}

config! {
    /// Deadline for any wait with no progress (bootstrap, connect, data), in milliseconds
    /// (libnccl: none unless set, as NCCL).
    timeout_ms: u64 = 60_000, "RAILCC_TIMEOUT_MS";
    /// Interfaces for sockets: a prefix list like NCCL's (`eth`, `^docker`, `=lo`). Empty: the
    /// interface that reaches the bootstrap root, loopback for a local job.
    socket_ifname: String = String::new(), "RAILCC_SOCKET_IFNAME";
    /// TCP streams per peer connection; large messages are striped over them.
    nsocks_per_peer: usize = 2, "RAILCC_NSOCKS_PER_PEER";
    /// A message is striped over several streams only when each part gets at least this many bytes.
    stripe_min_bytes: usize = 256 * 1024, "RAILCC_STRIPE_MIN_BYTES";
    /// Socket send and receive buffer size in bytes (0 keeps the kernel's autotuning).
    socket_buffer_bytes: usize = 4 * 1024 * 1024, "RAILCC_SOCKET_BUFFER_BYTES";
    /// Pipelining chunk size in bytes for ring and chain algorithms.
    chunk_bytes: usize = 512 * 1024, "RAILCC_CHUNK_BYTES";
    /// Chunks a rank may have received but not yet consumed, per peer (bounds scratch memory).
    max_inflight_chunks: usize = 8, "RAILCC_MAX_INFLIGHT_CHUNKS";
    /// All-reduce algorithm: auto, ring, direct (one-shot), rdouble (recursive doubling),
    /// tree (double binary tree) or hier (inside hosts, then one ring per local rank across
    /// hosts; needs the same rank count on every host).
    algo: AlgoChoice = AlgoChoice::Auto, "RAILCC_ALGO";
    // The cost model's links (issue 6), per rank, for one rank with a core to itself (ranks
    // sharing cores are scaled: collectives::cost). Defaults: fitted on loopback TCP
    // (bench/results/README.md, "Cost model"), and 10 GbE between hosts.
    /// The cost model's latency between ranks of one host, microseconds.
    local_lat_us: u64 = 10, "RAILCC_LOCAL_LAT_US";
    /// The cost model's bandwidth per rank between ranks of one host, MB/s.
    local_mbytes_per_s: u64 = 3600, "RAILCC_LOCAL_MBYTES_PER_S";
    /// The cost model's latency between hosts, microseconds.
    net_lat_us: u64 = 25, "RAILCC_NET_LAT_US";
    /// The cost model's bandwidth per rank between hosts, MB/s.
    net_mbytes_per_s: u64 = 1200, "RAILCC_NET_MBYTES_PER_S";
    /// The cost model's host reduction rate per rank, MB/s.
    reduce_mbytes_per_s: u64 = 7500, "RAILCC_REDUCE_MBYTES_PER_S";
    /// Microseconds a waiting rank busy-polls before it sleeps in poll(2). 0 sleeps at once;
    /// forced to 0 when more ranks share a host than it has cores.
    spin_us: u64 = 200, "RAILCC_SPIN_US";
    /// Thread blocks per GPU for GPU collectives; 0 means one per SM. Clamped to what the GPU
    /// can keep resident at once (the kernels wait for each other).
    gpu_max_blocks: usize = 0, "RAILCC_GPU_MAX_BLOCKS";
    /// Thread blocks per GPU a GPU collective takes at least (NCCL's minCTAs), up to the
    /// most; 0: as many as the work needs.
    gpu_min_blocks: usize = 0, "RAILCC_GPU_MIN_BLOCKS";
    /// Folder for the compiled GPU kernels (PTX); empty: $XDG_CACHE_HOME/railcc or
    /// ~/.cache/railcc; "off": compile in every process.
    cache_dir: String = String::new(), "RAILCC_CACHE_DIR";
    /// GPU all-reduces up to this many bytes per rank use the low-latency kernel (one exchange,
    /// no barriers); larger ones the bulk kernel. 0 disables it; at most 524288. 256 KiB: with
    /// its calls launched without a meeting it read 7.9-12.8 us at 256 KiB against the bulk
    /// kernel's 13.1-24.0 (2 and 4 H200s, nineteenth session; it was 64 KiB).
    gpu_ll_max_bytes: usize = 262144, "RAILCC_GPU_LL_MAX_BYTES";
    /// 1: the bulk GPU kernel loads every input's data of two 16-byte vectors at once before
    /// reducing (more reads in flight: on 4 x H100 at 24 blocks 0.79x -> 0.89x NCCL's busbw at
    /// 1 GB, no loss at 132); 0: one input at a time; 2: as 1, and on compute capability 9.0
    /// or later the inputs of aligned reductions fetched by bulk async copies into shared
    /// memory (`railcc_cuda::tma`; measured no faster); 3: as 2, and their outputs sent by
    /// bulk async copies too, copies (all_gather, broadcast) as well (not yet run on a GPU).
    gpu_wide_loads: usize = 1, "RAILCC_GPU_WIDE_LOADS";
    /// GPU all-reduces of at least this many bytes per rank (above the low-latency kernel;
    /// 0: never) take the push kernel (`railcc_cuda::push`): every GPU writes its input's
    /// pieces into the owners' scratch, each owner reduces its segment locally and writes it
    /// into every output, so NVLink carries only writes, where the bulk kernel reads the
    /// peers' inputs. Every rank takes the least value of the communicator. 4 x H100, one
    /// block per SM, nccl-tests -g 4: 0.93x -> 1.01x NCCL's busbw at 256 MB, 0.96x -> 1.05x at
    /// 16 MB, equal at 4 MB (bench/results, 2026-11-27).
    gpu_ar_push_bytes: usize = 16 << 20, "RAILCC_GPU_AR_PUSH_BYTES";
    /// The push kernel only where a communicator may use at least this many blocks per GPU
    /// (at NCCL's 24 its 64 KiB tiles read 0.85-0.96x NCCL, the bulk kernel 0.89-1.05x). Every
    /// rank takes the communicator's least. For measuring the push kernel at few blocks.
    gpu_push_min_blocks: usize = 128, "RAILCC_GPU_PUSH_MIN_BLOCKS";
    /// The push kernel's largest tile, bytes (a multiple of 4096; what the 16 MiB scratch
    /// holds bounds it too: 84 KiB on 4 GPUs at 24 blocks). Every rank takes the
    /// communicator's least. For measuring fewer, larger tiles at few blocks.
    gpu_push_slot_bytes: usize = 32 << 10, "RAILCC_GPU_PUSH_SLOT_BYTES";
    /// All-gathers of at least this many bytes per rank on one host move on the copy engines
    /// (`railcc_cuda::copies`: one copy per peer, one thread block for the barriers; 0:
    /// never). 4 x H100, nccl-tests all_gather against NCCL at 24 channels (2026-11-27): at
    /// 256 MB-1 GB 1.14-1.20x, where the kernel read 0.93-1.00x at 24 blocks and 1.05-1.10x at
    /// one per SM; at 64 MB (16 MiB a rank) 1.08-1.17x, the kernel 1.04-1.14x; below, slower
    /// than the kernel. 2 GPUs: 1.29-1.44x at 256 MB-1 GB. Every rank takes the least.
    gpu_ag_copy_bytes: usize = 16 << 20, "RAILCC_GPU_AG_COPY_BYTES";
    /// All-reduces of at least this many bytes per rank on one host of 4 GPUs or more, where
    /// the push kernel may not run (fewer than `RAILCC_GPU_PUSH_MIN_BLOCKS` blocks, e.g.
    /// maxCTAs 24): each GPU's segment reduced by the bulk kernel into its own output only,
    /// then spread to the peers' on the copy engines (`railcc_cuda::copies::spread`; 0:
    /// never). 4 x H100 at NCCL's 24 channels (2026-11-27): 0.99-1.01x NCCL at 256 MB-1 GB
    /// where the bulk kernel alone read 0.88-0.93x, 0.97-0.99x at 64 MB (0.97x); below,
    /// slower. Every rank takes the communicator's least.
    gpu_ar_copy_bytes: usize = 16 << 20, "RAILCC_GPU_AR_COPY_BYTES";
    /// 1: a group's GPU sends and receives go as batch kernels (every receive of a stream
    /// pulled from all peers at once by thread blocks; 4 x H100 all-to-all at 256 MB: 0.43x ->
    /// 0.9x NCCL); 2: the same, a batch of up to 16 receives in one launch instead of four
    /// (4 x H100, 24 blocks, `-g 4`: 1 MB all-to-all 0.56x -> 1.32x NCCL, sendrecv 0.47x ->
    /// 1.64x; never slower than 1); 3: as 2, and one process per GPU marks each peer's staged
    /// sends as soon as they are in, pulling meanwhile, where no receive overlaps a staged
    /// source (to try); 0: a copy-engine copy per message.
    gpu_p2p_batch: usize = 2, "RAILCC_GPU_P2P_BATCH";
    /// One process per GPU: a send up to this many bytes (at most 2 MiB, the slots' size) is
    /// first copied into a staging slot, so it completes before its receiver copies it (as
    /// NCCL's sends that fit its buffers); 0: every send waits for its receiver.
    gpu_p2p_stage_bytes: usize = 2 << 20, "RAILCC_GPU_P2P_STAGE_BYTES";
    /// The smallest piece a thread block of a GPU send/recv batch copies at a time (a power of
    /// two from 4096 to 262144; pieces grow to about four a block). Smaller pieces put more
    /// blocks on a small batch.
    gpu_p2p_min_chunk: usize = 65536, "RAILCC_GPU_P2P_MIN_CHUNK";
    /// One process per GPU: sends and receives of up to this many bytes (at most 1 MiB) go
    /// the low-latency way (`railcc_cuda::p2p_ll`: the data pushed into the receiver's inbox
    /// with its flags, one launch, no host exchange); 0: never. 4 x H100, `mpirun -np 4`:
    /// all-to-all 1 KB-1 MB 0.62-0.87x -> 1.17-1.29x NCCL's busbw, send/recv 1 MB 0.93x ->
    /// 1.29x; the host's time per 1 MB all-to-all 12 -> 5-7 us. Every rank takes the
    /// communicator's least.
    gpu_p2p_ll_bytes: usize = 1 << 20, "RAILCC_GPU_P2P_LL_BYTES";
    /// Network transport: auto (RDMA when every rank has an active RDMA port, else TCP), tcp,
    /// or rdma (an error when a rank has none).
    transport: String = "auto".to_string(), "RAILCC_TRANSPORT";
    /// Interfaces a TCP connection stripes over: empty (the job's one interface), `auto` (the
    /// NICs nearest this rank), or `eth0:800,eth1:400` (names, optional bandwidth in Mb/s to
    /// split by). Rail i of one rank meets rail i of another.
    rails: String = String::new(), "RAILCC_RAILS";
    /// Over several rails: 1 carries a transfer on over the remaining rails when one is lost
    /// (its interface goes down or its sockets fail), 0 fails the call instead.
    rail_failover: u8 = 1, "RAILCC_RAIL_FAILOVER";
    /// Over several rails: a rail whose sockets leave data unacknowledged this long is lost.
    rail_timeout_ms: u64 = 3000, "RAILCC_RAIL_TIMEOUT_MS";
    /// Which host this rank is on, for ranks that share a machine (NCCL_HOSTID); empty: the
    /// hostname and the kernel's boot id, as NCCL. Network namespaces on one machine set it to
    /// act as separate nodes.
    hostid: String = String::new(), "RAILCC_HOSTID";
    /// A topology file (JSON, as `railcc topo --json` prints) used instead of discovery.
    topo_file: String = String::new(), "RAILCC_TOPO_FILE";
    /// RDMA ports to use, NCCL_IB_HCA's syntax: comma-separated `name[:port]`, names as
    /// prefixes (`=` in front: exact), `^` in front to exclude; a list that selects no active
    /// port is an error. Empty: every active port. Several ports: local rank i takes the i-th.
    ib_hca: String = String::new(), "RAILCC_IB_HCA";
    /// RDMA ports (rails) each rank stripes its connections over, from the active ports that
    /// RAILCC_IB_HCA matches; 0: an equal share, the ports over this host's ranks (one rank
    /// per host uses them all, as NCCL does). A rank with a GPU the topology places takes the
    /// ports nearest it; else local rank l takes ports l*n .. l*n+n-1 (rail i meets rail i on
    /// the peer). At most 4. Pieces are sized by each rail's measured rate; with
    /// RAILCC_RAIL_FAILOVER=1 a rail that goes down hands its pieces to the others.
    ib_rails: usize = 0, "RAILCC_IB_RAILS";
    /// RDMA acknowledgement timeout exponent: a queue pair resends after 4.096 µs × 2^this
    /// (18: about 1.1 s; NCCL_IB_TIMEOUT's meaning). 1 to 31.
    ib_timeout: u8 = 18, "RAILCC_IB_TIMEOUT";
    /// RDMA resends before a queue pair gives up (NCCL_IB_RETRY_CNT). 0 to 7.
    ib_retry_cnt: u8 = 7, "RAILCC_IB_RETRY_CNT";
    /// RDMA traffic class (NCCL_IB_TC): the GRH's traffic class on RoCE, for QoS. 0 to 255.
    ib_tc: u8 = 0, "RAILCC_IB_TC";
    /// RDMA service level (NCCL_IB_SL), 0 to 15.
    ib_sl: u8 = 0, "RAILCC_IB_SL";
    /// RoCE GID index (NCCL_IB_GID_INDEX); -1: the first RoCE v2 entry with an IPv4-mapped
    /// address, else the first RoCE v2 entry.
    ib_gid_index: i32 = -1, "RAILCC_IB_GID_INDEX";
    /// RDMA messages up to this many bytes are copied through registered staging slots instead
    /// of registering the caller's buffer per transfer. 0 turns staging off; at most 16384.
    ib_eager_bytes: usize = 16384, "RAILCC_IB_EAGER_BYTES";
    /// Reserved for GPUDirect RDMA (the NIC reading GPU memory through dma-buf): no GPU path
    /// takes it yet, every GPU transfer across hosts is staged through pinned host memory.
    /// Accepted values 0 and 1.
    gpu_direct: u8 = 0, "RAILCC_GPU_DIRECT";
    /// Where GPU data goes between ranks of different processes: auto (peer access over
    /// NVLink/PCIe between ranks of one host, the network between hosts; with several GPUs on
    /// every host, collectives as a hierarchy of both) or net (the network between every pair,
    /// no hierarchy, for tests and comparisons).
    gpu_path: String = "auto".to_string(), "RAILCC_GPU_PATH";
    /// On several hosts of several GPUs each, an all_reduce or broadcast of at most this many
    /// bytes runs as one step inside the host and one across hosts over the whole buffer
    /// instead of three steps over 1/L parts (latency over bandwidth). Rank 0's value holds
    /// for every rank.
    gpu_hier_small_bytes: usize = 32 * 1024, "RAILCC_GPU_HIER_SMALL_BYTES";
    /// On several hosts of several GPUs each, an all_reduce of fewer bytes than this skips the
    /// hierarchy: the flat network engine runs it between every pair of ranks, in one host
    /// step and one launch instead of the hierarchy's local call (with its rendezvous between
    /// the host's processes) and cross call (bench/results/issue31/small-call-design.md, D3).
    /// 0: never. Only where the job has at most 8 ranks (`hier::plan::FLAT_MAX_RANKS`). Rank 0's
    /// value holds for every rank. Through PyTorch on 2 hosts x 2 GPUs, 8 B and 4 KB took
    /// 35-44 us a call this way against 48-105 through the hierarchy (progress threads that
    /// park), 38-74 with the defaults; in nccl-tests the hierarchy is faster at 8 B (27.7
    /// against 35.5 us): bench/results/issue31/x4-s15.
    gpu_flat_below_bytes: usize = 8 * 1024, "RAILCC_GPU_FLAT_BELOW_BYTES";
    /// A message of a GPU send/recv group across the network is spread over every channel
    /// when each channel gets at least this many bytes of it (smaller ones go whole to one
    /// channel with the group's other messages).
    gpu_net_p2p_spread_bytes: usize = 64 * 1024, "RAILCC_GPU_NET_P2P_SPREAD_BYTES";
    /// GPU collectives across the network are split over this many channels, each with its own
    /// connections and thread (NCCL's channels and proxy threads). 1 to 32.
    gpu_net_channels: usize = 8, "RAILCC_GPU_NET_CHANNELS";
    /// GPU collectives across the network move in chunks of at most this many staged bytes,
    /// so copies off the GPU, the network and copies back overlap.
    gpu_net_chunk_bytes: usize = 4 * 1024 * 1024, "RAILCC_GPU_NET_CHUNK_BYTES";
    /// Pieces of a GPU network call in flight (the staging ring's depth): the
    /// copies in run this far ahead of the network. 2 to 16.
    gpu_net_ring: usize = 16, "RAILCC_GPU_NET_RING";
    /// Pinned staging bytes a communicator's GPU network calls may hold (send and receive
    /// slots of its one ring, which every stream's calls share in turn); pieces are cut to
    /// fit, and the ring is made at init.
    /// 0: no budget (pieces up to 32 MiB, a ring of up to 512 MiB at the default depth).
    gpu_net_staging_bytes: usize = 28 * 1024 * 1024, "RAILCC_GPU_NET_STAGING_BYTES";
    /// How a GPU network call moves its pieces between the device and the staging ring: 0,
    /// copies and flag operations on the caller's stream, per piece; 1, one kernel launch of
    /// up to `RAILCC_GPU_NET_BLOCKS` blocks per 232 pieces and segments (the SMs copy to and from the
    /// mapped pinned ring and hand pieces over by the same flags).
    gpu_net_kernel: u8 = 1, "RAILCC_GPU_NET_KERNEL";
    /// Thread blocks of the network staging kernel (at most; a divisor of the ring's depth).
    /// 1 to 16.
    gpu_net_blocks: usize = 4, "RAILCC_GPU_NET_BLOCKS";
    /// 1: the staging kernel takes up to 2012 pieces and segments a launch (a kernel
    /// parameter of up to 32 KiB, which CUDA 12.1 drivers run; elsewhere it falls back to
    /// 232). 0: 232 (a 4 KiB parameter: a 128 MB all_reduce's 74 pieces in one launch). The
    /// larger parameter made an idle-stream call slower to return on H100.
    gpu_net_big_launch: u8 = 0, "RAILCC_GPU_NET_BIG_LAUNCH";
    /// 1: a staging-kernel launch of more than 64 entries writes them into a table of mapped
    /// host memory (8 tables of 2012 entries, 251 KiB a network engine) and passes the
    /// kernel a 304-byte header alone; calls with no table free pass them as with 0. Opt-in,
    /// not yet run on a GPU: an idle launch's cost may not follow its parameter's size.
    gpu_net_table: u8 = 0, "RAILCC_GPU_NET_TABLE";
    /// Prints, when a GPU network communicator closes, where its calls' time went: time to
    /// enqueue, each piece's host part, and the stream's turnaround between pieces. 2: also
    /// the first 40 calls' steps, a line each.
    gpu_net_trace: u8 = 0, "RAILCC_GPU_NET_TRACE";
    /// Microseconds the network engine's progress thread keeps polling for the next call after
    /// its last work before it parks: a call enqueued within it starts without a futex wake.
    /// 0: parks at once. Forced to 0 where the job's ranks on the host outnumber its cores,
    /// and where `RAILCC_SPIN_US` is 0.
    gpu_net_spin_us: u64 = 200, "RAILCC_GPU_NET_SPIN_US";
    /// Prints, when a communicator of one process per GPU on one host closes, where its
    /// calls' host time went, per phase (exports, waiting for peers, launches).
    gpu_host_trace: u8 = 0, "RAILCC_GPU_HOST_TRACE";
    /// 1: a collective of one process per GPU whose peers have not all published their
    /// buffers yet returns at once (as NCCL's does): its stream waits for a launcher thread
    /// that meets the peers and launches the kernel on a stream of its own. 0: the call waits
    /// on the host for its peers, then launches on the caller's stream. An experiment: it
    /// hangs under PyTorch (the launcher's enqueue blocks while the caller's stream waits for
    /// it, eighteenth session); leave it unset.
    gpu_defer: u8 = 0, "RAILCC_GPU_DEFER";
    /// One process per GPU: bytes of device memory each rank sets aside at init for a fixed
    /// staging buffer every peer maps once (0: none). An all_reduce, all_gather or
    /// reduce_scatter whose send and receive data fit is copied through it and launched at
    /// once on the caller's stream, without waiting on the host for its peers (as NCCL's
    /// calls return); a thread checks the peers' calls match behind it. The communicator
    /// takes every rank's least. An experiment (eighteenth session).
    gpu_stage_bytes: usize = 0, "RAILCC_GPU_STAGE_BYTES";
    /// One process per GPU: an all_reduce small enough for the low-latency kernel (which
    /// touches only its own buffers and the areas mapped at init) is launched at once on the
    /// caller's stream, without waiting on the host for its peers; a thread checks the peers'
    /// calls match behind it (an error is then asynchronous, as NCCL's). 0: it waits on the
    /// host like larger calls (unless the fixed stage is on, which takes them unmet too).
    /// Every rank must have it on.
    gpu_ll_no_wait: u8 = 1, "RAILCC_GPU_LL_NO_WAIT";
    /// One process per GPU: a call on the bulk kernel is enqueued at once on the caller's
    /// stream, its kernel waiting on the GPU for its arguments, which a thread writes once
    /// it has met the peers (as NCCL's calls return at once and wait on the GPU). All-reduces
    /// and all-gathers then take the bulk kernel (not the push kernel or the copy engines).
    /// Every rank must have it on; not with RAILCC_GPU_DEFER. An experiment (twentieth
    /// session). 2: all-reduces on the push kernel too (its late form).
    gpu_late_args: u8 = 0, "RAILCC_GPU_LATE_ARGS";
    /// With RAILCC_GPU_LATE_ARGS: how long, in microseconds, a call waits on the host for
    /// its peers (and for the launcher thread's earlier late calls) before it takes the late
    /// way. Peers that are all there by then (back-to-back
    /// calls, as in nccl-tests) get the kernel's usual form, with no slot to read on the GPU
    /// and no launcher thread on the way. 0: every such call takes the late way, even with
    /// its peers there (the GPU suite's late checks).
    gpu_late_wait_us: u64 = 10, "RAILCC_GPU_LATE_WAIT_US";
    /// With RAILCC_GPU_LATE_ARGS: a wait for the call's arguments on the stream ahead of its
    /// late kernel (a stream memory wait on a word the launcher thread raises past each late
    /// call once it has written or failed its slot), so the kernel's blocks take
    /// their SMs only once the launcher has met the peers. 0: the kernel is enqueued bare and
    /// its whole grid (up to 132 blocks) spins on its SMs until the peers come: matrix
    /// products beside it on 2 x H200 took 7.0x their time alone (1.0x with the wait, 1.21x
    /// beside NCCL's 24 spinning blocks; bench/torch/late_peer.py). Each rank alone. The
    /// stream wait's release costs: with products running the call finished 1.0-1.6 ms after
    /// the last peer came, against 0.75-0.83 ms spinning or NCCL's (0.7-0.8 all alike on an
    /// idle GPU; the same with the wait on a stream of the highest priority, tried and
    /// removed; so was a one-warp kernel polling the word instead, 0.9-1.4 ms, the products
    /// 1.07-1.09x: the late kernel's blocks wait for SMs behind the products' either way).
    gpu_late_gate: u8 = 1, "RAILCC_GPU_LATE_GATE";
    /// The GPU this rank's data lives on (libnccl and the GPU paths set it; -1: none): its
    /// rails between hosts are the NICs nearest that GPU (`railcc topo`), as rail-optimised
    /// clusters are wired, instead of those nearest the rank's NUMA node.
    gpu_ordinal: i64 = -1, "RAILCC_GPU_ORDINAL";
    /// RDMA queue pairs per connection (NCCL_IB_QPS_PER_CONNECTION): messages of 64 KB and
    /// more are split across them. The connecting (sending) side's value is used. 1 to 16.
    ib_qps_per_conn: u8 = 1, "RAILCC_IB_QPS_PER_CONN";
    /// Largest message a peer may announce, in bytes; a bigger header is a protocol error.
    max_message_bytes: u64 = 1 << 40, "RAILCC_MAX_MESSAGE_BYTES";
    /// libnccl's messages on stderr, as NCCL_DEBUG (which feeds it): none, version (nothing
    /// yet), warn (each error a call returns), info (also each communicator's path), trace (as
    /// info). Case-insensitive. railcc's own log is RAILCC_LOG.
    debug: DebugLevel = DebugLevel::None, "RAILCC_DEBUG";
    /// Where libnccl's messages go (NCCL_DEBUG_FILE): a file name in which %h is the host name
    /// and %p the process id; empty: stderr.
    debug_file: String = String::new(), "RAILCC_DEBUG_FILE";
}

/// One variable of the process environment (None when unset or not UTF-8). [`Config::from_env`],
/// the launch accessors below and `railcc config`'s report (which shows where each value came
/// from) all read through it; outside this file nothing reads the environment.
pub fn process_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// The job this process belongs to, from its launcher's variables ([`launch::discover`] over
/// the process environment); `Ok(None)` when no launcher variables are set.
pub fn launch_from_env() -> Result<Option<LaunchInfo>> {
    launch::discover(process_env)
}

/// This process's rank among the ranks of its host, from the launcher's variables
/// ([`launch::local_rank`]); None when no launcher gives one.
pub fn local_rank() -> Option<usize> {
    launch::local_rank(process_env)
}

/// `RAILCC_LOG`, the tracing filter (`warn`, `railcc_collectives=debug`, ...) for programs that
/// log (the bench); None when unset.
pub fn log_filter() -> Option<String> {
    process_env("RAILCC_LOG")
}

/// The rank `RAILCC_RANK` gives this process (the bench's ranks have it), for log lines.
pub fn railcc_rank() -> Option<usize> {
    process_env("RAILCC_RANK").and_then(|r| r.trim().parse().ok())
}

/// The timeout of a wait that has none: libnccl's default, since NCCL waits for a late rank
/// and leaves deciding that a wait is a hang to the framework's watchdog, which then calls
/// ncclCommAbort. Ten years rather than infinity, so deadlines stay representable as an
/// `Instant` and as a kernel's nanoseconds.
pub const NO_DEADLINE_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

impl Config {
    /// Defaults overridden by the process environment.
    pub fn from_env() -> Result<Config> {
        Config::default().apply_vars(|k| crate::nccl_env::lookup(&process_env, k))
    }

    /// libnccl's configuration: as [`Config::from_env`], but waits have no deadline
    /// ([`NO_DEADLINE_MS`]) unless RAILCC_TIMEOUT_MS is set.
    pub fn from_env_waiting() -> Result<Config> {
        from_env_waiting_in(&process_env)
    }

    /// The `debug` setting alone, from the process environment (RAILCC_DEBUG, else
    /// NCCL_DEBUG), for code that must know it even when another variable does not parse:
    /// libnccl prints the error that causes. A RAILCC_DEBUG that does not parse counts as warn.
    pub fn debug_level() -> DebugLevel {
        debug_level_in(&process_env)
    }

    /// Where libnccl's messages go (RAILCC_DEBUG_FILE, else NCCL_DEBUG_FILE), %h replaced by
    /// the host name and %p by the process id; None: stderr.
    pub fn debug_file_path() -> Option<String> {
        let raw = crate::nccl_env::lookup(&process_env, "RAILCC_DEBUG_FILE")?;
        Some(debug_file_name(
            &raw,
            &crate::netif::hostname(),
            std::process::id(),
        ))
    }

    /// The folder for compiled GPU kernels: None when `cache_dir` is "off", `cache_dir` when
    /// set, else `$XDG_CACHE_HOME/railcc`, else `$HOME/.cache/railcc` (None without either).
    pub fn kernel_cache_dir(&self) -> Option<PathBuf> {
        kernel_cache_dir_in(&self.cache_dir, |k: &str| std::env::var_os(k))
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        if !matches!(self.transport.as_str(), "auto" | "tcp" | "rdma") {
            return Err(Error::invalid(format!(
                "RAILCC_TRANSPORT={} must be auto, tcp or rdma",
                self.transport
            )));
        }
        if self.nsocks_per_peer == 0 || self.nsocks_per_peer > 64 {
            return Err(Error::invalid(format!(
                "RAILCC_NSOCKS_PER_PEER={} must be between 1 and 64",
                self.nsocks_per_peer
            )));
        }
        if self.chunk_bytes < 64 {
            return Err(Error::invalid(format!(
                "RAILCC_CHUNK_BYTES={} must be at least 64",
                self.chunk_bytes
            )));
        }
        if self.max_inflight_chunks == 0 {
            return Err(Error::invalid(
                "RAILCC_MAX_INFLIGHT_CHUNKS must be at least 1",
            ));
        }
        if !(1..=31).contains(&self.ib_timeout) || self.ib_retry_cnt > 7 {
            return Err(Error::invalid(format!(
                "RAILCC_IB_TIMEOUT={} must be 1 to 31 and RAILCC_IB_RETRY_CNT={} 0 to 7",
                self.ib_timeout, self.ib_retry_cnt
            )));
        }
        for (name, v) in [
            ("RAILCC_GPU_DIRECT", self.gpu_direct),
            ("RAILCC_GPU_NET_TABLE", self.gpu_net_table),
            ("RAILCC_GPU_NET_BIG_LAUNCH", self.gpu_net_big_launch),
        ] {
            if v > 1 {
                return Err(Error::invalid(format!("{name}={v} must be 0 or 1")));
            }
        }
        if !matches!(self.gpu_path.as_str(), "auto" | "net") {
            return Err(Error::invalid(format!(
                "RAILCC_GPU_PATH={} must be auto or net",
                self.gpu_path
            )));
        }
        if self.gpu_net_kernel > 1 || !(1..=16).contains(&self.gpu_net_blocks) {
            return Err(Error::invalid(format!(
                "RAILCC_GPU_NET_KERNEL={} must be 0 or 1 and RAILCC_GPU_NET_BLOCKS={} 1 to 16",
                self.gpu_net_kernel, self.gpu_net_blocks
            )));
        }
        if !(2..=16).contains(&self.gpu_net_ring) {
            return Err(Error::invalid(format!(
                "RAILCC_GPU_NET_RING={} must be 2 to 16",
                self.gpu_net_ring
            )));
        }
        if !(1..=32).contains(&self.gpu_net_channels) || self.gpu_net_chunk_bytes < 4096 {
            return Err(Error::invalid(format!(
                "RAILCC_GPU_NET_CHANNELS={} must be 1 to 32 and RAILCC_GPU_NET_CHUNK_BYTES={} at least 4096",
                self.gpu_net_channels, self.gpu_net_chunk_bytes
            )));
        }
        if self.ib_rails > 4 {
            return Err(Error::invalid(format!(
                "RAILCC_IB_RAILS={} must be 0 (a share of the ports) to 4",
                self.ib_rails
            )));
        }
        if !(1..=16).contains(&self.ib_qps_per_conn) {
            return Err(Error::invalid(format!(
                "RAILCC_IB_QPS_PER_CONN={} must be 1 to 16",
                self.ib_qps_per_conn
            )));
        }
        if self.ib_eager_bytes > 16384 {
            return Err(Error::invalid(format!(
                "RAILCC_IB_EAGER_BYTES={} must be at most 16384",
                self.ib_eager_bytes
            )));
        }
        if self.ib_sl > 15 || !(-1..=255).contains(&self.ib_gid_index) {
            return Err(Error::invalid(format!(
                "RAILCC_IB_SL={} must be 0 to 15 and RAILCC_IB_GID_INDEX={} -1 (auto) to 255",
                self.ib_sl, self.ib_gid_index
            )));
        }
        if self.timeout_ms == 0 {
            return Err(Error::invalid("RAILCC_TIMEOUT_MS must be at least 1"));
        }
        Ok(())
    }
}

fn from_env_waiting_in(env: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
    let lookup = |k: &str| crate::nccl_env::lookup(env, k);
    let mut c = Config::default().apply_vars(lookup)?;
    if lookup("RAILCC_TIMEOUT_MS").is_none() {
        c.timeout_ms = NO_DEADLINE_MS;
    }
    Ok(c)
}

/// One row of `railcc config`.
#[derive(Debug, Clone)]
pub struct ConfigRow {
    pub var: &'static str,
    pub value: String,
    pub from_env: bool,
    pub doc: &'static str,
}

/// NCCL_DEBUG_FILE's pattern with %h (host) and %p (pid) filled in (NCCL's).
fn debug_file_name(pattern: &str, host: &str, pid: u32) -> String {
    pattern.replace("%h", host).replace("%p", &pid.to_string())
}

fn debug_level_in(env: crate::nccl_env::Env<'_>) -> DebugLevel {
    const VAR: &str = "RAILCC_DEBUG";
    Config::default()
        .apply_vars(|k| {
            (k == VAR)
                .then(|| crate::nccl_env::lookup(env, k))
                .flatten()
        })
        .map_or(DebugLevel::Warn, |c| c.debug)
}

/// [`Config::kernel_cache_dir`] with `env` for the process environment. Per the XDG base
/// directory specification, an empty or relative `XDG_CACHE_HOME` is ignored.
fn kernel_cache_dir_in(
    configured: &str,
    env: impl Fn(&str) -> Option<OsString>,
) -> Option<PathBuf> {
    let absolute = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    match configured {
        "off" => None,
        "" => absolute(env("XDG_CACHE_HOME"))
            .or_else(|| {
                env("HOME")
                    .filter(|h| !h.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            })
            .map(|d| d.join("railcc")),
        d => Some(PathBuf::from(d)),
    }
}

fn parse_value<T: std::str::FromStr>(s: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    s.trim().parse::<T>().map_err(|e| e.to_string())
}

fn show_value<T: std::fmt::Display>(v: &T) -> String {
    let s = v.to_string();
    if s.is_empty() {
        "(unset)".to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_defaults() {
        let cfg = Config::default()
            .apply_vars(|k| match k {
                "RAILCC_TIMEOUT_MS" => Some("1500".into()),
                "RAILCC_ALGO" => Some("ring".into()),
                _ => None,
            })
            .unwrap();
        assert_eq!(cfg.timeout_ms, 1500);
        assert_eq!(cfg.algo, AlgoChoice::Ring);
        assert_eq!(cfg.chunk_bytes, Config::default().chunk_bytes);
    }

    #[test]
    fn libnccl_waits_without_a_deadline_unless_a_timeout_is_set() {
        let none = from_env_waiting_in(&|_| None).unwrap();
        assert_eq!(none.timeout_ms, NO_DEADLINE_MS);
        // Far, yet an Instant and a kernel's nanoseconds still hold it.
        assert!(std::time::Instant::now()
            .checked_add(none.timeout() * 2)
            .is_some());
        assert!(none.timeout().as_nanos() < u64::MAX as u128 / 4);
        let set = from_env_waiting_in(&|k| (k == "RAILCC_TIMEOUT_MS").then(|| "2500".into()));
        assert_eq!(set.unwrap().timeout_ms, 2500);
        assert_eq!(
            Config::default().timeout_ms,
            60_000,
            "elsewhere the default stays"
        );
    }

    #[test]
    fn bad_value_names_the_variable() {
        let e = Config::default()
            .apply_vars(|k| (k == "RAILCC_NSOCKS_PER_PEER").then(|| "many".to_string()))
            .unwrap_err();
        assert!(e.message.contains("RAILCC_NSOCKS_PER_PEER"), "{e}");
    }

    #[test]
    fn ib_timing_out_of_range_is_refused() {
        for (k, v) in [
            ("RAILCC_IB_TIMEOUT", "0"),
            ("RAILCC_IB_TIMEOUT", "32"),
            ("RAILCC_IB_RETRY_CNT", "8"),
        ] {
            let cfg = Config::default()
                .apply_vars(|n| (n == k).then(|| v.to_string()))
                .unwrap();
            let e = cfg.validate().unwrap_err();
            assert!(e.message.contains(k), "{k}={v}: {e}");
        }
        assert!(Config::default().validate().is_ok());
    }

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
    }

    #[test]
    fn debug_levels_as_nccl() {
        for (v, want) in [
            ("VERSION", DebugLevel::Version),
            ("warn", DebugLevel::Warn),
            ("Info", DebugLevel::Info),
            ("TRACE", DebugLevel::Trace),
        ] {
            let env = move |k: &str| (k == "NCCL_DEBUG").then(|| v.to_string());
            let cfg = Config::default()
                .apply_vars(|k| crate::nccl_env::lookup(&env, k))
                .unwrap();
            assert_eq!(cfg.debug, want, "NCCL_DEBUG={v}");
            assert_eq!(debug_level_in(&env), want, "NCCL_DEBUG={v}");
        }
        assert!(!DebugLevel::Version.warns());
        assert!(DebugLevel::Warn.warns() && !DebugLevel::Warn.informs());
        assert!(DebugLevel::Info.informs() && DebugLevel::Trace.informs());
        // Unset, or a value NCCL does not know: nothing, and not a configuration error.
        assert_eq!(debug_level_in(&vars(&[])), DebugLevel::None);
        let env = vars(&[("NCCL_DEBUG", "1")]);
        assert_eq!(debug_level_in(&env), DebugLevel::None);
        let cfg = Config::default()
            .apply_vars(|k| crate::nccl_env::lookup(&env, k))
            .unwrap();
        assert_eq!(cfg.debug, DebugLevel::None);
        // RAILCC_DEBUG wins; a bad one is an error for Config, warn for debug_level.
        let env = vars(&[("NCCL_DEBUG", "INFO"), ("RAILCC_DEBUG", "none")]);
        assert_eq!(debug_level_in(&env), DebugLevel::None);
        let env = vars(&[("RAILCC_DEBUG", "loud")]);
        assert_eq!(debug_level_in(&env), DebugLevel::Warn);
        let e = Config::default().apply_vars(&env).unwrap_err();
        assert!(e.message.contains("RAILCC_DEBUG"), "{e}");
    }

    #[test]
    fn kernel_cache_dir_off_explicit_xdg_home() {
        let os = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars(pairs)(k).map(OsString::from)
        };
        let both = os(&[("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/u")]);
        assert_eq!(kernel_cache_dir_in("off", both), None);
        assert_eq!(kernel_cache_dir_in("/x", both), Some(PathBuf::from("/x")));
        assert_eq!(
            kernel_cache_dir_in("", both),
            Some(PathBuf::from("/xdg/railcc"))
        );
        let home = Some(PathBuf::from("/home/u/.cache/railcc"));
        assert_eq!(kernel_cache_dir_in("", os(&[("HOME", "/home/u")])), home);
        for xdg in ["", "rel"] {
            let env = move |k: &str| match k {
                "XDG_CACHE_HOME" => Some(OsString::from(xdg)),
                "HOME" => Some(OsString::from("/home/u")),
                _ => None,
            };
            assert_eq!(kernel_cache_dir_in("", env), home, "XDG_CACHE_HOME={xdg:?}");
        }
        assert_eq!(kernel_cache_dir_in("", os(&[])), None);
        let cfg = Config::default()
            .apply_vars(vars(&[("RAILCC_CACHE_DIR", "off")]))
            .unwrap();
        assert_eq!(cfg.kernel_cache_dir(), None);
    }

    #[test]
    fn debug_file_names_fill_host_and_pid() {
        assert_eq!(
            debug_file_name("/tmp/nccl.%h.%p", "node1", 42),
            "/tmp/nccl.node1.42"
        );
        assert_eq!(debug_file_name("/tmp/plain", "node1", 42), "/tmp/plain");
    }

    #[test]
    fn describe_lists_every_field() {
        let rows = Config::default().describe(|_| None);
        assert!(rows.iter().any(|r| r.var == "RAILCC_CHUNK_BYTES"));
        assert!(rows.iter().all(|r| !r.doc.is_empty() && !r.from_env));
    }
}
