//! railcc-collectives: the Communicator API, the algorithms as plans, the simulator that checks
//! them, and the host executor that runs them over a network transport.

pub mod comm;
pub mod conn;
pub mod cost;
pub mod exec;
pub mod gpu;
pub mod gpu_check;
pub mod plan;
pub mod precision;
pub mod rails;
pub mod reduce;
pub mod reference;
pub mod regions;
pub mod sim;

pub use comm::{Bufs, Communicator, P2p};
pub use plan::{Algo, CollArgs};
pub use railcc_core::call::CollKind;
pub use railcc_core::{Config, DataType, Element, Error, ErrorKind, ReduceOp, Result};
pub use regions::RegionId;
