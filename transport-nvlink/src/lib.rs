//! CUDA peer-to-peer transport over NVLink/PCIe.
//!
//! - [`driver`]: guarded loading of libcuda (no driver is an `Unsupported` error, never a
//!   panic), GPU discovery and the peer-access matrix;
//! - [`kernels`] and [`compile`]: one copy/reduce kernel per dtype and op, compiled by NVRTC
//!   for the device's architecture on first use and cached on disk (f16/bf16 accumulate in f32);
//! - [`gpu`]: one GPU's context, stream, kernels and sync area; CUDA graphs;
//! - [`launch`]: what each GPU's kernel does in each collective, and the launch;
//! - [`ll`]: the low-latency all-reduce for small messages (one exchange, no barriers);
//! - [`multi`]: one process driving several GPUs (like `ncclCommInitAll`);
//! - [`hostsync`] and [`staging`]: flags a stream writes and waits on in mapped pinned memory,
//!   copies between pinned and device memory, pinned buffers (what the network engine builds
//!   on);
//! - [`ipc`] and [`proc`]: one process per GPU (torchrun style), peers' buffers mapped through
//!   CUDA IPC handles.

pub mod compile;
pub mod dmabuf;
pub mod driver;
pub mod gpu;
pub mod hostsync;
pub mod ipc;
pub mod kernels;
pub mod launch;
pub mod ll;
pub mod multi;
pub mod nvml;
pub mod proc;
pub mod staging;

pub const NAME: &str = "nvlink";
