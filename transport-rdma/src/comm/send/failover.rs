//! The sending end after a queue pair died: which pieces to write again, the questions that
//! find out, stalls, and what `state()` says about the rails.

use super::*;

impl RdmaSendComm {
    /// A write of piece `p` of message `seq` failed on queue pair `q`, which is dead now. It
    /// may have arrived all the same (its acknowledgement lost): the receiver is asked, and
    /// only what it lacks is written again, on a live queue pair, while its receive is still
    /// offered (a late second copy could land in a buffer already handed back).
    pub(super) fn piece_failed(&mut self, q: usize, seq: u64, p: usize) {
        let Some(i) = self.find(seq) else { return };
        let w = &mut self.inflight[i];
        if let Some(piece) = w.pieces.get_mut(p) {
            if !piece.done && piece.qp == q {
                piece.qp = ASKING;
                piece.lost_on = q;
                if !w.asked {
                    w.asked = true;
                    self.queries.push_back(w.seq);
                }
            }
        }
    }

    /// The receiver's answer about message `seq`: the pieces it has (`word`'s low 16 bits), or
    /// `ANSWER_DONE`, with the queue pairs closed there (`closed`). The missing pieces lost on
    /// a closed queue pair are written again; one lost on a queue pair the receiver had not
    /// closed yet could still land, so it is asked about again.
    pub(super) fn answered(&mut self, seq: u32, word: u32, closed: u32) {
        let Some(i) = self
            .inflight
            .iter()
            .position(|w| w.seq as u32 & SEQ_MASK == seq)
        else {
            return;
        };
        let w = &mut self.inflight[i];
        let mut open = false;
        for (p, piece) in w.pieces.iter_mut().enumerate() {
            if piece.qp != ASKING {
                continue;
            }
            if word & ANSWER_DONE != 0 || word & (1 << p) != 0 {
                piece.done = true;
                w.left -= 1;
            } else if closed & (1 << piece.lost_on.min(31)) != 0 {
                piece.qp = UNPLACED;
                self.resend.push_back((w.seq, p));
            } else {
                open = true;
            }
        }
        if open {
            self.queries.push_back(w.seq);
        } else {
            w.asked = false;
        }
        if w.left == 0 {
            self.finish(i);
        }
    }

    /// Sends the questions queued by `piece_failed` and the mismatch reports to send again,
    /// on the first live queue pair.
    pub(super) fn ask(&mut self) -> Result<()> {
        loop {
            let Some(c) = self.link.ctrl_qp() else {
                return Ok(());
            };
            if self.sq_used[c] >= DEPTH || self.link.ctrl.free_tx.is_empty() {
                return Ok(());
            }
            if let Some(q) = self.link.tell_peer()? {
                self.sq_used[q] += 1;
                continue;
            }
            if let Some(seq) = self.rereport.pop_front() {
                if let Some(&(tag, len)) = self.reports.get(&seq) {
                    self.report(seq, &tag, len)?;
                }
                continue;
            }
            let Some(seq) = self.queries.pop_front() else {
                return Ok(());
            };
            if self.find(seq & WR_SEQ).is_none() {
                continue; // done meanwhile
            }
            let Some(slot) = self.link.ctrl.free_tx.pop() else {
                return Ok(());
            };
            // The question carries the queue pairs found dead here (a mask): the receiver
            // closes them before it answers.
            let mask = self.link.dead_mask();
            let q = self.link.send_words(
                slot,
                [mask, 0],
                CTRL_QUERY,
                seq as u32 & SEQ_MASK,
                TxUse::Query(seq),
            )?;
            self.sq_used[q] += 1;
        }
    }

    /// Tells the receiver that message `seq` does not match: we send `tag`, `len` bytes.
    pub(super) fn report(&mut self, seq: u64, tag: &MsgTag, len: u64) -> Result<()> {
        let Some(slot) = self.link.ctrl.free_tx.pop() else {
            self.rereport.push_back(seq);
            return Ok(());
        };
        encode_tag_len(self.link.ctrl.tx_mut(slot), tag, len);
        let imm = ERR_BIT | (CTRL_MISMATCH << PIECE_SHIFT) | (seq as u32 & SEQ_MASK);
        let q = self
            .link
            .send_ctrl(slot, (TAG_BYTES + 8) as u32, imm, TxUse::Report(seq))?;
        self.sq_used[q] += 1;
        self.reports.insert(seq, (*tag, len));
        Ok(())
    }

    /// A queue pair that stopped acknowledging (writes, or control messages) is given up
    /// on: moved to the error state, so its writes come back flushed and are asked about;
    /// the receiver is told to close its end too, so nothing late lands after its answer.
    /// Without failover the stall is the connection's error, naming the port.
    pub(super) fn check_stalls(&mut self) -> Result<()> {
        let now = std::time::Instant::now();
        if self.link.nqps() < 2 {
            return Ok(());
        }
        for q in 0..self.link.nqps() {
            if self.link.dead[q] {
                continue;
            }
            let Some(idle) = self.meter.stalled(q, now) else {
                continue;
            };
            let why = format!(
                "has had writes unacknowledged for {:.1} s (its port or link is down?)",
                idle.as_secs_f64()
            );
            self.link.stalled(q, &why)?;
        }
        self.link.check_ctrl_stalls(now)
    }

    /// Writes again the missing pieces whose queue pair died, on the fastest live one.
    pub(super) fn resend_pieces(&mut self) -> Result<()> {
        while let Some(&(seq, p)) = self.resend.front() {
            let Some(i) = self.inflight.iter().position(|w| w.seq == seq) else {
                self.resend.pop_front();
                continue;
            };
            let best = rails::fastest_live(&self.live(), &self.meter.weights);
            let Some(q) = best else {
                let e = Error::new(
                    ErrorKind::PeerClosed,
                    format!("every queue pair to rank {} is down", self.link.peer),
                );
                return Err(self.link.fail(e));
            };
            if self.sq_used[q] + self.inflight[i].pieces[p].wrs > DEPTH {
                break;
            }
            self.resend.pop_front();
            self.post_piece(i, p, q)?;
        }
        Ok(())
    }

    /// With several queue pairs: their shares of each message, and which are dead.
    pub(super) fn rails_state(&self) -> String {
        if self.link.nqps() < 2 {
            return String::new();
        }
        let dead: Vec<usize> = (0..self.link.nqps())
            .filter(|&q| self.link.dead[q])
            .collect();
        format!(
            "; queue pairs on {} device(s), shares (measured) {}{}",
            self.link.devs.len(),
            self.meter.shares(),
            if dead.is_empty() {
                String::new()
            } else {
                format!(", dead {dead:?}")
            }
        )
    }
}
