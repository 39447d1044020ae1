//! Output in nccl-tests' layout (plus an `algo` column), a progress bar on a terminal, and
//! optional JSON.

use crate::args::BenchArgs;
use indicatif::{ProgressBar, ProgressStyle};
use railcc_collectives::plan::CollArgs;
use railcc_collectives::{CollKind, Communicator};
use serde::Serialize;
use std::io::IsTerminal;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    pub secs: f64,
    pub wrong: Option<u64>,
    pub oob: u64,
}

pub struct Row {
    pub bytes: u64,
    pub args: CollArgs,
    pub algo: &'static str,
    pub oop: Timing,
    pub ip: Timing,
}

#[derive(Serialize)]
struct JsonSide {
    time_us: f64,
    algbw_gbs: f64,
    busbw_gbs: f64,
    wrong: Option<u64>,
}

#[derive(Serialize)]
struct JsonRow {
    collective: &'static str,
    nranks: usize,
    size_bytes: u64,
    count: u64,
    dtype: &'static str,
    redop: &'static str,
    root: i64,
    algo: &'static str,
    out_of_place: JsonSide,
    in_place: JsonSide,
}

pub struct Report {
    lead: bool,
    coll: CollKind,
    nranks: usize,
    rows: Vec<JsonRow>,
    busbw_sum: f64,
    oob: u64,
    wrong: u64,
    json: Option<std::path::PathBuf>,
    bar: Option<ProgressBar>,
    title: String,
}

/// nccl-tests' bus-bandwidth factor: what each rank's links must carry relative to algbw.
pub fn bus_factor(coll: CollKind, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => (n - 1.0) / n,
        _ => 1.0,
    }
}

fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

/// The header's note on `--fill random` (exact inputs say nothing, as before).
pub fn fill_note(a: &BenchArgs) -> &'static str {
    match a.fill {
        railcc_collectives::precision::Fill::Exact => "",
        railcc_collectives::precision::Fill::Random => {
            ", random inputs (floats within the dtype's error bound, integers exact)"
        }
    }
}

impl Report {
    pub fn new(comm: &Communicator, a: &BenchArgs, coll: CollKind) -> Report {
        let c = comm.config();
        let title = format!(
            "# railcc bench {}: {} ranks, transport {}, {} stream(s) per peer, chunk {} B, algo {}{}{}",
            coll.name(),
            comm.nranks(),
            comm.transport(),
            c.nsocks_per_peer,
            c.chunk_bytes,
            c.algo,
            if a.device == "host" && a.register == 0 {
                ", buffers not registered (-R 0)"
            } else {
                ""
            },
            fill_note(a)
        );
        Report {
            lead: comm.rank() == 0,
            coll,
            nranks: comm.nranks(),
            rows: Vec::new(),
            busbw_sum: 0.0,
            oob: 0,
            wrong: 0,
            json: a.json.clone(),
            bar: None,
            title,
        }
    }

    pub fn header(&self) {
        if !self.lead {
            return;
        }
        println!("{}", self.title);
        println!("#");
        println!("#                                                              out-of-place                       in-place          ");
        println!("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong   algo");
        println!("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)           ");
    }

    pub fn start_progress(&mut self, total: u64) {
        if self.lead && std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} sizes {elapsed}")
            {
                bar.set_style(style);
            }
            self.bar = Some(bar);
        }
    }

    fn side(&self, bytes: u64, t: &Timing) -> (JsonSide, String) {
        let algbw = if t.secs > 0.0 {
            bytes as f64 / t.secs / 1e9
        } else {
            0.0
        };
        let busbw = algbw * bus_factor(self.coll, self.nranks);
        let wrong = t.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string());
        let us = t.secs * 1e6;
        let text = format!(
            "  {:>7}  {:>6.2}  {:>6.2}  {:>5}",
            fmt_time(us),
            algbw,
            busbw,
            wrong
        );
        (
            JsonSide {
                time_us: us,
                algbw_gbs: algbw,
                busbw_gbs: busbw,
                wrong: t.wrong,
            },
            text,
        )
    }

    pub fn row(&mut self, r: Row) -> Result<(), String> {
        let (o, otext) = self.side(r.bytes, &r.oop);
        let (i, itext) = self.side(r.bytes, &r.ip);
        self.busbw_sum += i.busbw_gbs;
        self.oob += r.oop.oob + r.ip.oob;
        self.wrong += r.oop.wrong.unwrap_or(0) + r.ip.wrong.unwrap_or(0);
        let rooted = matches!(self.coll, CollKind::Broadcast | CollKind::Reduce);
        let reduces = r.args.reduces();
        let row = JsonRow {
            collective: self.coll.name(),
            nranks: self.nranks,
            size_bytes: r.bytes,
            // nccl-tests prints the per-rank count (its `paramcount`), which is NCCL's argument.
            count: r.args.count as u64,
            dtype: r.args.dtype.name(),
            redop: if reduces { r.args.op.name() } else { "none" },
            root: if rooted { r.args.root as i64 } else { -1 },
            algo: r.algo,
            out_of_place: o,
            in_place: i,
        };
        if self.lead {
            let line = format!(
                "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{otext}{itext}  {:>5}",
                row.size_bytes, row.count, row.dtype, row.redop, row.root, row.algo
            );
            match &self.bar {
                Some(b) => {
                    b.println(line);
                    b.inc(1);
                }
                None => println!("{line}"),
            }
        }
        self.rows.push(row);
        Ok(())
    }

    pub fn finish(self) -> Result<(), String> {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if !self.lead {
            return if self.wrong == 0 {
                Ok(())
            } else {
                Err(format!("{} wrong values", self.wrong))
            };
        }
        println!(
            "# Out of bounds values : {} {}",
            self.oob,
            if self.oob == 0 { "OK" } else { "FAILED" }
        );
        let avg = if self.rows.is_empty() {
            0.0
        } else {
            self.busbw_sum / self.rows.len() as f64
        };
        println!("# Avg bus bandwidth    : {avg:.4} ");
        println!("#");
        if let Some(path) = &self.json {
            let text = serde_json::to_string_pretty(&self.rows).map_err(|e| e.to_string())?;
            std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        if self.wrong > 0 || self.oob > 0 {
            return Err(format!(
                "{} wrong values, {} out-of-bounds writes",
                self.wrong, self.oob
            ));
        }
        Ok(())
    }
}
