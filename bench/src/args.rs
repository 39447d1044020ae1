//! Command-line arguments, with nccl-tests' flag names.

use clap::{Args, ValueEnum};
use railcc_collectives::CollKind;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    Sendrecv,
    Alltoall,
}

impl Collective {
    pub fn kind(self) -> CollKind {
        match self {
            Collective::AllReduce => CollKind::AllReduce,
            Collective::AllGather => CollKind::AllGather,
            Collective::ReduceScatter => CollKind::ReduceScatter,
            Collective::Broadcast => CollKind::Broadcast,
            Collective::Reduce => CollKind::Reduce,
            Collective::Sendrecv => CollKind::SendRecv,
            Collective::Alltoall => CollKind::AllToAll,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// The collective to measure (all_reduce, all_gather, ...; dashes also accepted).
    #[arg(value_parser = parse_collective)]
    pub collective: Collective,
    /// Smallest size in bytes (K, M, G suffixes are powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    pub min_bytes: u64,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub step_factor: u64,
    /// Fixed increment between sizes (overrides -f when set).
    #[arg(short = 'i', long = "stepbytes", value_parser = parse_size)]
    pub step_bytes: Option<u64>,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u32,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup: u32,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Where GPU results of the exact fill are checked: gpu (inputs written and what differs
    /// counted by kernels where the buffers lie; only the bytes around a result come back;
    /// buffers offset off their element size fall back to the host) or host (inputs made and
    /// results checked on every core, through PCIe).
    #[arg(long = "check-on", value_enum, default_value = "gpu")]
    pub check_on: CheckOn,
    /// Data type: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2, or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Reduction: sum, prod, min, max, avg, or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Inputs: exact (small integers, results bit for bit whatever the reduction order) or
    /// random (random values of each dtype, floats checked against an error bound from the
    /// dtype and the rank count: collectives::precision).
    #[arg(long, default_value = "exact")]
    pub fill: railcc_collectives::precision::Fill,
    /// Root rank for broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Start this many local processes (ignored under mpirun, srun or torchrun).
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Split the --ranks local processes into this many emulated hosts (each a run of
    /// consecutive ranks with its own RAILCC_HOSTID and local ranks from 0), so one machine
    /// runs a multi-host job: the network between hosts, peer access inside one.
    #[arg(long, default_value_t = 1)]
    pub hosts: usize,
    /// This process's rank, for a hand-started job (with --nranks and --root-addr).
    #[arg(long)]
    pub rank: Option<usize>,
    /// Rank count of a hand-started job.
    #[arg(long)]
    pub nranks: Option<usize>,
    /// host:port of the rendezvous root (rank 0 listens there) for a hand-started job.
    #[arg(long = "root-addr")]
    pub root_addr: Option<String>,
    /// Network transport for host buffers: auto, tcp or rdma (sets RAILCC_TRANSPORT for every
    /// rank; rdma fails when a rank has no active RDMA port).
    #[arg(long)]
    pub transport: Option<String>,
    /// Where the buffers live: host (TCP ranks) or cuda (GPU memory, kernels over NVLink/PCIe
    /// peer access).
    #[arg(long, default_value = "host")]
    pub device: String,
    /// With --device cuda: how many GPUs one process drives (default: all).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// With --device cuda: one process per GPU (torchrun style; --ranks processes, or the
    /// launcher's), peers reached through CUDA IPC. Implied under a launcher.
    #[arg(long = "per-process")]
    pub per_process: bool,
    /// With --device cuda: capture the timed calls in a CUDA graph and launch it this many
    /// times (nccl-tests -G); 0 launches eagerly.
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0)]
    pub graph_launches: u32,
    /// With --device cuda: start every buffer this many bytes into its allocation, to test
    /// buffers that are not 256-byte aligned (a multiple of the element size).
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    /// Host buffers: register them with the communicator once (1, like nccl-tests -R 1), so
    /// RDMA moves them zero-copy, or not (0: the transport registers per transfer).
    #[arg(short = 'R', long = "register", default_value_t = 1)]
    pub register: u8,
    /// Run the sweep once per configuration and print them side by side: transports (tcp,
    /// rdma), nvlink (GPUs), each optionally with rails (`tcp:eth0+eth1`, `tcp:r0=800+r1=400`).
    #[arg(long)]
    pub compare: Option<String>,
    /// With --compare: run the whole list this many times, interleaved, and report each
    /// configuration's median time per size (for noisy, shared machines).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// With --compare: draw busbw against size, one line per configuration, into this SVG.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Interfaces to stripe TCP over (RAILCC_RAILS): `eth0,eth1` or `eth0:800,eth1:400`.
    #[arg(long)]
    pub rails: Option<String>,
    /// With --device cuda --per-process: move GPU data over the network transport (staged
    /// through pinned host memory), as ranks on different machines do, instead of CUDA IPC.
    #[arg(long = "gpu-net")]
    pub gpu_net: bool,
    /// With --gpu-net: before each call timed on an idle stream, the caller's thread spins
    /// this many microseconds past the barrier (0: it calls as the barrier wakes it). A
    /// thread woken from a wait runs cold for a while; one that was busy, as a training
    /// loop's, does not: the two tell the library's time from the wake-up's.
    #[arg(long = "idle-spin-us", default_value_t = 0)]
    pub idle_spin_us: u64,
    /// Pin each rank to one CPU by its local rank (core), or leave placement to the kernel
    /// (none), like mpirun's --bind-to.
    #[arg(long, default_value = "none", value_parser = ["none", "core"])]
    pub bind: String,
    /// Write results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

fn parse_collective(s: &str) -> Result<Collective, String> {
    let norm = s.replace('-', "_").to_ascii_lowercase();
    let norm = norm.strip_suffix("_perf").unwrap_or(&norm).to_string();
    Ok(match norm.as_str() {
        "all_reduce" | "allreduce" => Collective::AllReduce,
        "all_gather" | "allgather" => Collective::AllGather,
        "reduce_scatter" | "reducescatter" => Collective::ReduceScatter,
        "broadcast" | "bcast" => Collective::Broadcast,
        "reduce" => Collective::Reduce,
        "sendrecv" | "send_recv" => Collective::Sendrecv,
        "alltoall" | "all_to_all" => Collective::Alltoall,
        _ => return Err(format!("unknown collective '{s}' (all_reduce, all_gather, reduce_scatter, broadcast, reduce, sendrecv, alltoall)")),
    })
}

/// Parses `8`, `64K`, `32M`, `1G`, `2GB` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.strip_suffix('B').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size (examples: 8, 64K, 32M, 1G)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("32MB").unwrap(), 32 << 20);
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn collective_names() {
        assert!(matches!(
            parse_collective("all-reduce").unwrap(),
            Collective::AllReduce
        ));
        assert!(matches!(
            parse_collective("all_gather_perf").unwrap(),
            Collective::AllGather
        ));
        assert!(parse_collective("gossip").is_err());
    }
}

/// Where `railcc bench --device cuda` checks results (`--check-on`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CheckOn {
    Host,
    #[default]
    Gpu,
}
