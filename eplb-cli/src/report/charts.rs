//! The charts of `eplb report` and `eplb hotness --svg`, drawn with plotters' SVG backend into
//! strings. Text is laid out by plotters' built-in estimate (no font files) and rendered by the
//! browser as `sans-serif`.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::colors::colormaps::ViridisRGB;

/// Chart width in pixels (the page is laid out for 1400 px).
pub const WIDTH: u32 = 1300;

const FONT: &str = "sans-serif";

/// Distinct line colours (the "tab10" palette); `static` is drawn grey.
const PALETTE: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const STATIC_GREY: RGBColor = RGBColor(127, 127, 127);

/// The colour of the `index`-th policy named `name`.
pub fn policy_color(name: &str, index: usize) -> RGBColor {
    if name == "static" {
        STATIC_GREY
    } else {
        PALETTE[index % PALETTE.len()]
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("cannot draw the chart: {e}")
}

/// Every chart's legend: upper right, on a light box.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font((FONT, 15))
        .draw()
        .map_err(err)
}

/// The colour of a membership event's line.
const EVENT_RED: RGBColor = RGBColor(200, 30, 30);

/// A membership event on a time-series chart: a vertical line at the window's left edge and
/// its label (`rank 5 fails`) near the top, below the legend's `legend_rows` rows (the legend
/// box would hide a label under it).
fn draw_events<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<
        'a,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    events: &[(usize, String)],
    y0: f64,
    y1: f64,
    legend_rows: usize,
) -> Result<(), String> {
    let (_, h) = chart.plotting_area().dim_in_pixel();
    let below = |px: f64| y1 - px / f64::from(h.max(1)) * (y1 - y0);
    for (i, (w, label)) in events.iter().enumerate() {
        let x = *w as f64 - 0.5;
        chart
            .draw_series(LineSeries::new(
                [(x, y0), (x, y1)],
                EVENT_RED.stroke_width(2),
            ))
            .map_err(err)?;
        // Staggered, so that two events close together keep readable labels.
        let y = below(24.0 + 20.0 * legend_rows as f64 + 18.0 * (i % 3) as f64);
        chart
            .draw_series(std::iter::once(Text::new(
                label.clone(),
                (x + 0.3, y),
                (FONT, 14).into_font().color(&EVENT_RED),
            )))
            .map_err(err)?;
    }
    Ok(())
}

/// Draws into a fresh SVG string of `w` x `h` pixels.
fn svg(
    w: u32,
    h: u32,
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// Pads a value range so that a flat series still gets an axis.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    let (lo, hi) = if lo.is_finite() && hi.is_finite() {
        (lo, hi)
    } else {
        (1.0, 1.0)
    };
    let span = (hi - lo).max(0.05 * hi.abs().max(1.0));
    (lo - 0.04 * span, hi + 0.08 * span)
}

/// One policy's line on the PAR chart.
pub struct ParSeries<'a> {
    /// Policy name (legend).
    pub name: &'a str,
    /// Colour.
    pub color: RGBColor,
    /// Layer-mean PAR per window.
    pub values: &'a [f64],
    /// Windows where one of its plans that changed the placement became active.
    pub activations: &'a [usize],
}

