//! The SVG of `--compare --plot`: busbw against message size, one line per configuration.

use plotters::prelude::*;
use std::path::Path;

pub fn busbw_svg(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(u64, f64)>)],
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("--plot {}: {x}", path.display());
    let points = || series.iter().flat_map(|(_, v)| v.iter());
    let (xmin, xmax) = points().fold((u64::MAX, 1u64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let ymax = points().fold(0f64, |m, p| m.max(p.1)).max(1e-6) * 1.35; // room for the legend
    if xmin == u64::MAX {
        return Err(e(&"no results to plot"));
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        // x is log2(size), so the labels fall on powers of two.
        .build_cartesian_2d(lg(xmin)..lg(xmax).max(lg(xmin) + 1.0), 0f64..ymax)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("busbw (GB/s)")
        .x_labels(16)
        .x_label_formatter(&|v| human(*v))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, (label, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let data: Vec<(f64, f64)> = pts.iter().map(|&(s, b)| (lg(s), b)).collect();
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(data.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(|x| e(&x))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

fn lg(size: u64) -> f64 {
    (size.max(1) as f64).log2()
}

/// A log2 axis position as a size (`64K`), blank between powers of two.
fn human(l: f64) -> String {
    if (l - l.round()).abs() > 1e-6 || !(0.0..64.0).contains(&l) {
        return String::new();
    }
    let v = 1u64 << l.round() as u32;
    match v {
        v if v >= 1 << 30 && v % (1 << 30) == 0 => format!("{}G", v >> 30),
        v if v >= 1 << 20 && v % (1 << 20) == 0 => format!("{}M", v >> 20),
        v if v >= 1 << 10 && v % (1 << 10) == 0 => format!("{}K", v >> 10),
        v => v.to_string(),
    }
}
