//! railcc's CUDA layer: what talks to the driver and NVRTC, one GPU at a time. The transport and
//! engine above it (`railcc_transport_nvlink`'s peer-to-peer collectives,
//! `railcc_collectives::gpu_net`) decide which GPU's kernel reads and writes which buffers and
//! how handles travel between processes; nothing here knows about bootstraps or networks.
//!
//! - [`driver`]: guarded loading of libcuda (no driver is an `Unsupported` error, never a
//!   panic), GPU discovery and the peer-access matrix;
//! - [`kernels`], [`ll`] and [`push`]: the CUDA C source of the bulk copy/reduce kernel, of
//!   the low-latency all-reduce and of the push all-reduce (NVLink writes only), one per dtype and op (f16/bf16 accumulate in f32), and the layout of
//!   the sync area through which they meet peers' kernels;
//! - [`compile`]: NVRTC for the device's architecture on first use, cached on disk;
//! - [`gpu`]: one GPU's context, stream, loaded kernels and sync area; device buffers, timing
//!   events, CUDA graphs;
//! - [`launch`]: the kernels' arguments and their launch on a stream;
//! - [`hostsync`] and [`staging`]: flags a stream writes and waits on in mapped pinned memory,
//!   copies between pinned and device memory, pinned buffers (what the network engine builds
//!   on);
//! - [`ipc`]: CUDA IPC handles of device allocations, and the cache of peers' opened ones;
//! - [`vmm`]: memory of the virtual memory API (PyTorch's expandable segments, ncclMemAlloc):
//!   how a buffer can be shared, its pieces' file descriptors, peers' pieces mapped as views;
//! - [`dmabuf`]: device memory exported as dma-buf (GPUDirect RDMA);
//! - [`nvml`]: NVLink counts between GPUs (`railcc topo`);
//! - [`copies`]: collectives whose data moves on the copy engines between one-block barrier
//!   kernels (the all-gather; an all-reduce's reduced segments, after the bulk kernel);
//! - [`netcopy`]: the network engine's staging kernel (SM copies between device buffers and
//!   the pinned ring, flags handed to the progress thread), a module of its own.

pub mod check;
pub mod compile;
pub mod copies;
pub mod dmabuf;
pub mod driver;
pub mod gpu;
pub mod hostsync;
pub mod ipc;
pub mod kernels;
pub mod late;
pub mod launch;
pub mod ll;
pub mod netcopy;
pub mod nvml;
pub mod p2p_ll;
pub mod p2p_many;
pub mod push;
pub mod staging;
pub mod tma;
pub mod vmm;

/// What errors raised by a CUDA call or by NVRTC name as their transport.
pub const NAME: &str = "cuda";
