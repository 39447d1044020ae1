//! The frame header that starts every part of every message on every stream, and the
//! deterministic split of a message over streams that both ends compute: in proportion to
//! each stream's weight, which the sender declares when it connects (its rail's bandwidth)
//! and, when it measures its rails, changes with a `Weights` frame on every stream.

use railcc_core::net::{MsgTag, TAG_BYTES};
use railcc_core::{Error, ErrorKind, Result};

pub const MAGIC: u32 = 0x3146_4352; // "RCF1"
pub const HEADER_BYTES: usize = 80;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A part of a message, where the split puts it.
    Data,
    /// The undelivered rest of a part cut off by a lost rail, on a surviving stream.
    Repair,
    /// Stream `part` is lost: read it up to byte `total` of the stream and no further; from
    /// message `seq` on, messages are split over the streams still alive (epoch `epoch`).
    RailDown,
    /// From message `seq` on, the streams' weights are these (`nparts` of them, one u16 each
    /// where a data header has its tag; [`weights_frame`]). Sent on every stream before its
    /// part of message `seq`, so each stream reads it before any part it governs.
    Weights,
    /// The sender failed and closes: bytes [`ABORT_TEXT`] of the header say why (the first
    /// failure of the job, passed on unchanged by every rank it brings down).
    Abort,
}

/// Where an abort frame carries its text (in place of tag, total, offset and length).
pub const ABORT_TEXT: std::ops::Range<usize> = 16..72;

/// Marks, in an error's text, the first failure an abort frame reported.
pub const FIRST_FAILURE: &str = "first failure: ";

/// An abort frame saying `reason` (cut to fit, at a character boundary). When `reason` holds
/// a first failure reported by an earlier abort frame, that is what is passed on.
pub fn abort_frame(reason: &str) -> [u8; HEADER_BYTES] {
    let compact;
    let text = match reason.split_once(FIRST_FAILURE) {
        Some((_, first)) => first,
        None => {
            compact = compact_reason(reason);
            &compact
        }
    };
    let mut end = text.len().min(ABORT_TEXT.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut b = [0u8; HEADER_BYTES];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[ABORT_TEXT.start..ABORT_TEXT.start + end].copy_from_slice(&text.as_bytes()[..end]);
    b[76..80].copy_from_slice(&3u32.to_le_bytes());
    b
}

/// "railcc peer closed (rank 1, peer 0, op all_reduce step 33, transport tcp): rail r1b
/// lost ..." -> "rank 1, peer 0: rail r1b lost ...": who and why first, to fit the frame.
fn compact_reason(reason: &str) -> String {
    let who = reason
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(ctx, _)| {
            ctx.split(", ")
                .filter(|f| f.starts_with("rank ") || f.starts_with("peer "))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let why = reason
        .split_once("): ")
        .map_or(reason.strip_prefix("railcc ").unwrap_or(reason), |(_, m)| m);
    if who.is_empty() {
        why.to_string()
    } else {
        format!("{who}: {why}")
    }
}

/// The text of an abort frame (bytes that are not UTF-8 are replaced).
pub fn abort_text(b: &[u8; HEADER_BYTES]) -> String {
    let t = &b[ABORT_TEXT];
    let end = t.iter().position(|&c| c == 0).unwrap_or(t.len());
    String::from_utf8_lossy(&t[..end]).into_owned()
}

/// Header of one part: `magic | part u16 | nparts u16 | seq u64 | tag 32 | total u64 | off u64
/// | len u64 | epoch u32 | kind u32`. `epoch` counts the rails lost before the part was split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub part: u16,
    pub nparts: u16,
    pub seq: u64,
    pub tag: MsgTag,
    pub total: u64,
    pub off: u64,
    pub len: u64,
    pub epoch: u32,
    pub kind: Kind,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.part.to_le_bytes());
        b[6..8].copy_from_slice(&self.nparts.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..48].copy_from_slice(&self.tag.encode());
        b[48..56].copy_from_slice(&self.total.to_le_bytes());
        b[56..64].copy_from_slice(&self.off.to_le_bytes());
        b[64..72].copy_from_slice(&self.len.to_le_bytes());
        b[72..76].copy_from_slice(&self.epoch.to_le_bytes());
        let kind: u32 = match self.kind {
            Kind::Data => 0,
            Kind::Repair => 1,
            Kind::RailDown => 2,
            Kind::Abort => 3,
            Kind::Weights => 4,
        };
        b[76..80].copy_from_slice(&kind.to_le_bytes());
        b
    }

    /// Parses without trusting anything: only the magic is checked here; [`Header::check`]
    /// checks the rest against what the receiver expects.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Header> {
        let u64at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if magic != MAGIC {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("bad frame magic {magic:#010x}"),
            ));
        }
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(&b[16..48]);
        let u32at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let kind = match u32at(76) {
            0 => Kind::Data,
            1 => Kind::Repair,
            2 => Kind::RailDown,
            3 => Kind::Abort,
            4 => Kind::Weights,
            k => {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("unknown frame kind {k}"),
                ))
            }
        };
        Ok(Header {
            epoch: u32at(72),
            kind,
            part: u16::from_le_bytes([b[4], b[5]]),
            nparts: u16::from_le_bytes([b[6], b[7]]),
            seq: u64at(8),
            tag: MsgTag::decode(&tag),
            total: u64at(48),
            off: u64at(56),
            len: u64at(64),
        })
    }

    /// Checks a header that arrived on `stream` against the receive posted for its sequence.
    pub fn check(
        &self,
        stream: usize,
        weights: &[u32],
        expect: &MsgTag,
        posted_len: u64,
        stripe_min: usize,
        max_message: u64,
    ) -> Result<()> {
        let proto = |m: String| Err(Error::new(ErrorKind::Protocol, m));
        if self.total > max_message {
            return proto(format!(
                "peer announced a {}-byte message, bound is {max_message}",
                self.total
            ));
        }
        if self.tag != *expect {
            return Err(MsgTag::mismatch(expect, &self.tag));
        }
        if self.total != posted_len {
            let elem = railcc_core::DataType::from_u8(expect.dtype).map_or(1, |d| d.size() as u64);
            return Err(Error::new(
                ErrorKind::Mismatch,
                format!(
                    "size differs: peer sent {} bytes ({} elements), this rank expected {} bytes ({} elements)",
                    self.total,
                    self.total / elem,
                    posted_len,
                    posted_len / elem
                ),
            ));
        }
        let nparts = nparts(self.total as usize, weights.len(), stripe_min);
        let (off, len) = split(self.total as usize, &weights[..nparts], stream);
        if self.part as usize != stream
            || self.nparts as usize != nparts
            || self.off != off as u64
            || self.len != len as u64
        {
            return proto(format!(
                "bad split on stream {stream}: part {}/{} at {}+{}, expected part {stream}/{nparts} at {off}+{len}",
                self.part, self.nparts, self.off, self.len
            ));
        }
        Ok(())
    }
}

