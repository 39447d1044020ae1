//! CUDA peer-to-peer transport over NVLink/PCIe: collectives whose GPUs reach each other's
//! memory directly, built on the CUDA layer (`railcc_cuda`: driver, kernels, contexts, IPC).
//!
//! - [`plan`]: what each GPU's kernel does in each collective (inputs, outputs, range), and the
//!   thread blocks per call;
//! - [`multi`]: one process driving several GPUs (like `ncclCommInitAll`), peer access enabled
//!   between every pair;
//! - [`proc`] and [`table`]: one process per GPU (torchrun style), peers' buffers mapped through
//!   handles that each call publishes in a shared-memory table;
//! - [`selfcopy`]: a rank's messages to itself in such a group, copies (inside the group's one
//!   launch where nothing else of the group touches them);
//! - [`share`] and [`fdpass`]: those handles for any allocator: legacy IPC handles, VMM
//!   pieces' file descriptors passed over Unix sockets, or none (the data is bounced);
//! - [`order`]: one communicator's kernels on a GPU run one after another, whatever streams;
//! - [`host_trace`]: where one process per GPU's calls spend the host's time
//!   (`RAILCC_GPU_HOST_TRACE`).

pub mod fdpass;
pub mod host_trace;
pub mod multi;
pub mod order;
pub mod plan;
pub mod proc;
pub mod selfcopy;
pub mod share;
pub mod table;

/// What errors about peers (one that cannot be reached, died or fell behind) name as their
/// transport; a failing CUDA call names `railcc_cuda::NAME`.
pub const NAME: &str = "nvlink";

/// What a communicator's GPUs are opened with. `railcc_collectives::gpu::GpuComm` builds it
/// from `Config` in one place, for both ways of running.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Folder of the compiled kernels (None: compile in every process).
    pub cache: Option<std::path::PathBuf>,
    /// How long a kernel or a host wait waits for a peer before the call fails (libnccl:
    /// `railcc_core::config::NO_DEADLINE_MS` unless set).
    pub timeout: std::time::Duration,
    /// Thread blocks per GPU wanted (0: one per SM), clamped to what stays resident.
    pub max_blocks: usize,
    /// Thread blocks per GPU a call takes at least (NCCL's minCTAs; 0: as the work needs).
    pub min_blocks: usize,
    /// All-reduces up to this many bytes per rank take the low-latency kernel.
    pub ll_max_bytes: usize,
    /// The bulk kernel's wide loop (every input's data loaded at once).
    pub wide_loads: bool,
    /// ... its inputs fetched by bulk async copies where the GPU can (`railcc_cuda::tma`): 0
    /// no, 1 its inputs, 2 its inputs and its outputs.
    pub tma: u8,
    /// All-reduces of at least this many bytes per rank take the push kernel (`plan::choose`;
    /// 0: never).
    pub push_bytes: usize,
    /// ... where a communicator may use at least this many blocks (`plan::Choice`).
    pub push_min_blocks: u32,
    /// The push kernel's largest tile, bytes (`railcc_cuda::push::shape`).
    pub push_slot: usize,
    /// All-gathers of at least this many bytes per rank on the copy engines (`plan::choose`;
    /// 0: never).
    pub ag_copy_bytes: usize,
    /// All-reduces of at least this many bytes per rank reduced by the bulk kernel into the
    /// own output, spread on the copy engines (`plan::choose`; 0: never).
    pub ar_copy_bytes: usize,
    /// A group's sends and receives as batch kernels (`railcc_cuda::p2p_many`).
    pub p2p_batch: bool,
    /// ... in one launch per batch where it fits (`p2p_many::fused`).
    pub p2p_fused: bool,
    /// ... with each peer's staged sends marked once they are in, where no receive overlaps
    /// a staged source (`p2p_many::fused`'s `early`).
    pub p2p_early: bool,
    /// One process per GPU: sends up to this many bytes go through a staging slot.
    pub p2p_stage_bytes: usize,
    /// The smallest piece a block of a p2p batch copies (`p2p_many::chunk_for`).
    pub p2p_min_chunk: u64,
    /// One process per GPU: messages of up to this many bytes go by `railcc_cuda::p2p_ll`
    /// (0: none; at most its MAX_BYTES). The communicator takes every rank's least.
    pub p2p_ll_bytes: usize,
    /// One process per GPU: where each call's host time goes, printed at close.
    pub host_trace: bool,
    /// One process per GPU: a collective whose peers are not all there yet returns at once,
    /// launched by a thread of its own (`proc/defer.rs`).
    pub defer: bool,
    /// One process per GPU: each rank's fixed staging buffer that peers map at init, for
    /// calls that then need no meeting on the host (`proc/stage.rs`; 0: none).
    pub stage_bytes: usize,
    /// One process per GPU: low-latency all-reduces launch without waiting on the host for
    /// their peers (`proc/stage.rs`'s path with no stage); every rank must have it on.
    pub ll_no_wait: bool,
    /// One process per GPU: bulk-kernel calls enqueued before their peers arrive, their
    /// kernels' arguments written later (`proc/late.rs`); every rank must have it on.
    pub late_args: bool,
    /// ... and all-reduces on the push kernel take its late form (`RAILCC_GPU_LATE_ARGS=2`).
    pub late_push: bool,
    /// ... after waiting this long on the host for the peers (`RAILCC_GPU_LATE_WAIT_US`):
    /// a call whose peers are all there by then launches at once, as without late arguments.
    pub late_wait: std::time::Duration,
    /// ... and a late kernel waits on its stream, not on its SMs, for its arguments
    /// (`RAILCC_GPU_LATE_GATE`; each rank alone).
    pub late_gate: bool,
}

impl Settings {
    /// GPU `ordinal`'s context with the kernels these settings take (the TMA form's modules
    /// only where asked for).
    pub fn open_gpu(&self, ordinal: usize) -> railcc_core::Result<railcc_cuda::gpu::GpuCtx> {
        let mut gpu = railcc_cuda::gpu::GpuCtx::new(ordinal, self.cache.as_deref())?;
        if self.tma > 0 {
            gpu.load_tma(self.cache.as_deref())?;
        }
        Ok(gpu)
    }

    pub fn timeout_ns(&self) -> u64 {
        self.timeout.as_nanos().min(u64::MAX as u128) as u64
    }
}
