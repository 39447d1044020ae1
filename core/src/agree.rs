//! "Every rank learns every rank's setup outcome": a collective setup step (opening GPUs,
//! engines, tables) that fails on one rank must fail on all, at the same exchange, naming
//! the rank that failed; otherwise the others wait at the next exchange for a rank that has
//! left. Each rank sends one *record* per part it set up (the part's payload, or why it
//! failed) in one all-gather, and every rank reads every record.
//!
//! A record is a status byte (1: worked, 0: failed), a little-endian u32 length, then the
//! payload or the error's text. One encoding for every setup step in railcc.

use crate::error::{Error, ErrorKind, Result};

/// Swaps one byte string per rank with every rank (a bootstrap all-gather, possibly
/// restricted to some ranks).
pub type Exchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// One part's outcome as a record: `payload(value)` when it worked, else the error's text.
pub fn record<T>(r: &Result<T>, payload: impl FnOnce(&T) -> Vec<u8>) -> Vec<u8> {
    let (status, body) = match r {
        Ok(v) => (1u8, payload(v)),
        Err(e) => (0u8, e.to_string().into_bytes()),
    };
    let mut b = Vec::with_capacity(5 + body.len());
    b.push(status);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&body);
    b
}

/// The records in one rank's message: each the payload, or why that part failed. A
/// malformed tail reads as one failed record.
pub fn records(mut b: &[u8]) -> Vec<std::result::Result<Vec<u8>, String>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let len = b
            .get(1..5)
            .and_then(|l| <[u8; 4]>::try_from(l).ok())
            .map(|l| u32::from_le_bytes(l) as usize);
        let Some(body) = len.and_then(|n| b.get(5..5 + n)) else {
            out.push(Err("malformed setup record".to_string()));
            break;
        };
        out.push(match b[0] {
            1 => Ok(body.to_vec()),
            _ => Err(String::from_utf8_lossy(body).into_owned()),
        });
        b = &b[5 + body.len()..];
    }
    out
}

/// Why part `k` failed in one rank's message (a missing record is a failure), else None.
pub fn failed(message: &[u8], k: usize) -> Option<String> {
    match records(message).into_iter().nth(k) {
        Some(Ok(_)) => None,
        Some(Err(why)) => Some(why),
        None => Some("no setup record".to_string()),
    }
}

/// The first rank whose part `k` failed: (its index in `all`, why).
pub fn first_failure(all: &[Vec<u8>], k: usize) -> Option<(usize, String)> {
    all.iter()
        .enumerate()
        .find_map(|(r, m)| Some((r, failed(m, k)?)))
}

/// Part `k`'s payload in one rank's message (empty when it failed or is missing).
pub fn payload(message: &[u8], k: usize) -> Vec<u8> {
    match records(message).into_iter().nth(k) {
        Some(Ok(p)) => p,
        _ => Vec::new(),
    }
}

/// One setup step of one part: every rank learns whether every rank succeeded. The first
/// failure comes back on every rank (this rank's own error where it failed itself, else one
/// naming the rank, by `name`: how errors number the exchange's ranks); on success, the value
/// and every rank's payload.
pub fn agree<T>(
    mine: Result<T>,
    ex: &mut Exchange<'_>,
    name: &dyn Fn(usize) -> usize,
    payload_of: impl FnOnce(&T) -> Vec<u8>,
) -> Result<(T, Vec<Vec<u8>>)> {
    let all = ex(&record(&mine, payload_of))?;
    let mut payloads = Vec::with_capacity(all.len());
    for (r, m) in all.iter().enumerate() {
        let first = records(m).into_iter().next();
        match first.unwrap_or_else(|| Err("no setup record".to_string())) {
            Ok(p) => payloads.push(p),
            Err(why) => {
                let r = name(r);
                return Err(mine.err().unwrap_or_else(|| {
                    Error::new(ErrorKind::Io, format!("rank {r} failed GPU setup: {why}")).peer(r)
                }));
            }
        }
    }
    Ok((mine?, payloads))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_name_the_part_that_failed() {
        let ok: Result<()> = Ok(());
        let bad: Result<()> = Err(Error::invalid("no pinned memory"));
        let both_ok = [record(&ok, |_| vec![7, 8]), record(&ok, |_| vec![])].concat();
        assert_eq!(failed(&both_ok, 0), None);
        assert_eq!(failed(&both_ok, 1), None);
        assert_eq!(payload(&both_ok, 0), vec![7, 8]);
        let second_bad = [record(&ok, |_| vec![]), record(&bad, |_| vec![])].concat();
        assert_eq!(failed(&second_bad, 0), None);
        assert!(failed(&second_bad, 1).is_some_and(|w| w.contains("no pinned memory")));
        let all = vec![both_ok.clone(), second_bad.clone()];
        assert_eq!(first_failure(&all, 0), None);
        let (r, why) = first_failure(&all, 1).expect("rank 1's part 1 failed");
        assert_eq!(r, 1);
        assert!(why.contains("no pinned memory"), "{why}");
        // Fewer records than asked for, or garbage, is a failure, not a pass.
        assert!(failed(&record(&ok, |_| vec![]), 1).is_some());
        assert!(failed(&[], 0).is_some());
        assert!(failed(&[1, 9, 0, 0, 0, 1], 0).is_some());
    }

    #[test]
    fn a_failure_reaches_every_rank_named_as_the_caller_numbers_ranks() {
        // Two ranks simulated by one exchange: rank 1 failed.
        let failed_one = record::<()>(&Err(Error::invalid("no GPU")), |_| vec![]);
        let mut ex =
            |m: &[u8]| -> Result<Vec<Vec<u8>>> { Ok(vec![m.to_vec(), failed_one.clone()]) };
        let e = agree(Ok(5u8), &mut ex, &|x| x, |v| vec![*v]).unwrap_err();
        assert!(e.to_string().contains("rank 1 failed GPU setup"), "{e}");
        assert!(e.to_string().contains("no GPU"), "{e}");
        // Index 1 of this exchange is rank 7 of the communicator: errors use that number.
        let e = agree(Ok(5u8), &mut ex, &|x| [3, 7][x], |v| vec![*v]).unwrap_err();
        assert!(e.to_string().contains("rank 7 failed GPU setup"), "{e}");
        // Everyone worked: every payload comes back.
        let mut ex = |m: &[u8]| -> Result<Vec<Vec<u8>>> { Ok(vec![m.to_vec(), m.to_vec()]) };
        let (v, all) = agree(Ok(5u8), &mut ex, &|x| x, |v| vec![*v]).unwrap();
        assert_eq!((v, all), (5, vec![vec![5], vec![5]]));
    }
}