/// The most streams a `Weights` frame describes (one u16 each in bytes 16..72).
pub const MAX_WEIGHTED_STREAMS: usize = 28;

/// A `Weights` frame: from message `seq` on, stream i weighs `weights[i]` (1 to 65535).
pub fn weights_frame(seq: u64, weights: &[u16]) -> [u8; HEADER_BYTES] {
    let n = weights.len().min(MAX_WEIGHTED_STREAMS);
    let mut b = Header {
        part: 0,
        nparts: n as u16,
        seq,
        tag: MsgTag::decode(&[0; TAG_BYTES]),
        total: 0,
        off: 0,
        len: 0,
        epoch: 0,
        kind: Kind::Weights,
    }
    .encode();
    for (i, w) in weights[..n].iter().enumerate() {
        b[16 + 2 * i..18 + 2 * i].copy_from_slice(&w.max(&1).to_le_bytes());
    }
    b
}

/// The weights a `Weights` frame carries, checked: one per stream of `nstreams`, none zero.
pub fn weights_of(b: &[u8; HEADER_BYTES], h: &Header, nstreams: usize) -> Result<Vec<u32>> {
    let n = h.nparts as usize;
    if n != nstreams || n > MAX_WEIGHTED_STREAMS {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!("weights for {n} streams on a connection of {nstreams}"),
        ));
    }
    let w: Vec<u32> = (0..n)
        .map(|i| u16::from_le_bytes([b[16 + 2 * i], b[17 + 2 * i]]) as u32)
        .collect();
    if w.contains(&0) {
        return Err(Error::new(ErrorKind::Protocol, "a zero stream weight"));
    }
    Ok(w)
}

/// How many streams a message of `total` bytes uses.
pub fn nparts(total: usize, nstreams: usize, stripe_min: usize) -> usize {
    (total / stripe_min.max(1)).clamp(1, nstreams.max(1))
}

