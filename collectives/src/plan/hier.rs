//! Hierarchical all-reduce for H hosts of L ranks each, built for a rank's position in host
//! order (host h holds positions h*L .. h*L+L, `build_ordered` maps them back to ranks):
//! 1. reduce-scatter inside each host, a ring of its L ranks: local rank l ends with segment
//!    (l+1) mod L summed over its host;
//! 2. L all-reduces across hosts at once, one per local index, each a ring of the H ranks that
//!    hold the same segment (rail l meets rail l, so every rank's NIC carries 1/L of the data);
//! 3. all-gather inside each host.
//!
//! Between hosts each rank sends `2 (H-1)/H * n/L` elements, L times less than a flat ring's
//! rank on the host edge. On GPUs phases 1 and 3 are the NVLink kernels' work; here they run
//! on the host path so the simulator and the reference check the whole schedule.
//! With one host or one rank per host it is the ring.

use super::*;
use std::collections::BTreeMap;

/// Which steps last wrote, and have read since, each range of the receive buffer. Ranges are
/// chunks, so a lookup scans only the entries starting within the longest chunk before it.
#[derive(Default)]
struct Track {
    entries: BTreeMap<(usize, usize), (Option<usize>, Vec<usize>)>,
    longest: usize,
}

type Entry<'a> = (&'a (usize, usize), &'a (Option<usize>, Vec<usize>));

impl Track {
    fn overlapping(&self, r: &Range<usize>) -> impl Iterator<Item = Entry<'_>> {
        let r = r.clone();
        self.entries
            .range((r.start.saturating_sub(self.longest), 0)..(r.end, 0))
            .filter(move |(k, _)| k.0 < r.end && r.start < k.1)
    }

    /// What a read of `r` waits for: the writers of anything overlapping it.
    fn read_deps(&self, r: Range<usize>) -> Vec<usize> {
        self.overlapping(&r).filter_map(|(_, e)| e.0).collect()
    }

    /// What a write of `r` waits for: every earlier writer and reader of it.
    fn write_deps(&self, r: Range<usize>) -> Vec<usize> {
        self.overlapping(&r)
            .flat_map(|(_, e)| e.0.into_iter().chain(e.1.iter().copied()))
            .collect()
    }

    fn read(&mut self, r: Range<usize>, step: usize) {
        self.longest = self.longest.max(r.len());
        self.entries
            .entry((r.start, r.end))
            .or_default()
            .1
            .push(step);
    }

    /// Records a write; entries it covers are dropped (whoever depends on it waits for them).
    fn write(&mut self, r: Range<usize>, step: usize) {
        self.longest = self.longest.max(r.len());
        let covered: Vec<(usize, usize)> = self
            .overlapping(&r)
            .map(|(k, _)| *k)
            .filter(|k| r.start <= k.0 && k.1 <= r.end)
            .collect();
        for k in covered {
            self.entries.remove(&k);
        }
        self.entries
            .insert((r.start, r.end), (Some(step), Vec::new()));
    }
}

/// A position among H hosts of L ranks each: host h, local index l (position h*L + l).
#[derive(Clone, Copy)]
struct Grid {
    lr: usize,
    hosts: usize,
    h: usize,
    l: usize,
}

impl Grid {
    /// None unless the job is several hosts of several ranks each (then the flat plan runs).
    fn of(p: usize, local: usize, r: usize) -> Option<Grid> {
        (local > 1 && local < p && p.is_multiple_of(local)).then_some(Grid {
            lr: local,
            hosts: p / local,
            h: r / local,
            l: r % local,
        })
    }

    /// The position of local index `idx` on host `host` (both taken modulo their counts).
    fn at(&self, host: usize, idx: usize) -> usize {
        (host % self.hosts) * self.lr + idx % self.lr
    }

    /// (next, previous) in the ring inside this host.
    fn local_ring(&self) -> (usize, usize) {
        (
            self.at(self.h, self.l + 1),
            self.at(self.h, self.l + self.lr - 1),
        )
    }

    /// For a rooted call: (this host's place in the chain of hosts from the root's, this
    /// rank's place in its host's chain from the root's local index, that index).
    fn chains(&self, root: usize) -> (usize, usize, usize) {
        let (hr, l0) = (root / self.lr, root % self.lr);
        (
            (self.h + self.hosts - hr) % self.hosts,
            (self.l + self.lr - l0) % self.lr,
            l0,
        )
    }

    /// (next, previous) in the ring across hosts of this local index.
    fn host_ring(&self) -> (usize, usize) {
        (
            self.at(self.h + 1, self.l),
            self.at(self.h + self.hosts - 1, self.l),
        )
    }
}

