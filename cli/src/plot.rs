//! `cachealloc plot`: live and reserved bytes against event index, with the
//! peak marked, and the segment map at the peak (each segment a bar, its
//! blocks coloured by state).

use crate::human;
use cachealloc_core::BlockState;
use cachealloc_trace::{run, Observer, Options, Replay, Report, StopAt, TraceError};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

/// Where TrueType fonts usually are; `CACHEALLOC_FONT` names one explicitly.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

fn register_font() -> Result<(), String> {
    let mut candidates: Vec<String> = std::env::var("CACHEALLOC_FONT").into_iter().collect();
    candidates.extend(FONT_PATHS.iter().map(|s| s.to_string()));
    for p in &candidates {
        if let Ok(bytes) = std::fs::read(p) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
    }
    Err("no TrueType font found to lay out the chart's text: install one (Debian: fonts-dejavu-core) or set CACHEALLOC_FONT=/path/to/font.ttf".to_string())
}

/// Series of the first pass: per event, live and reserved bytes.
struct Series {
    live: Vec<u64>,
    reserved: Vec<u64>,
}

impl Observer for Series {
    fn after_event(&mut self, _index: u64, r: &Replay) {
        self.live.push(r.live_bytes);
        self.reserved.push(r.reserved());
    }
}

/// At most `n` points: the maximum of each bucket, so peaks survive.
fn downsample(v: &[u64], n: usize) -> Vec<(u64, f64)> {
    let step = v.len().div_ceil(n.max(1)).max(1);
    v.chunks(step)
        .enumerate()
        .map(|(k, c)| {
            (
                (k * step) as u64,
                *c.iter().max().unwrap_or(&0) as f64 / (1u64 << 30) as f64,
            )
        })
        .collect()
}

/// A block of the segment map: segment number, start and end as fractions of the segment, state.
type MapBlock = (usize, f64, f64, BlockState);

/// Errors of `plot`: from the replay (a bad trace: exit 2), or drawing and
/// writing (exit 1).
pub enum PlotError {
    /// From the replay.
    Replay(TraceError),
    /// Drawing or writing.
    Other(String),
}

/// Everything the chart shows.
struct Chart<'a> {
    /// The trace file.
    path: &'a str,
    report: &'a Report,
    series: &'a Series,
    /// Events.
    n: u64,
    /// Peak reserved bytes and the event where it happened.
    peak: u64,
    peak_index: u64,
    /// The segment map at the peak.
    blocks: &'a [MapBlock],
    nseg: usize,
}

/// Draw the chart of the trace at `path` into the SVG file `out`.
pub fn plot(path: &str, opts: &Options, out: &str) -> Result<String, PlotError> {
    register_font().map_err(PlotError::Other)?;
    let mut series = Series {
        live: Vec::new(),
        reserved: Vec::new(),
    };
    let (report, _) = run(path, opts, &mut series).map_err(PlotError::Replay)?;
    let n = series.reserved.len() as u64;
    let peak = series.reserved.iter().copied().max().unwrap_or(0);
    let peak_index = series.reserved.iter().position(|&r| r == peak).unwrap_or(0) as u64;
    // Second pass: stop at the peak and read the segment map there.
    let (_, at_peak) = run(path, opts, &mut StopAt(peak_index)).map_err(PlotError::Replay)?;
    let mut blocks: Vec<MapBlock> = Vec::new();
    let mut nseg = 0usize;
    for d in &at_peak.devices {
        for seg in d.alloc.segments() {
            let mut off = 0u64;
            for b in seg.blocks() {
                let (s, e) = (
                    off as f64 / seg.total_size as f64,
                    (off + b.size) as f64 / seg.total_size as f64,
                );
                blocks.push((nseg, s, e, b.state));
                off += b.size;
            }
            nseg += 1;
        }
    }
    let chart = Chart {
        path,
        report: &report,
        series: &series,
        n,
        peak,
        peak_index,
        blocks: &blocks,
        nseg,
    };
    draw(out, &chart).map_err(|e| PlotError::Other(format!("{out}: {e}")))?;
    Ok(format!(
        "{out}: {} events, peak reserved {} at event {peak_index} ({nseg} segments), peak live {}",
        human::count(n),
        human::bytes(peak),
        human::bytes(report.peak_live_bytes)
    ))
}

type Drawn = Result<(), Box<dyn std::error::Error>>;

