//! Bar charts as SVG geometry: the numbers become rectangles and labels
//! here, and the template draws them (attributes, not inline styles, so
//! the Content-Security-Policy needs no exception).

/// A chart's drawing area, in SVG user units.
pub const WIDTH: f64 = 720.0;
pub const HEIGHT: f64 = 220.0;
/// Room left of the bars for the axis labels, and below them for the
/// bars' labels.
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 24.0;

/// One bar, drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
    /// Under the bar (every few bars, so labels do not overlap).
    pub label: String,
    /// Its tooltip: the label and the value.
    pub title: String,
}

/// A horizontal rule with its value at the left.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    pub y: f64,
    pub label: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BarChart {
    pub bars: Vec<Bar>,
    pub ticks: Vec<Tick>,
    pub width: f64,
    pub height: f64,
    /// The baseline's height (bars stand on it).
    pub base: f64,
    pub left: f64,
}

/// A round number at or above `max` for the scale's top (1, 2 or 5 × 10ⁿ).
fn nice_top(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&t| t >= max)
        .unwrap_or(10.0 * p)
}

/// A value for a label: whole above 100, else up to three decimals
/// without trailing zeros (0.025, not 0.03).
fn number(v: f64) -> String {
    if v >= 100.0 || v == v.round() {
        return format!("{v:.0}");
    }
    let s = if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Bars for `(label, value)` in order, scaled to the largest; `unit`
/// follows values in tooltips.
pub fn bars(points: &[(String, f64)], unit: &str) -> BarChart {
    let max = points.iter().map(|p| p.1).fold(0.0, f64::max);
    let top = nice_top(max);
    let plot_h = HEIGHT - BOTTOM - 8.0;
    let base = HEIGHT - BOTTOM;
    let slot = if points.is_empty() {
        0.0
    } else {
        (WIDTH - LEFT) / points.len() as f64
    };
    let every = (points.len() / 12).max(1);
    let bars = points
        .iter()
        .enumerate()
        .map(|(i, (label, v))| {
            let h = (v.max(0.0) / top) * plot_h;
            Bar {
                x: LEFT + i as f64 * slot + slot * 0.1,
                y: base - h,
                width: (slot * 0.8).max(1.0),
                height: h,
                label: if i % every == 0 {
                    label.clone()
                } else {
                    String::new()
                },
                title: format!("{label}: {} {unit}", number(*v)),
            }
        })
        .collect();
    let ticks = (0..=4)
        .map(|k| {
            let v = top * k as f64 / 4.0;
            Tick {
                y: base - plot_h * k as f64 / 4.0,
                label: number(v),
            }
        })
        .collect();
    BarChart {
        bars,
        ticks,
        width: WIDTH,
        height: HEIGHT,
        base,
        left: LEFT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tallest_bar_reaches_the_round_top_and_the_others_scale_with_it() {
        let c = bars(
            &[("a".into(), 40.0), ("b".into(), 20.0), ("c".into(), 0.0)],
            "h",
        );
        // 40 → top 50: the tallest is 80 % of the plot.
        let plot = HEIGHT - BOTTOM - 8.0;
        assert!((c.bars[0].height - 0.8 * plot).abs() < 1e-9);
        assert!((c.bars[1].height - 0.4 * plot).abs() < 1e-9);
        assert_eq!(c.bars[2].height, 0.0);
        assert_eq!(c.ticks.last().unwrap().label, "50");
        assert_eq!(c.bars[1].title, "b: 20 h");
        // Bars stand on the baseline.
        for b in &c.bars {
            assert!((b.y + b.height - c.base).abs() < 1e-9);
        }
    }

    #[test]
    fn labels_keep_the_digits_a_scale_needs() {
        assert_eq!(number(0.025), "0.025");
        assert_eq!(number(0.075), "0.075");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(20.0), "20");
        assert_eq!(number(1234.4), "1234");
    }

    #[test]
    fn no_values_draw_an_empty_chart_not_a_division_by_zero() {
        let c = bars(&[], "h");
        assert!(c.bars.is_empty());
        assert!(c.ticks.iter().all(|t| t.y.is_finite()));
    }
}
