//! GPU buffers: [`GpuComm`] is the only way in, for both ways of running (one process driving
//! several GPUs; one process per GPU), on one host and across hosts. libnccl and `railcc bench
//! --device cuda` reach GPU buffers through it alone.
//!
//! - [`path`]: where the ranks live ([`Placement`]) and the one decision of how data moves
//!   ([`GpuPath`]), made once at init as NCCL's transport table is;
//! - [`comm`]: [`GpuComm`], which opens that path and takes every call (the kernels of
//!   `railcc_transport_nvlink` for peers reached by peer access, the network engine for the
//!   others, the hierarchy for both);
//! - [`net`]: the stream-ordered network engine (pinned staging, channels, a progress thread);
//! - [`hier`]: collectives as a hierarchy on several hosts of several GPUs.

pub mod comm;
pub mod hier;
pub mod net;
pub mod path;

pub use comm::{GpuComm, Reach};
pub use path::{GpuPath, Placement};

use railcc_core::Config;
use railcc_transport_nvlink::Settings;

/// What GPUs are opened with, from `cfg`: the one place these settings are read, for every
/// path (one process or one per GPU, alone or as the hierarchy's host part).
pub fn settings(cfg: &Config) -> Settings {
    Settings {
        cache: cfg.kernel_cache_dir(),
        timeout: cfg.timeout(),
        max_blocks: cfg.gpu_max_blocks,
        min_blocks: cfg.gpu_min_blocks,
        ll_max_bytes: cfg.gpu_ll_max_bytes,
        wide_loads: cfg.gpu_wide_loads != 0,
        tma: match cfg.gpu_wide_loads {
            2 => 1,
            3 => 2,
            _ => 0,
        },
        push_bytes: cfg.gpu_ar_push_bytes,
        push_min_blocks: cfg.gpu_push_min_blocks.min(u32::MAX as usize) as u32,
        push_slot: cfg.gpu_push_slot_bytes,
        ag_copy_bytes: cfg.gpu_ag_copy_bytes,
        ar_copy_bytes: cfg.gpu_ar_copy_bytes,
        p2p_batch: cfg.gpu_p2p_batch != 0,
        p2p_fused: cfg.gpu_p2p_batch >= 2,
        p2p_early: cfg.gpu_p2p_batch == 3,
        p2p_stage_bytes: cfg.gpu_p2p_stage_bytes,
        p2p_min_chunk: cfg.gpu_p2p_min_chunk as u64,
        p2p_ll_bytes: cfg.gpu_p2p_ll_bytes.min(railcc_cuda::p2p_ll::MAX_BYTES),
        host_trace: cfg.gpu_host_trace != 0,
        defer: cfg.gpu_defer != 0,
        stage_bytes: cfg.gpu_stage_bytes,
        ll_no_wait: cfg.gpu_ll_no_wait != 0,
        late_args: cfg.gpu_late_args != 0,
        late_push: cfg.gpu_late_args >= 2,
        late_wait: std::time::Duration::from_micros(cfg.gpu_late_wait_us),
        late_gate: cfg.gpu_late_gate != 0,
    }
}
