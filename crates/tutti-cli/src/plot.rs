//! `--plot`: bus bandwidth against message size, as an SVG (plotters).
//!
//! The x axis is logarithmic in base 2 with sizes as labels (`8 B`, `64 KiB`);
//! the y axis is linear from 0. One line with markers per series.

use crate::perf::report::{human_bytes, Series};
use plotters::prelude::*;
use std::path::Path;

/// Draws `series` (size in bytes, busbw in GB/s) into an SVG at `path`.
pub(crate) fn busbw_svg(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let pts = || series.iter().flat_map(|s| s.points.iter().copied());
    let (Some(xmin), Some(xmax)) = (
        pts().map(|p| p.0.max(1)).min(),
        pts().map(|p| p.0.max(1)).max(),
    ) else {
        return Err("nothing to plot: no data points".into());
    };
    let ymax = pts().map(|p| p.1).fold(0.0f64, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let (xlo, xhi) = (xmin as f64, (xmax as f64).max(xmin as f64 * 2.0));
    let e = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());

    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((xlo..xhi).log_scale().base(2.0), 0.0..ymax)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("size (bytes)")
        .y_desc("busbw (GB/s)")
        .x_label_formatter(&|x| human_bytes(x.round() as u64))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(x, y)| (x.max(1) as f64, y))
            .collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(|x| e(&x))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Draws scaling efficiency (percent) against ranks into an SVG at `path`.
pub(crate) fn efficiency_svg(
    path: &Path,
    title: &str,
    points: &[(u64, f64)],
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());
    let xmax = points.iter().map(|p| p.0).max().unwrap_or(1).max(2) as f64;
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((1.0..xmax).log_scale().base(2.0), 0.0..105.0)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("ranks")
        .y_desc("scaling efficiency (%)")
        .x_label_formatter(&|x| format!("{}", x.round()))
        .draw()
        .map_err(|x| e(&x))?;
    let line: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x as f64, y)).collect();
    let color = Palette99::pick(0).to_rgba();
    chart
        .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
        .map_err(|x| e(&x))?;
    chart
        .draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
