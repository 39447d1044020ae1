//! railcc-collectives: the Communicator API, the algorithms as plans, the simulator that checks
//! them, and the host executor that runs them over a network transport.

pub mod plan;
pub mod reduce;
pub mod reference;
pub mod sim;