/// The series' legend, as every chart draws it: lower right, boxed.
fn legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
) -> Drawn {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()?;
    Ok(())
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// The SVG: both panels.
fn draw(out: &str, c: &Chart) -> Drawn {
    let root = SVGBackend::new(out, (1280, 960)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(500);
    draw_series(&upper, c)?;
    draw_segment_map(&lower, c)?;
    root.present()?;
    Ok(())
}

/// The upper panel: live and reserved bytes, the peak marked.
fn draw_series(area: &DrawingArea<SVGBackend, plotters::coord::Shift>, c: &Chart) -> Drawn {
    let (report, n, peak, peak_index) = (c.report, c.n, c.peak, c.peak_index);
    let name = std::path::Path::new(c.path)
        .file_name()
        .map_or(c.path.to_string(), |f| f.to_string_lossy().into_owned());
    let ymax = gib(peak.max(report.peak_live_bytes)).max(1e-6) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{name}: live and reserved bytes (config: {})",
                if report.conf.is_empty() {
                    "default"
                } else {
                    &report.conf
                }
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0u64..n.max(1), 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_desc("event index")
        .y_desc("GiB")
        .draw()?;
    let blue = RGBColor(31, 119, 180);
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(
            downsample(&c.series.live, 2000),
            blue.stroke_width(2),
        ))?
        .label(format!(
            "live bytes (peak {})",
            human::bytes(report.peak_live_bytes)
        ))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            downsample(&c.series.reserved, 2000),
            red.stroke_width(2),
        ))?
        .label(format!("reserved bytes (peak {})", human::bytes(peak)))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(2)));
    chart.draw_series(std::iter::once(Circle::new(
        (peak_index, gib(peak)),
        6,
        red.filled(),
    )))?;
    // The label sits on the side of the marker with more room.
    let h = if peak_index > n / 2 {
        HPos::Right
    } else {
        HPos::Left
    };
    let label_style =
        TextStyle::from(("sans-serif", 15).into_font()).pos(Pos::new(h, VPos::Bottom));
    chart.draw_series(std::iter::once(Text::new(
        format!(
            "peak {} at event {}",
            human::bytes(peak),
            human::count(peak_index)
        ),
        (peak_index, gib(peak) * 1.02),
        label_style,
    )))?;
    legend(&mut chart)
}