/// Byte range of part `i` when `total` bytes are split over parts of these weights (every
/// weight at least 1): part i starts at total × (weights before i) / (all weights). A part
/// past the end is empty.
pub fn split(total: usize, weights: &[u32], i: usize) -> (usize, usize) {
    let sum: u128 = weights
        .iter()
        .map(|&w| w.max(1) as u128)
        .sum::<u128>()
        .max(1);
    let at = |k: usize| {
        let before: u128 = weights[..k.min(weights.len())]
            .iter()
            .map(|&w| w.max(1) as u128)
            .sum();
        (total as u128 * before / sum) as usize
    };
    let off = at(i);
    (off, at(i + 1) - off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use railcc_core::call::CollKind;
    use railcc_core::DataType;

    proptest! {
        #[test]
        fn split_covers_exactly(total in 0usize..10_000_000, weights in proptest::collection::vec(1u32..100_000, 1..9), stripe in 1usize..1_000_000) {
            let n = nparts(total, weights.len(), stripe);
            prop_assert!(n >= 1 && n <= weights.len());
            let mut next = 0;
            for i in 0..n {
                let (off, len) = split(total, &weights[..n], i);
                prop_assert_eq!(off, next);
                next = off + len;
            }
            prop_assert_eq!(next, total);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), HEADER_BYTES)) {
            let mut b = [0u8; HEADER_BYTES];
            b.copy_from_slice(&bytes);
            if let Ok(h) = Header::decode(&b) {
                let tag = MsgTag::new(0, CollKind::AllReduce, DataType::F32, None, None, 0);
                let _ = h.check(0, &[1, 2, 3, 4], &tag, 1024, 4096, 1 << 30);
            }
        }
    }

    #[test]
    fn weighted_split_follows_the_weights() {
        // Rails of 800 and 400 Mb/s: two thirds and one third.
        assert_eq!(split(1200, &[800, 400], 0), (0, 800));
        assert_eq!(split(1200, &[800, 400], 1), (800, 400));
        assert_eq!(split(10, &[1, 1, 1], 2), (6, 4));
        assert_eq!(split(10, &[1, 1], 5), (10, 0));
    }

    #[test]
    fn header_round_trip_and_checks() {
        let tag = MsgTag::new(3, CollKind::AllReduce, DataType::F32, None, None, 10);
        let h = Header {
            part: 0,
            nparts: 1,
            seq: 9,
            tag,
            total: 40,
            off: 0,
            len: 40,
            epoch: 0,
            kind: Kind::Data,
        };
        let d = Header::decode(&h.encode()).unwrap();
        assert_eq!(d, h);
        d.check(0, &[1, 1], &tag, 40, 1024, 1 << 20).unwrap();
        assert_eq!(
            d.check(0, &[1, 1], &tag, 80, 1024, 1 << 20)
                .unwrap_err()
                .kind,
            ErrorKind::Mismatch
        );
        assert_eq!(
            d.check(0, &[1, 1], &tag, 40, 1024, 16).unwrap_err().kind,
            ErrorKind::Protocol
        );
        let mut bad = h.encode();
        bad[0] = 0;
        assert_eq!(Header::decode(&bad).unwrap_err().kind, ErrorKind::Protocol);
        let mut bad = h.encode();
        bad[76] = 9;
        assert_eq!(Header::decode(&bad).unwrap_err().kind, ErrorKind::Protocol);
        let r = Header {
            kind: Kind::RailDown,
            epoch: 1,
            ..h
        };
        assert_eq!(Header::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn abort_frames_carry_the_first_failure() {
        let f = abort_frame(
            "railcc peer closed (rank 3, peer 2, op all_reduce step 2, transport tcp): gone",
        );
        assert_eq!(Header::decode(&f).unwrap().kind, Kind::Abort);
        let t = abort_text(&f);
        assert_eq!(t, "rank 3, peer 2: gone");
        // A rank brought down by that frame passes on the first failure, not its own.
        let again = abort_frame(&format!(
            "railcc peer closed (rank 4, peer 3): {FIRST_FAILURE}{t}"
        ));
        assert_eq!(abort_text(&again), t);
        // Cut at a character boundary.
        let wide = abort_frame(&"é".repeat(40));
        assert_eq!(abort_text(&wide), "é".repeat(28));
    }
}
