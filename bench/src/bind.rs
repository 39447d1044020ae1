//! `--bind core`: pins a rank to one CPU of those it may use, picked by its local rank, as
//! mpirun's `--bind-to core` does. A rank that sleeps between completions otherwise wakes on
//! whichever CPU is free; on Soft-RoCE that moves its packets between CPU backlogs, they
//! arrive out of order, and the queue pair resends (seen as `completer_retry_err`).

/// Pins the calling process to the `local_rank`-th CPU it may run on (wrapping around).
pub fn bind_to_core(local_rank: usize) -> Result<usize, String> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for this process.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Err(format!(
            "--bind core: sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: CPU_ISSET reads within the set for indices below CPU_SETSIZE.
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    let Some(&cpu) = cpus.get(local_rank % cpus.len().max(1)) else {
        return Err("--bind core: this process may run on no CPU".into());
    };
    // SAFETY: plain data, as above.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE; `one` is a valid set; sched_setaffinity reads `size` bytes.
    let r = unsafe {
        libc::CPU_SET(cpu, &mut one);
        libc::sched_setaffinity(0, size, &one)
    };
    if r != 0 {
        return Err(format!(
            "--bind core: sched_setaffinity to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(cpu)
}
