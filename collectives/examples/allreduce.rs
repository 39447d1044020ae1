//! The README's example: run it under any launcher, e.g.
//! `RAILCC_RANK=0 RAILCC_NRANKS=2 RAILCC_ROOT=127.0.0.1:29400 cargo run --example allreduce &`
//! `RAILCC_RANK=1 RAILCC_NRANKS=2 RAILCC_ROOT=127.0.0.1:29400 cargo run --example allreduce`
//! (torchrun, mpirun and srun set their own variables).

use railcc_collectives::{Communicator, Config, ReduceOp};

fn main() -> Result<(), railcc_collectives::Error> {
    let comm = Communicator::from_env(Config::from_env()?)?;
    let (rank, n) = (comm.rank(), comm.nranks());

    // Out of place: every rank gets the element-wise sum.
    let grads: Vec<f32> = vec![rank as f32 + 1.0; 1 << 20];
    let mut sum = vec![0f32; grads.len()];
    comm.all_reduce(&grads, &mut sum, ReduceOp::Sum)?;
    assert_eq!(sum[0], (n * (n + 1) / 2) as f32);

    // In place, with bf16 averaged (accumulated in f32).
    let mut w = vec![half::bf16::from_f32(rank as f32); 4096];
    comm.all_reduce_in_place(&mut w, ReduceOp::Avg)?;

    // Gather one value from everyone; broadcast from rank 0.
    let mut all = vec![0u64; n];
    comm.all_gather(&[rank as u64], &mut all)?;
    let mut cfg = [0u8; 64];
    comm.broadcast_in_place(&mut cfg, 0)?;
    comm.barrier()?;
    if rank == 0 {
        println!(
            "all-reduce of {} floats on {n} ranks: sum[0] = {}",
            grads.len(),
            sum[0]
        );
    }
    Ok(())
}