/// The plan of position `r` of `a.nranks` in host order, with `local` ranks per host.
pub(super) fn hier_all_reduce(a: &CollArgs, r: usize, o: &PlanOpts, local: usize) -> Plan {
    let (p, n, ch) = (a.nranks, a.count, o.chunk_elems.max(1));
    let grid = Grid::of(p, local, r);
    let Some(g) = grid else {
        return ring_all_reduce(a, r, o);
    };
    let Grid { lr, hosts, h, l } = g;
    let mut b = Builder::new(ch, o.window);
    let mut t = Track::default();
    let seg = |j: usize| segment(n, lr, j % lr);
    let ((lnext, lprev), (hnext, hprev)) = (g.local_ring(), g.host_ring());

    // Sends `len` elements at `off` of the receive buffer (or the input when `input`).
    let send =
        |b: &mut Builder, t: &mut Track, peer: usize, off: usize, len: usize, input: bool| {
            let buf = if input { Buf::Send } else { Buf::Recv };
            // The input is the receive buffer itself in place, so its reads are tracked too.
            let tracked = !input || o.in_place;
            let deps = if tracked {
                t.read_deps(off..off + len)
            } else {
                vec![]
            };
            let st = b.push(
                Op::Send {
                    peer,
                    src: Slice::new(buf, off, len),
                },
                deps,
            );
            if tracked {
                t.read(off..off + len, st);
            }
        };
    // Receives a chunk into scratch and folds it into the receive buffer: `recv = x op in`,
    // where x is the input (phase 1) or the receive buffer (phase 2).
    let fold =
        |b: &mut Builder, t: &mut Track, peer: usize, off: usize, len: usize, input: bool| {
            let (slot, incoming, rv) = b.recv_to_scratch(peer, len);
            let dst = Slice::new(Buf::Recv, off, len);
            let x = if input {
                Slice::new(Buf::Send, off, len)
            } else {
                dst
            };
            let mut deps = vec![rv];
            deps.extend(t.write_deps(off..off + len));
            let red = b.push(
                Op::Reduce {
                    dst,
                    a: x,
                    b: incoming,
                },
                deps,
            );
            b.release(slot, vec![rv, red]);
            t.write(off..off + len, red);
        };
    // Receives a chunk straight into the receive buffer.
    let take = |b: &mut Builder, t: &mut Track, peer: usize, off: usize, len: usize| {
        let rv = b.push(
            Op::Recv {
                peer,
                dst: Slice::new(Buf::Recv, off, len),
            },
            t.write_deps(off..off + len),
        );
        t.write(off..off + len, rv);
    };

    // 1. Reduce-scatter inside the host.
    for s in 0..lr - 1 {
        let (si, ri) = ((l + lr - s) % lr, (l + 2 * lr - s - 1) % lr);
        let (so, sl) = seg(si);
        for (off, len) in chunks(so, sl, ch) {
            send(&mut b, &mut t, lnext, off, len, s == 0);
        }
        let (ro, rl) = seg(ri);
        for (off, len) in chunks(ro, rl, ch) {
            fold(&mut b, &mut t, lprev, off, len, true);
        }
    }
    // 2. All-reduce of the owned segment across hosts (ring reduce-scatter, then all-gather).
    let (oo, ol) = seg(l + 1);
    let sub = |j: usize| {
        let (x, y) = segment(ol, hosts, j % hosts);
        (oo + x, y)
    };
    for s in 0..hosts - 1 {
        let (si, ri) = ((h + hosts - s) % hosts, (h + 2 * hosts - s - 1) % hosts);
        for (off, len) in chunks(sub(si).0, sub(si).1, ch) {
            send(&mut b, &mut t, hnext, off, len, false);
        }
        for (off, len) in chunks(sub(ri).0, sub(ri).1, ch) {
            fold(&mut b, &mut t, hprev, off, len, false);
        }
    }
    // Avg: the part this rank now holds summed over every rank is divided here, once.
    if a.op == ReduceOp::Avg {
        let (fo, fl) = sub(h + 1);
        for (off, len) in chunks(fo, fl, ch) {
            let d = b.push(
                Op::Divide {
                    buf: Slice::new(Buf::Recv, off, len),
                },
                t.write_deps(off..off + len),
            );
            t.write(off..off + len, d);
        }
    }
    for s in 0..hosts - 1 {
        let (si, ri) = ((h + 1 + hosts - s) % hosts, (h + hosts - s) % hosts);
        for (off, len) in chunks(sub(si).0, sub(si).1, ch) {
            send(&mut b, &mut t, hnext, off, len, false);
        }
        for (off, len) in chunks(sub(ri).0, sub(ri).1, ch) {
            take(&mut b, &mut t, hprev, off, len);
        }
    }
    // 3. All-gather inside the host.
    for s in 0..lr - 1 {
        let (si, ri) = ((l + 1 + lr - s) % lr, (l + lr - s) % lr);
        for (off, len) in chunks(seg(si).0, seg(si).1, ch) {
            send(&mut b, &mut t, lnext, off, len, false);
        }
        for (off, len) in chunks(seg(ri).0, seg(ri).1, ch) {
            take(&mut b, &mut t, lprev, off, len);
        }
    }
    b.finish(Algo::Hier(local))
}

