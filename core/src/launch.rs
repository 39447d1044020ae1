//! Rank discovery from launcher variables, so `torchrun`, `mpirun`, `srun` and PMI-based
//! launchers start a job without railcc-specific flags.
//!
//! Precedence: `RAILCC_RANK`/`RAILCC_NRANKS`, then torchrun, Open MPI, Slurm, PMI. The root is
//! `RAILCC_UNIQUE_ID` (address and secret), else `RAILCC_ROOT` or `MASTER_ADDR:MASTER_PORT`.

use crate::auth::Secret;
use crate::bootstrap::UniqueId;
use crate::error::{Error, Result};
use std::net::{SocketAddr, ToSocketAddrs};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    pub rank: usize,
    pub nranks: usize,
    pub local_rank: Option<usize>,
    /// Which launcher's variables gave rank and size.
    pub launcher: &'static str,
    pub id: UniqueId,
    /// True when the secret came from a job id rather than a real random secret.
    pub weak_secret: bool,
    /// True when the id came whole from `RAILCC_UNIQUE_ID`: the process that made it serves
    /// the rendezvous, so rank 0 does not.
    pub id_given: bool,
}

const SOURCES: [(&str, &str, &str, Option<&str>); 5] = [
    (
        "railcc",
        "RAILCC_RANK",
        "RAILCC_NRANKS",
        Some("RAILCC_LOCAL_RANK"),
    ),
    ("torchrun", "RANK", "WORLD_SIZE", Some("LOCAL_RANK")),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        Some("OMPI_COMM_WORLD_LOCAL_RANK"),
    ),
    (
        "slurm",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        Some("SLURM_LOCALID"),
    ),
    ("pmi", "PMI_RANK", "PMI_SIZE", None),
];

/// Job-id variables that every rank of one job shares, for the fallback secret.
const JOB_IDS: [&str; 4] = [
    "TORCHELASTIC_RUN_ID",
    "OMPI_MCA_ess_base_jobid",
    "SLURM_JOB_ID",
    "PMI_JOBID",
];

fn num(lookup: &impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<usize>> {
    match lookup(var) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| Error::invalid(format!("{var}={v:?} is not a non-negative integer"))),
    }
}

/// Returns `Ok(None)` when no launcher variables are set at all.
pub fn discover(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
    let mut found = None;
    for (name, rv, nv, lv) in SOURCES {
        if let (Some(rank), Some(n)) = (num(&lookup, rv)?, num(&lookup, nv)?) {
            let local = match lv {
                Some(l) => num(&lookup, l)?,
                None => None,
            };
            found = Some((name, rank, n, local));
            break;
        }
    }
    let Some((launcher, rank, nranks, local_rank)) = found else {
        return Ok(None);
    };
    if nranks == 0 || rank >= nranks {
        return Err(Error::invalid(format!(
            "{launcher}: rank {rank} out of range for size {nranks}"
        )));
    }
    let id_given = lookup("RAILCC_UNIQUE_ID");
    let (id, weak_secret) = if let Some(s) = &id_given {
        (s.parse::<UniqueId>()?, false)
    } else {
        let root = root_addr(&lookup)?;
        match lookup("RAILCC_SECRET") {
            Some(hex) => (
                UniqueId {
                    root,
                    secret: parse_secret(&hex)?,
                },
                false,
            ),
            None => (
                UniqueId {
                    root,
                    secret: job_secret(&lookup, root),
                },
                true,
            ),
        }
    };
    Ok(Some(LaunchInfo {
        rank,
        nranks,
        local_rank,
        launcher,
        id,
        weak_secret,
        id_given: id_given.is_some(),
    }))
}

/// The rank among its host's ranks that the launchers' variables give (`RAILCC_LOCAL_RANK`,
/// `LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`: the first set, in
/// [`discover`]'s precedence), with or without a rank and size; None when none is set or the
/// first set is not a number.
pub fn local_rank(lookup: impl Fn(&str) -> Option<String>) -> Option<usize> {
    SOURCES
        .iter()
        .filter_map(|s| s.3)
        .find_map(lookup)
        .and_then(|v| v.trim().parse().ok())
}