/// The lower panel: the segment map at the peak.
fn draw_segment_map(area: &DrawingArea<SVGBackend, plotters::coord::Shift>, c: &Chart) -> Drawn {
    let (peak_index, nseg) = (c.peak_index, c.nseg);
    let mut map = ChartBuilder::on(area)
        .caption(
            format!(
                "segment map at the peak (event {}): {nseg} segments, bars ordered by address",
                human::count(peak_index)
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..nseg.max(1) as f64, 0f64..1f64)?;
    map.configure_mesh()
        .disable_mesh()
        .x_desc("segment")
        .y_desc("share of the segment")
        .x_label_formatter(&|x| format!("{}", *x as u64))
        .draw()?;
    let colour = |s: BlockState| match s {
        BlockState::ActiveAllocated => RGBColor(44, 160, 44),
        BlockState::ActivePendingFree => RGBColor(255, 127, 14),
        _ => RGBColor(200, 200, 200), // inactive
    };
    let w = 0.42;
    map.draw_series(c.blocks.iter().map(|&(k, s, e, st)| {
        let x = k as f64 + 0.5;
        Rectangle::new([(x - w, s), (x + w, e)], colour(st).filled())
    }))?;
    for (label, st) in [
        ("allocated block", BlockState::ActiveAllocated),
        ("free (cached) block", BlockState::Inactive),
        ("pending free", BlockState::ActivePendingFree),
    ] {
        let c = colour(st);
        map.draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    map.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;
    Ok(())
}

/// `advise --plot`: one horizontal bar per setting, best first, of its peak
/// reserved bytes; settings that run out of memory under the capacity in
/// grey, the capacity as a line.
pub fn advice_chart(a: &cachealloc_trace::advise::Advice, out: &str) -> Result<(), String> {
    register_font()?;
    draw_advice(a, out).map_err(|e| e.to_string())
}

fn draw_advice(a: &cachealloc_trace::advise::Advice, out: &str) -> Drawn {
    let n = a.ranked.len();
    let height = 120 + 28 * n as u32;
    let root = SVGBackend::new(out, (1280, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = a
        .ranked
        .iter()
        .map(|o| o.peak_reserved_bytes)
        .chain(a.capacity)
        .max()
        .unwrap_or(1);
    let name = std::path::Path::new(&a.trace)
        .file_name()
        .map_or(a.trace.clone(), |f| f.to_string_lossy().into_owned());
    let labels: Vec<String> = a
        .ranked
        .iter()
        .map(|o| {
            let c = if o.candidate.conf.is_empty() {
                "(default)".to_string()
            } else {
                o.candidate.conf.clone()
            };
            let c = if c.chars().count() > 60 {
                format!("{}...", c.chars().take(57).collect::<String>())
            } else {
                c
            };
            if o.candidate.what == "recorded" {
                format!("{c} (recorded)")
            } else {
                c
            }
        })
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{name}: peak reserved bytes by allocator setting"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(480)
        // One segment a bar (the best on top), each labelled at its
        // middle: plotters puts a segmented axis's ticks there.
        .build_cartesian_2d(0f64..gib(top) * 1.1, (0..n.max(1) - 1).into_segmented())?;
    // The bar at segment `y`: the setting ranked `n - 1 - y`.
    let rank_of = |y: usize| n.checked_sub(y + 1);
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("GiB")
        .y_labels(n.max(1))
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(y) => rank_of(*y)
                .and_then(|k| labels.get(k).cloned())
                .unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    let good = RGBColor(31, 119, 180);
    let grey = RGBColor(170, 170, 170);
    // A segment's lower and upper edges.
    let edges = |y: usize| {
        let upper = if y + 1 < n {
            SegmentValue::Exact(y + 1)
        } else {
            SegmentValue::Last
        };
        (SegmentValue::Exact(y), upper)
    };
    // Bars 70% of their segment high, as before.
    let gap = (28.0 * 0.15) as u32;
    chart.draw_series(a.ranked.iter().enumerate().map(|(i, o)| {
        let (lower, upper) = edges(n - 1 - i);
        let colour = if o.fits == Some(false) { grey } else { good };
        let mut bar = Rectangle::new(
            [(0.0, lower), (gib(o.peak_reserved_bytes), upper)],
            colour.filled(),
        );
        bar.set_margin(gap, gap, 0, 0);
        bar
    }))?;
    if let Some(c) = a.capacity {
        let red = RGBColor(214, 39, 40);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![
                    (gib(c), SegmentValue::Exact(0)),
                    (gib(c), SegmentValue::Last),
                ],
                red.stroke_width(2),
            )))?
            .label(format!("capacity {}", human::bytes(c)))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(2)));
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachealloc_trace::advise::{Advice, Candidate, Outcome};

    fn outcome(conf: &str, what: &str, peak: u64, fits: Option<bool>) -> Outcome {
        Outcome {
            candidate: Candidate {
                conf: conf.to_string(),
                extra: String::new(),
                what: what.to_string(),
                pytorch: true,
                memory_fraction: None,
            },
            peak_reserved_bytes: peak,
            num_device_alloc: 1,
            num_device_free: 0,
            ooms: 0,
            first_oom_class: None,
            fits,
            min_capacity: None,
        }
    }

    /// Every bar of `advise --plot` carries its setting's label (the text
    /// of the SVG, unescaped), not only the title.
    #[test]
    fn the_advice_chart_labels_every_bar() {
        let gib = 1u64 << 30;
        let a = Advice {
            trace: "dir/small.jsonl.gz".to_string(),
            capacity: Some(3 * gib),
            ranked: vec![
                outcome(
                    "expandable_segments:True",
                    "expandable segments",
                    gib,
                    Some(true),
                ),
                outcome("", "recorded", 2 * gib, Some(true)),
                outcome(
                    "roundup_power2_divisions:[256:1,>:4]",
                    "rounding divisions by size",
                    3 * gib,
                    Some(true),
                ),
                outcome("max_split_size_mb:21", "no split", 4 * gib, Some(false)),
            ],
            recorded: 1,
            recommended: Some(0),
            any_fits: Some(true),
        };
        let out =
            std::env::temp_dir().join(format!("cachealloc-plot-{}-advice.svg", std::process::id()));
        let out = out.to_str().unwrap();
        match advice_chart(&a, out) {
            Err(e) if e.contains("no TrueType font") => {
                println!("skipped: {e}");
                return;
            }
            r => r.unwrap(),
        }
        let svg = std::fs::read_to_string(out).unwrap();
        std::fs::remove_file(out).ok();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let texts: Vec<String> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(|t| t.trim().to_string()))
            .collect();
        assert!(
            texts
                .iter()
                .any(|t| t == "small.jsonl.gz: peak reserved bytes by allocator setting"),
            "{texts:?}"
        );
        for label in [
            "expandable_segments:True",
            "(default) (recorded)",
            "roundup_power2_divisions:[256:1,>:4]",
            "max_split_size_mb:21",
        ] {
            assert!(
                texts.iter().any(|t| t == label),
                "no {label:?} in {texts:?}"
            );
        }
    }
}