/// Hierarchical all-gather (`count` elements per rank, blocks in host order): first across
/// hosts, one ring per local index (rank (h, l) gathers the blocks of every (h', l)), then
/// inside each host (each local rank passes on its column of H blocks). Each rank sends
/// (H-1) blocks between hosts, not a ring's host-edge rank's (p-1).
pub(super) fn hier_all_gather(a: &CollArgs, r: usize, o: &PlanOpts, local: usize) -> Plan {
    let (p, c, ch) = (a.nranks, a.count, o.chunk_elems.max(1));
    let grid = Grid::of(p, local, r);
    let Some(g) = grid else {
        return ring_all_gather(a, r, o);
    };
    let Grid { lr, hosts, h, l } = g;
    let mut b = Builder::new(0, 1);
    let mut t = Track::default();
    let at = |host: usize, idx: usize| g.at(host, idx);
    let ((lnext, lprev), (hnext, hprev)) = (g.local_ring(), g.host_ring());
    let block = |v: usize| v * c;
    // This rank's own block: from the input (in place it is already there).
    if let Some(cp) = copy_if_needed(
        &mut b,
        o,
        Slice::new(Buf::Recv, block(r), c),
        Slice::new(Buf::Send, 0, c),
        vec![],
    ) {
        // In place the block is already there and nothing waits for it.
        t.write(block(r)..block(r) + c, cp);
    }
    let send = |b: &mut Builder, t: &mut Track, peer: usize, v: usize| {
        for (off, len) in chunks(block(v), c, ch) {
            let st = b.push(
                Op::Send {
                    peer,
                    src: Slice::new(Buf::Recv, off, len),
                },
                t.read_deps(off..off + len),
            );
            t.read(off..off + len, st);
        }
    };
    let take = |b: &mut Builder, t: &mut Track, peer: usize, v: usize| {
        for (off, len) in chunks(block(v), c, ch) {
            let rv = b.push(
                Op::Recv {
                    peer,
                    dst: Slice::new(Buf::Recv, off, len),
                },
                t.write_deps(off..off + len),
            );
            t.write(off..off + len, rv);
        }
    };
    // 1. Across hosts: the blocks of local index l.
    for s in 0..hosts - 1 {
        let (si, ri) = ((h + hosts - s) % hosts, (h + 2 * hosts - s - 1) % hosts);
        send(&mut b, &mut t, hnext, at(si, l));
        take(&mut b, &mut t, hprev, at(ri, l));
    }
    // 2. Inside the host: columns of H blocks.
    for s in 0..lr - 1 {
        let (si, ri) = ((l + lr - s) % lr, (l + 2 * lr - s - 1) % lr);
        for hh in 0..hosts {
            send(&mut b, &mut t, lnext, at(hh, si));
        }
        for hh in 0..hosts {
            take(&mut b, &mut t, lprev, at(hh, ri));
        }
    }
    b.finish(Algo::Hier(local))
}