fn root_addr(lookup: &impl Fn(&str) -> Option<String>) -> Result<SocketAddr> {
    let hostport = match (lookup("RAILCC_ROOT"), lookup("MASTER_ADDR"), lookup("MASTER_PORT")) {
        (Some(r), _, _) => r,
        (None, Some(a), Some(p)) => {
            if a.contains(':') && !a.starts_with('[') {
                format!("[{a}]:{p}")
            } else {
                format!("{a}:{p}")
            }
        }
        _ => {
            return Err(Error::invalid(
                "launcher variables found but no root: set RAILCC_UNIQUE_ID, RAILCC_ROOT=host:port, or MASTER_ADDR and MASTER_PORT",
            ))
        }
    };
    hostport
        .to_socket_addrs()
        .map_err(|e| Error::invalid(format!("root address '{hostport}': {e}")))?
        .next()
        .ok_or_else(|| Error::invalid(format!("root address '{hostport}' resolved to nothing")))
}

fn parse_secret(hex: &str) -> Result<Secret> {
    let hex = hex.trim();
    let bad = || Error::invalid("RAILCC_SECRET must be 32 hex digits");
    if hex.len() != 32 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut s = [0u8; 16];
    for (i, b) in s.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(Secret(s))
}

/// A secret every rank can compute from shared job variables. It keeps out ranks of other jobs
/// and port scanners, but anyone who can read the job's environment knows it: prefer
/// `RAILCC_UNIQUE_ID` or `RAILCC_SECRET` where the launcher can pass one.
fn job_secret(lookup: &impl Fn(&str) -> Option<String>, root: SocketAddr) -> Secret {
    let mut h = blake3::Hasher::new_derive_key("railcc 2026 job-id secret");
    h.update(root.to_string().as_bytes());
    for v in JOB_IDS {
        if let Some(x) = lookup(v) {
            h.update(v.as_bytes());
            h.update(x.as_bytes());
        }
    }
    let mut s = [0u8; 16];
    s.copy_from_slice(&h.finalize().as_bytes()[..16]);
    Secret(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn torchrun() {
        let i = discover(env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (i.rank, i.nranks, i.local_rank, i.launcher),
            (3, 8, Some(1), "torchrun")
        );
        assert_eq!(i.id.root, "127.0.0.1:29500".parse().unwrap());
        assert!(i.weak_secret && !i.id_given);
    }

    #[test]
    fn openmpi_slurm_pmi() {
        let base = [("RAILCC_ROOT", "127.0.0.1:5000")];
        let i = discover(env(&[
            base[0],
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((i.rank, i.nranks, i.launcher), (1, 2, "openmpi"));
        let i = discover(env(&[
            base[0],
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_LOCALID", "0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (i.rank, i.nranks, i.local_rank, i.launcher),
            (5, 6, Some(0), "slurm")
        );
        let i = discover(env(&[base[0], ("PMI_RANK", "0"), ("PMI_SIZE", "4")]))
            .unwrap()
            .unwrap();
        assert_eq!((i.rank, i.nranks, i.launcher), (0, 4, "pmi"));
    }

    #[test]
    fn unique_id_wins_and_is_strong() {
        let id = "railcc1:000102030405060708090a0b0c0d0e0f@127.0.0.1:7000";
        let i = discover(env(&[
            ("RAILCC_RANK", "0"),
            ("RAILCC_NRANKS", "2"),
            ("RAILCC_UNIQUE_ID", id),
        ]))
        .unwrap()
        .unwrap();
        assert!(!i.weak_secret && i.id_given);
        assert_eq!(i.id.secret.0[15], 15);
    }

    #[test]
    fn local_rank_in_launcher_order() {
        assert_eq!(local_rank(env(&[])), None);
        assert_eq!(local_rank(env(&[("SLURM_LOCALID", "3")])), Some(3));
        assert_eq!(
            local_rank(env(&[
                ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
                ("LOCAL_RANK", "1")
            ])),
            Some(1)
        );
        assert_eq!(
            local_rank(env(&[("RAILCC_LOCAL_RANK", "x"), ("LOCAL_RANK", "1")])),
            None
        );
    }

    #[test]
    fn errors_name_the_variable() {
        assert!(discover(env(&[])).unwrap().is_none());
        let e = discover(env(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.message.contains("RANK"), "{e}");
        let e = discover(env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("RAILCC_ROOT", "127.0.0.1:1"),
        ]))
        .unwrap_err();
        assert!(e.message.contains("out of range"), "{e}");
        let e = discover(env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.message.contains("MASTER_ADDR"), "{e}");
    }
}