/// PAR per window, one line per policy, the lower bound dashed, activations marked; each
/// membership event `(window, label)` a red vertical line with its label.
pub fn par_lines(
    series: &[ParSeries<'_>],
    lower: &[f64],
    first_active: usize,
    events: &[(usize, String)],
) -> Result<String, String> {
    let t = lower.len();
    let all = series
        .iter()
        .flat_map(|s| s.values.iter())
        .chain(lower)
        .copied()
        .filter(|v| v.is_finite());
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (y0, y1) = padded(lo.min(1.0), hi);
    // Room above the lines for the legend.
    let y1 = y1 + 0.02 * (series.len() as f64 + 2.0) * 2.5 * (y1 - y0);
    let x1 = (t.max(2) - 1) as f64;
    svg(WIDTH, 600, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                "PAR per window (mean over layers; markers: a new placement becomes active)",
                (FONT, 20),
            )
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..x1 + 0.5, y0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("window")
            .y_desc("PAR = max rank load / mean rank load")
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 14))
            .x_label_formatter(&|x| integral_label(*x))
            .draw()
            .map_err(err)?;
        if first_active < t {
            let x = first_active as f64 - 0.5;
            chart
                .draw_series(DashedLineSeries::new(
                    [(x, y0), (x, y1)],
                    4,
                    4,
                    RGBColor(180, 180, 180).stroke_width(1),
                ))
                .map_err(err)?
                .label(format!("first possible activation (window {first_active})"))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(180, 180, 180))
                });
        }
        let xy = |v: &[f64]| -> Vec<(f64, f64)> {
            v.iter()
                .enumerate()
                .filter(|(_, p)| p.is_finite())
                .map(|(w, &p)| (w as f64, p))
                .collect()
        };
        chart
            .draw_series(DashedLineSeries::new(
                xy(lower),
                6,
                4,
                BLACK.stroke_width(2),
            ))
            .map_err(err)?
            .label("lower bound (any placement)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        for s in series {
            let c = s.color;
            let pts = xy(s.values);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(err)?
                .label(s.name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3))
                });
            if t <= 3 {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(err)?;
            }
            let marks = s
                .activations
                .iter()
                .filter_map(|&w| s.values.get(w).map(|&p| (w as f64, p)))
                .filter(|p| p.1.is_finite());
            chart
                .draw_series(
                    marks.map(|p| TriangleMarker::new(p, 6, ShapeStyle::from(&c).filled())),
                )
                .map_err(err)?;
        }
        draw_events(&mut chart, events, y0, y1, 2 + series.len())?;
        legend(&mut chart)?;
        Ok(())
    })
}

/// One policy's line on the time chart.
pub struct TimeSeries<'a> {
    /// Legend label.
    pub label: String,
    /// Colour.
    pub color: RGBColor,
    /// Estimated MoE ms per iteration, per window.
    pub values: &'a [f64],
    /// `(window, ms)`: the stall of each cycle that changed the placement, at the window its
    /// placement became active.
    pub stalls: &'a [(usize, f64)],
}

/// Estimated MoE ms per iteration per window, one line per policy; each cycle's stall is a
/// hollow circle on the policy's line at its activation window, its area proportional to the
/// stall (labels would overlap where policies activate in the same window; the legend gives
/// each policy's stalls in ms).
pub fn time_lines(
    series: &[TimeSeries<'_>],
    first_active: usize,
    events: &[(usize, String)],
) -> Result<String, String> {
    let t = series.iter().map(|s| s.values.len()).max().unwrap_or(0);
    let (lo, hi) = series
        .iter()
        .flat_map(|s| s.values.iter())
        .copied()
        .filter(|v| v.is_finite())
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (y0, y1) = padded(lo, hi);
    let y1 = y1 + 0.02 * (series.len() as f64 + 2.0) * 2.5 * (y1 - y0);
    let x1 = (t.max(2) - 1) as f64;
    let max_stall = series
        .iter()
        .flat_map(|s| s.stalls.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let legend_rows = series.len() as u32 + 1;
    svg(WIDTH, 560 + 10 * legend_rows, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                "Estimated MoE time per iteration (circles: a cycle's stall, area ~ ms)",
                (FONT, 20),
            )
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..x1 + 0.5, y0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("window (= one iteration)")
            .y_desc("estimated MoE ms per iteration")
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 14))
            .x_label_formatter(&|x| integral_label(*x))
            .draw()
            .map_err(err)?;
        if first_active < t {
            let x = first_active as f64 - 0.5;
            chart
                .draw_series(DashedLineSeries::new(
                    [(x, y0), (x, y1)],
                    4,
                    4,
                    RGBColor(180, 180, 180).stroke_width(1),
                ))
                .map_err(err)?
                .label(format!("first possible activation (window {first_active})"))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(180, 180, 180))
                });
        }
        for s in series {
            let c = s.color;
            let pts: Vec<(f64, f64)> = s
                .values
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(w, &v)| (w as f64, v))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(err)?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3))
                });
            if t <= 3 {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(err)?;
            }
            let at: Vec<((f64, f64), f64)> = s
                .stalls
                .iter()
                .filter_map(|&(w, ms)| {
                    s.values
                        .get(w)
                        .filter(|v| v.is_finite())
                        .map(|&v| ((w as f64, v), ms))
                })
                .collect();
            chart
                .draw_series(at.iter().map(|&(p, ms)| {
                    let r = if max_stall > 0.0 {
                        3.0 + 9.0 * (ms / max_stall).sqrt()
                    } else {
                        3.0
                    };
                    Circle::new(p, r.round() as i32, c.stroke_width(2))
                }))
                .map_err(err)?;
        }
        draw_events(&mut chart, events, y0, y1, 1 + series.len())?;
        legend(&mut chart)?;
        Ok(())
    })
}

