//! Trace plot: live trace bytes stacked on static bytes over time, iteration boundaries
//! as vertical lines. SVG or PNG by the output's extension.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::chart::PlotFormat;
use memcast_trace::{EventKind, Trace};
use plotters::prelude::*;

/// At most this many points per series: each bucket keeps its maximum so peaks survive.
const MAX_POINTS: usize = 4000;

pub fn plot_trace(t: &Trace, out: &Path) -> Result<()> {
    super::chart::write_plot(out, |tmp, format| match format {
        PlotFormat::Svg => draw(t, SVGBackend::new(tmp, (1200, 500)).into_drawing_area()),
        PlotFormat::Png => draw(t, BitMapBackend::new(tmp, (1200, 500)).into_drawing_area()),
    })
    .with_context(|| format!("cannot draw {}", out.display()))
}

struct Series {
    /// (time in ms, static GiB, static + trace GiB)
    points: Vec<(f64, f64, f64)>,
    boundaries: Vec<f64>,
}

fn series(t: &Trace) -> Series {
    const GIB: f64 = (1u64 << 30) as f64;
    let mut sizes = std::collections::HashMap::new();
    let mut is_static = std::collections::HashSet::new();
    for b in &t.static_blocks {
        sizes.insert(b.id, b.bytes);
        is_static.insert(b.id);
    }
    let (mut stat, mut live) = (t.static_bytes(), 0u64);
    let mut raw = Vec::with_capacity(t.events.len());
    let mut boundaries = Vec::new();
    for e in &t.events {
        let ms = e.time_us as f64 / 1e3;
        match e.kind {
            EventKind::Alloc { id, bytes, .. } => {
                sizes.insert(id, bytes);
                live += bytes;
            }
            EventKind::Free { id } => {
                let b = sizes.remove(&id).unwrap_or(0);
                if is_static.contains(&id) {
                    stat -= b;
                } else {
                    live -= b;
                }
            }
            EventKind::IterationBoundary => boundaries.push(ms),
            EventKind::Access { .. } => continue,
        }
        raw.push((ms, stat as f64 / GIB, (stat + live) as f64 / GIB));
    }
    let bucket = raw.len().div_ceil(MAX_POINTS).max(1);
    let points = raw
        .chunks(bucket)
        .map(|c| {
            let top = c
                .iter()
                .cloned()
                .fold(c[0], |a, p| if p.2 > a.2 { p } else { a });
            (c[0].0, top.1, top.2)
        })
        .collect();
    Series { points, boundaries }
}

fn draw<DB: DrawingBackend>(t: &Trace, root: DrawingArea<DB, plotters::coord::Shift>) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let s = series(t);
    if s.points.is_empty() {
        bail!("the trace has no allocation events to plot");
    }
    let x_max = s.points.last().map(|p| p.0).unwrap_or(1.0).max(1e-3);
    let y_max = s.points.iter().map(|p| p.2).fold(0.0, f64::max).max(1e-6) * 1.08;
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing failed: {e}");
    root.fill(&WHITE).map_err(err)?;
    let title = if t.meta.name.is_empty() {
        "trace"
    } else {
        &t.meta.name
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title}: requested bytes live"), ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time (ms)")
        .y_desc("GiB")
        .light_line_style(WHITE)
        .draw()
        .map_err(err)?;
    let boundary = ShapeStyle::from(&RGBColor(230, 120, 0)).stroke_width(2);
    for (i, &b) in s.boundaries.iter().enumerate() {
        let line = chart
            .draw_series(LineSeries::new([(b, 0.0), (b, y_max)], boundary))
            .map_err(err)?;
        if i == 0 {
            line.label("iteration boundary")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], boundary));
        }
    }
    chart
        .draw_series(AreaSeries::new(
            s.points.iter().map(|p| (p.0, p.2)),
            0.0,
            BLUE.mix(0.35),
        ))
        .map_err(err)?
        .label("static + trace (live requested)")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], BLUE.mix(0.35).filled()));
    chart
        .draw_series(AreaSeries::new(
            s.points.iter().map(|p| (p.0, p.1)),
            0.0,
            RED.mix(0.45),
        ))
        .map_err(err)?
        .label("static (live before the trace)")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], RED.mix(0.45).filled()));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
