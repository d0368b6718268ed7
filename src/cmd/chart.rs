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

/// The plot format an output path asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PlotFormat {
    Svg,
    Png,
}

/// The format of `out` by its extension, or an error saying which are drawn; and whether
/// it can be written. Checked before the work, so a plot that cannot be written fails
/// at once.
pub fn check_plot_path(out: &Path) -> Result<PlotFormat> {
    let ext = out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let format = match ext.as_deref() {
        Some("svg") => PlotFormat::Svg,
        Some("png") => PlotFormat::Png,
        _ => bail!("{}: a plot must end in .svg or .png", out.display()),
    };
    memcast_trace::output::check(out)?;
    Ok(format)
}

/// Draws a plot with `draw` (given a file path of the right extension to draw into) and
/// writes it to `out` through `memcast_trace::output` (symlinks followed, devices written
/// in place, regular files replaced atomically).
pub fn write_plot(out: &Path, draw: impl FnOnce(&Path, PlotFormat) -> Result<()>) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let format = check_plot_path(out)?;
    let ext = if format == PlotFormat::Svg {
        "svg"
    } else {
        "png"
    };
    let tmp = std::env::temp_dir().join(format!(
        "memcast-plot-{}-{}.{ext}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let drawn = draw(&tmp, format).and_then(|()| {
        std::fs::read(&tmp).with_context(|| format!("reading the drawn plot {}", tmp.display()))
    });
    let _ = std::fs::remove_file(&tmp);
    memcast_trace::output::write_bytes(out, &drawn?)?;
    Ok(())
}

/// Draws `lines` into `out` with a title and axis descriptions.
pub fn line_chart(out: &Path, title: &str, x: &str, y: &str, lines: &[Line<'_>]) -> Result<()> {
    write_plot(out, |tmp, format| match format {
        PlotFormat::Svg => draw(
            SVGBackend::new(tmp, (1200, 450)).into_drawing_area(),
            title,
            x,
            y,
            lines,
        ),
        PlotFormat::Png => draw(
            BitMapBackend::new(tmp, (1200, 450)).into_drawing_area(),
            title,
            x,
            y,
            lines,
        ),
    })
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