fn integral_label(x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 && x >= -1e-6 {
        format!("{}", x.round() as i64)
    } else {
        String::new()
    }
}

/// One policy's bars on the fetch chart.
pub struct FetchSeries<'a> {
    /// Legend label.
    pub label: String,
    /// Colour.
    pub color: RGBColor,
    /// Expert copies fetched at each cycle.
    pub fetches: &'a [usize],
}

/// Fetches per cycle, grouped bars per cycle.
pub fn fetch_bars(series: &[FetchSeries<'_>], cycles: usize) -> Result<String, String> {
    let ymax = series
        .iter()
        .flat_map(|s| s.fetches.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let k = cycles.max(1) as f64;
    let n = series.len().max(1) as f64;
    let legend_rows = series.len() as u32 + 1;
    svg(WIDTH, 360 + 22 * legend_rows, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                "Weight fetches per cycle (expert copies a rank must receive)",
                (FONT, 20),
            )
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(0.5f64..k + 0.5, 0f64..ymax * (1.15 + 0.09 * n))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("cycle")
            .y_desc("expert copies fetched")
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 14))
            .y_label_formatter(&|y| integral_label(*y))
            .x_labels(cycles.clamp(1, 40))
            .x_label_formatter(&|x| integral_label(*x))
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        let width = 0.8 / n;
        for (i, s) in series.iter().enumerate() {
            let c = s.color;
            let left = -0.4 + width * i as f64;
            chart
                .draw_series(s.fetches.iter().enumerate().map(|(j, &f)| {
                    let x = (j + 1) as f64 + left;
                    Rectangle::new([(x, 0.0), (x + width, f as f64)], c.filled())
                }))
                .map_err(err)?
                .label(s.label.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
        }
        legend(&mut chart)?;
        Ok(())
    })
}

/// One panel of a heat map: `values[row][col]` row-major.
pub struct HeatPanel<'a> {
    /// Panel title.
    pub title: String,
    /// `rows * cols` values.
    pub values: &'a [f64],
}

/// Axis names and sizes of a heat map.
pub struct HeatAxes<'a> {
    /// The chart's caption.
    pub caption: &'a str,
    /// Columns (x).
    pub cols: usize,
    /// x units per column (1, or the windows averaged into one column of a long trace).
    pub col_width: usize,
    /// Rows (y).
    pub rows: usize,
    /// x axis name.
    pub x_desc: &'a str,
    /// y axis name.
    pub y_desc: &'a str,
    /// Colour bar name.
    pub scale_desc: &'a str,
}