/// Hierarchical reduce-scatter (`count` elements out per rank; the input's blocks in host
/// order): inside each host first, local rank l summing column l (the blocks of every
/// (h', l)) over its host into scratch, then across hosts one ring per local index, rank
/// (h, l) ending with block (h, l) summed over every rank. Each rank sends (H-1) blocks
/// between hosts.
pub(super) fn hier_reduce_scatter(a: &CollArgs, r: usize, o: &PlanOpts, local: usize) -> Plan {
    let (p, c, ch) = (a.nranks, a.count, o.chunk_elems.max(1));
    let grid = Grid::of(p, local, r);
    let Some(g) = grid else {
        return ring_reduce_scatter(a, r, o);
    };
    let Grid { lr, hosts, h, l } = g;
    let mut b = Builder::new(ch, o.window);
    // Scratch: [0, H*c) this rank's column between the phases, then two areas of H*c for the
    // partial sums passed on in phase 1 (step s writes area s mod 2 while area (s-1) mod 2 is
    // sent), then the receive slots.
    let col = hosts * c;
    b.scratch_base = 3 * col;
    let mut store = Track::default();
    let mut out = Track::default();
    let at = |host: usize, idx: usize| g.at(host, idx);
    let ((lnext, lprev), (hnext, hprev)) = (g.local_ring(), g.host_ring());
    let input = |v: usize, y: usize, len: usize| Slice::new(Buf::Send, v * c + y, len);
    // In place this rank's own input block is the output: its reads are tracked there.
    let own = |v: usize| o.in_place && v == r;
    let area = |s: usize| col * (1 + s % 2);

    // 1. Inside the host: column (l - 1 - s) goes on at step s; column l stays.
    for s in 0..lr - 1 {
        let (si, ri) = ((l + lr - 1 - s) % lr, (l + 2 * lr - 2 - s) % lr);
        for hh in 0..hosts {
            for (y, len) in chunks(0, c, ch) {
                if s == 0 {
                    let v = at(hh, si);
                    let deps = if own(v) {
                        out.read_deps(y..y + len)
                    } else {
                        vec![]
                    };
                    let st = b.push(
                        Op::Send {
                            peer: lnext,
                            src: input(v, y, len),
                        },
                        deps,
                    );
                    if own(v) {
                        out.read(y..y + len, st);
                    }
                } else {
                    let off = area(s - 1) + hh * c + y;
                    let st = b.push(
                        Op::Send {
                            peer: lnext,
                            src: Slice::new(Buf::Scratch, off, len),
                        },
                        store.read_deps(off..off + len),
                    );
                    store.read(off..off + len, st);
                }
            }
        }
        for hh in 0..hosts {
            for (y, len) in chunks(0, c, ch) {
                let (islot, incoming, rv) = b.recv_to_scratch(lprev, len);
                let v = at(hh, ri);
                let mut deps = vec![rv];
                if own(v) {
                    deps.extend(out.read_deps(y..y + len));
                }
                let base = if s == lr - 2 { 0 } else { area(s) };
                let dst = Slice::new(Buf::Scratch, base + hh * c + y, len);
                deps.extend(store.write_deps(dst.off..dst.off + len));
                let red = b.push(
                    Op::Reduce {
                        dst,
                        a: input(v, y, len),
                        b: incoming,
                    },
                    deps,
                );
                if own(v) {
                    out.read(y..y + len, red);
                }
                b.release(islot, vec![rv, red]);
                store.write(dst.off..dst.off + len, red);
            }
        }
    }
    // 2. Across hosts, on column l: block (h - 1 - s) goes on at step s; block h stays.
    for s in 0..hosts - 1 {
        let (si, ri) = ((h + hosts - 1 - s) % hosts, (h + 2 * hosts - 2 - s) % hosts);
        for (y, len) in chunks(0, c, ch) {
            let off = si * c + y;
            let st = b.push(
                Op::Send {
                    peer: hnext,
                    src: Slice::new(Buf::Scratch, off, len),
                },
                store.read_deps(off..off + len),
            );
            store.read(off..off + len, st);
        }
        for (y, len) in chunks(0, c, ch) {
            let off = ri * c + y;
            let (islot, incoming, rv) = b.recv_to_scratch(hprev, len);
            let part = Slice::new(Buf::Scratch, off, len);
            let mut deps = vec![rv];
            if s == hosts - 2 {
                deps.extend(store.read_deps(off..off + len));
                deps.extend(out.write_deps(y..y + len));
                let dst = Slice::new(Buf::Recv, y, len);
                let (red, last) = b.reduce_last(dst, part, incoming, deps, a.op == ReduceOp::Avg);
                store.read(off..off + len, red);
                out.write(y..y + len, last);
                b.release(islot, vec![rv, red]);
            } else {
                deps.extend(store.write_deps(off..off + len));
                let red = b.push(
                    Op::Reduce {
                        dst: part,
                        a: part,
                        b: incoming,
                    },
                    deps,
                );
                store.write(off..off + len, red);
                b.release(islot, vec![rv, red]);
            }
        }
    }
    b.finish(Algo::Hier(local))
}

