//! CUDA peer-to-peer transport over NVLink/PCIe: collectives whose GPUs reach each other's
//! memory directly, built on the CUDA layer (`railcc_cuda`: driver, kernels, contexts, IPC).
//!
//! - [`plan`]: what each GPU's kernel does in each collective (inputs, outputs, range), and the
//!   thread blocks per call;
//! - [`multi`]: one process driving several GPUs (like `ncclCommInitAll`), peer access enabled
//!   between every pair;
//! - [`proc`] and [`table`]: one process per GPU (torchrun style), peers' buffers mapped through
//!   CUDA IPC handles that each call publishes in a shared-memory table.

pub mod multi;
pub mod plan;
pub mod proc;
pub mod table;

/// What errors about peers (one that cannot be reached, died or fell behind) name as their
/// transport; a failing CUDA call names `railcc_cuda::NAME`.
pub const NAME: &str = "nvlink";