/// Heat maps side by side on one colour scale (viridis, from the smallest to the largest
/// value of all panels), with a colour bar.
pub fn heatmap(panels: &[HeatPanel<'_>], axes: &HeatAxes<'_>) -> Result<String, String> {
    let (lo, hi) = panels
        .iter()
        .flat_map(|p| p.values.iter())
        .copied()
        .filter(|v| v.is_finite())
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (1.0, 1.0) };
    let hi = if hi > lo { hi } else { lo + 1e-9 };
    let height = (220 + 14 * axes.rows as u32).clamp(360, 1000);
    let (cols, rows) = (axes.cols.max(1), axes.rows.max(1));
    let cw = axes.col_width.max(1) as f64;
    let out = svg(WIDTH, height, |root| {
        let root = root.titled(axes.caption, (FONT, 20)).map_err(err)?;
        let (maps, bar) = root.split_horizontally(WIDTH - 130);
        let areas = maps.split_evenly((1, panels.len().max(1)));
        for (area, p) in areas.iter().zip(panels) {
            let mut chart = ChartBuilder::on(area)
                .caption(p.title.as_str(), (FONT, 17))
                .margin(10)
                .x_label_area_size(44)
                .y_label_area_size(56)
                .build_cartesian_2d(-0.5f64..cols as f64 * cw - 0.5, -0.5f64..rows as f64 - 0.5)
                .map_err(err)?;
            chart
                .configure_mesh()
                .disable_mesh()
                .x_desc(axes.x_desc)
                .y_desc(axes.y_desc)
                .axis_desc_style((FONT, 15))
                .label_style((FONT, 13))
                .x_label_formatter(&|x| integral_label(*x))
                .y_label_formatter(&|y| integral_label(*y))
                .draw()
                .map_err(err)?;
            chart
                .draw_series(p.values.iter().enumerate().map(|(i, &v)| {
                    let (r, c) = (i / cols, i % cols);
                    let color = ViridisRGB.get_color_normalized(v, lo, hi);
                    // Cell (c, r) spans its x units and is centred on its integer labels.
                    let (x, y) = (c as f64 * cw, r as f64);
                    Rectangle::new(
                        [(x - 0.5, y - 0.5), (x + cw - 0.5, y + 0.5)],
                        color.filled(),
                    )
                }))
                .map_err(err)?;
        }
        let mut scale = ChartBuilder::on(&bar)
            .margin_top(40)
            .margin_bottom(54)
            .margin_right(10)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..1.0, lo..hi)
            .map_err(err)?;
        scale
            .configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .y_desc(axes.scale_desc)
            .axis_desc_style((FONT, 15))
            .label_style((FONT, 13))
            .y_label_formatter(&|y| format!("{y:.2}"))
            .draw()
            .map_err(err)?;
        let steps = 100;
        scale
            .draw_series((0..steps).map(|i| {
                let a = lo + (hi - lo) * i as f64 / steps as f64;
                let b = lo + (hi - lo) * (i + 1) as f64 / steps as f64;
                let color = ViridisRGB.get_color_normalized((a + b) / 2.0, lo, hi);
                Rectangle::new([(0.0, a), (1.0, b)], color.filled())
            }))
            .map_err(err)?;
        Ok(())
    })?;
    // Glue: adjacent cells without anti-aliased seams between them.
    Ok(out.replacen("<svg ", "<svg shape-rendering=\"crispEdges\" ", 1))
}

/// The rank loads of one layer under two placements, side by side per rank.
pub fn rank_bars(
    caption: &str,
    before: (&str, RGBColor, &[f64]),
    after: (&str, RGBColor, &[f64]),
) -> Result<String, String> {
    let r = before.2.len().max(after.2.len()).max(1);
    let ymax = before
        .2
        .iter()
        .chain(after.2)
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ymax = if ymax > 0.0 { ymax } else { 1.0 };
    let mean = before.2.iter().sum::<f64>() / r as f64;
    svg(WIDTH, 440, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(caption, (FONT, 20))
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.6f64..r as f64 - 0.4, 0f64..ymax * 1.4)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("rank")
            .y_desc("tokens routed to the rank")
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 14))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_labels(r.min(64))
            .x_label_formatter(&|x| integral_label(*x))
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        for (k, (name, c, loads)) in [before, after].into_iter().enumerate() {
            let left = -0.4 + 0.4 * k as f64;
            chart
                .draw_series(loads.iter().enumerate().map(|(i, &v)| {
                    let x = i as f64 + left;
                    Rectangle::new([(x, 0.0), (x + 0.38, v)], c.filled())
                }))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
        }
        chart
            .draw_series(DashedLineSeries::new(
                [(-0.6, mean), (r as f64 - 0.4, mean)],
                6,
                4,
                BLACK.stroke_width(2),
            ))
            .map_err(err)?
            .label(format!("mean rank load ({mean:.1})"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        legend(&mut chart)?;
        Ok(())
    })
}
