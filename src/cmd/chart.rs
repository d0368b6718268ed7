//! One line chart: named series of (x, y) points, SVG or PNG by the output's extension.
//! What the demo's plots are drawn with.

use std::path::Path;

use anyhow::{bail, Context, Result};
use plotters::prelude::*;

/// A named series and its colour.
pub struct Line<'a> {
    pub name: &'a str,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// Draws `lines` into `out` with a title and axis descriptions.
pub fn line_chart(out: &Path, title: &str, x: &str, y: &str, lines: &[Line<'_>]) -> Result<()> {
    let ext = out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => draw(
            SVGBackend::new(out, (1200, 450)).into_drawing_area(),
            title,
            x,
            y,
            lines,
        ),
        Some("png") => draw(
            BitMapBackend::new(out, (1200, 450)).into_drawing_area(),
            title,
            x,
            y,
            lines,
        ),
        _ => bail!("{}: a plot must end in .svg or .png", out.display()),
    }
    .with_context(|| format!("cannot draw {}", out.display()))
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x: &str,
    y: &str,
    lines: &[Line<'_>],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let pts = || lines.iter().flat_map(|l| l.points.iter());
    let x_max = pts().map(|p| p.0).fold(1e-9, f64::max);
    let y_max = pts().map(|p| p.1).fold(1e-9, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart.configure_mesh().x_desc(x).y_desc(y).draw()?;
    for l in lines {
        let c = l.color;
        chart
            .draw_series(LineSeries::new(l.points.iter().copied(), &c))?
            .label(l.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