/// Hierarchical broadcast: a chain across hosts through the ranks with the root's local
/// index, each forwarding every chunk down a chain inside its host as it arrives. The data
/// crosses each host boundary once.
pub(super) fn hier_broadcast(a: &CollArgs, r: usize, o: &PlanOpts, local: usize) -> Plan {
    let (p, n, ch) = (a.nranks, a.count, o.chunk_elems.max(1));
    let grid = Grid::of(p, local, r).filter(|_| a.root < p);
    let Some(g) = grid else {
        return chain_broadcast(a, r, o);
    };
    let Grid { lr, hosts, h, l } = g;
    let at = |host: usize, idx: usize| g.at(host, idx);
    let (hi, li, l0) = g.chains(a.root);
    let head = l == l0;
    let mut b = Builder::new(0, 1);
    for (off, len) in chunks(0, n, ch) {
        let have: Vec<usize> = if r == a.root {
            copy_if_needed(
                &mut b,
                o,
                Slice::new(Buf::Recv, off, len),
                Slice::new(Buf::Send, off, len),
                vec![],
            )
            .into_iter()
            .collect()
        } else {
            let from = if head {
                at((h + hosts - 1) % hosts, l0)
            } else {
                at(h, (l + lr - 1) % lr)
            };
            vec![b.push(
                Op::Recv {
                    peer: from,
                    dst: Slice::new(Buf::Recv, off, len),
                },
                vec![],
            )]
        };
        // The root reads its input; everyone else what it received.
        let src = if r == a.root {
            Slice::new(Buf::Send, off, len)
        } else {
            Slice::new(Buf::Recv, off, len)
        };
        let deps = if r == a.root { vec![] } else { have };
        if head && hi + 1 < hosts {
            b.push(
                Op::Send {
                    peer: at((h + 1) % hosts, l0),
                    src,
                },
                deps.clone(),
            );
        }
        if li + 1 < lr {
            b.push(
                Op::Send {
                    peer: at(h, (l + 1) % lr),
                    src,
                },
                deps,
            );
        }
    }
    b.finish(Algo::Hier(local))
}

/// Hierarchical reduce: a chain inside each host toward the rank with the root's local index
/// (its host's sum), then a chain across hosts through those ranks toward the root. Partial
/// sums stay in scratch (the whole count: a rank holds its host's sum between the phases);
/// only the root's receive buffer is written.
pub(super) fn hier_reduce(a: &CollArgs, r: usize, o: &PlanOpts, local: usize) -> Plan {
    let (p, n, ch) = (a.nranks, a.count, o.chunk_elems.max(1));
    let grid = Grid::of(p, local, r).filter(|_| a.root < p);
    let Some(g) = grid else {
        return chain_reduce(a, r, o);
    };
    let Grid { lr, hosts, h, l } = g;
    let at = |host: usize, idx: usize| g.at(host, idx);
    let (hi, li, l0) = g.chains(a.root);
    let head = l == l0;
    let mut b = Builder::new(ch, o.window);
    // Scratch [0, n): this rank's partial sum; receive slots after it.
    b.scratch_base = n;
    for (off, len) in chunks(0, n, ch) {
        let mine = Slice::new(Buf::Send, off, len);
        let part = Slice::new(Buf::Scratch, off, len);
        // 1. Inside the host, from the chain's tail toward the head.
        let mut have: Option<(Slice, usize)> = None;
        if li + 1 < lr {
            let (slot, incoming, rv) = b.recv_to_scratch(at(h, (l + 1) % lr), len);
            let red = b.push(
                Op::Reduce {
                    dst: part,
                    a: mine,
                    b: incoming,
                },
                vec![rv],
            );
            b.release(slot, vec![rv, red]);
            have = Some((part, red));
        }
        if !head {
            let (src, deps) = have.map_or((mine, vec![]), |(s, d)| (s, vec![d]));
            b.push(
                Op::Send {
                    peer: at(h, (l + lr - 1) % lr),
                    src,
                },
                deps,
            );
            continue;
        }
        // 2. Across hosts, from the last host toward the root's.
        if hi + 1 < hosts {
            let (slot, incoming, rv) = b.recv_to_scratch(at((h + 1) % hosts, l0), len);
            let (x, mut deps) = have.map_or((mine, vec![]), |(s, d)| (s, vec![d]));
            deps.push(rv);
            let dst = if r == a.root {
                Slice::new(Buf::Recv, off, len)
            } else {
                part
            };
            let (red, last) =
                b.reduce_last(dst, x, incoming, deps, r == a.root && a.op == ReduceOp::Avg);
            b.release(slot, vec![rv, red]);
            have = Some((dst, last));
        }
        if r != a.root {
            let (src, deps) = have.map_or((mine, vec![]), |(s, d)| (s, vec![d]));
            b.push(
                Op::Send {
                    peer: at((h + hosts - 1) % hosts, l0),
                    src,
                },
                deps,
            );
        }
    }
    b.finish(Algo::Hier(local))
}
