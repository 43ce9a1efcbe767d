//! A picture of a run (SVG): throughput and publish latency over time, fault windows shaded.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::history::{pairs, Event, Kind, Op, Phase};

const WIDTH: f64 = 960.0;
const PANEL: f64 = 240.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const GAP: f64 = 50.0;

/// The series plotted in the throughput panel: ok completions per second of these ops.
const SERIES: [(&str, &str); 3] = [
    ("publish", "#1f77b4"),
    ("pull", "#2ca02c"),
    ("ack", "#ff7f0e"),
];

/// One fault window: name, start and end in microseconds since the run started.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub name: String,
    pub start_us: u64,
    pub end_us: u64,
}

/// The fault windows of a history: from each fault's start to its stop (or the end).
pub fn fault_windows(events: &[Event]) -> Vec<Window> {
    let end = events.last().map_or(0, |e| e.time_us);
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e.kind == Kind::Invoke) {
        if let Op::Fault { name, phase, .. } = &e.op {
            match phase {
                Phase::Start => {
                    open.insert(name.clone(), e.time_us);
                }
                Phase::Stop => {
                    if let Some(start) = open.remove(name) {
                        out.push(Window {
                            name: name.clone(),
                            start_us: start,
                            end_us: e.time_us,
                        });
                    }
                }
            }
        }
    }
    out.extend(open.into_iter().map(|(name, start_us)| Window {
        name,
        start_us,
        end_us: end,
    }));
    out.sort_by_key(|w| w.start_us);
    out
}

/// Renders the run as an SVG document.
pub fn svg(events: &[Event]) -> String {
    let end_us = events.last().map_or(1, |e| e.time_us.max(1));
    // About 60 buckets, at least a quarter second each.
    let bucket_us = (end_us / 60).max(250_000);
    let buckets = (end_us / bucket_us + 1) as usize;
    let mut rate: BTreeMap<&str, Vec<f64>> = SERIES
        .iter()
        .map(|(f, _)| (*f, vec![0.0; buckets]))
        .collect();
    let mut lat_sum = vec![0.0f64; buckets];
    let mut lat_n = vec![0u32; buckets];
    let mut lat_max = vec![0.0f64; buckets];
    for pair in pairs(events) {
        let Some(done) = pair.completion.filter(|c| c.kind == Kind::Ok) else {
            continue;
        };
        let b = (done.time_us / bucket_us) as usize;
        if let Some(series) = rate.get_mut(pair.op().f()) {
            series[b] += 1.0;
        }
        if pair.op().f() == "publish" {
            let ms = done.time_us.saturating_sub(pair.invoke.time_us) as f64 / 1000.0;
            lat_sum[b] += ms;
            lat_n[b] += 1;
            lat_max[b] = lat_max[b].max(ms);
        }
    }
    let per_second = 1_000_000.0 / bucket_us as f64;
    for series in rate.values_mut() {
        series.iter_mut().for_each(|v| *v *= per_second);
    }
    let lat_mean: Vec<f64> = lat_sum
        .iter()
        .zip(&lat_n)
        .map(|(s, n)| if *n > 0 { s / *n as f64 } else { 0.0 })
        .collect();

    let height = TOP + 2.0 * PANEL + GAP + 40.0;
    let plot_w = WIDTH - LEFT - RIGHT;
    let x = |us: u64| LEFT + plot_w * us as f64 / end_us as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let panels = [
        (TOP, "ok operations per second"),
        (TOP + PANEL + GAP, "publish latency, ms (mean, max)"),
    ];
    for w in fault_windows(events) {
        for (top, _) in panels {
            let _ = writeln!(
                s,
                r##"<rect class="fault" x="{:.1}" y="{top}" width="{:.1}" height="{PANEL}" fill="#d62728" fill-opacity="0.15"><title>{}</title></rect>"##,
                x(w.start_us),
                (x(w.end_us) - x(w.start_us)).max(1.0),
                escape(&w.name)
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{}" fill="#d62728">{}</text>"##,
            x(w.start_us) + 2.0,
            TOP - 4.0,
            escape(&w.name)
        );
    }
    let line = |top: f64, values: &[f64], max: f64, color: &str, label: &str| -> String {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let t = ((i as u64 * bucket_us) + bucket_us / 2).min(end_us);
                format!("{:.1},{:.1}", x(t), top + PANEL - PANEL * v / max.max(1e-9))
            })
            .collect();
        format!(
            "<polyline class=\"series\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"><title>{label}</title></polyline>\n",
            points.join(" ")
        )
    };
    let rate_max = rate.values().flatten().fold(0.0f64, |a, b| a.max(*b));
    for (i, (f, color)) in SERIES.iter().enumerate() {
        s.push_str(&line(TOP, &rate[f], rate_max, color, f));
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" fill="{color}">{f}</text>"#,
            WIDTH - RIGHT - 160.0 + 55.0 * i as f64,
            TOP + 12.0
        );
    }
    let lat_top = TOP + PANEL + GAP;
    let lat_cap = lat_max.iter().fold(0.0f64, |a, b| a.max(*b));
    s.push_str(&line(lat_top, &lat_mean, lat_cap, "#1f77b4", "mean"));
    s.push_str(&line(lat_top, &lat_max, lat_cap, "#9467bd", "max"));
    for ((top, title), max) in panels.iter().zip([rate_max, lat_cap]) {
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#444"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="{}">{title}</text>"#,
            top - 6.0 + if *top == TOP { -12.0 } else { 0.0 }
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{:.0}</text>"#,
            LEFT - 4.0,
            top + 10.0,
            max
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">0</text>"#,
            LEFT - 4.0,
            top + PANEL
        );
    }
    let secs = end_us / 1_000_000;
    let step = (secs / 10).max(1);
    for t in (0..=secs).step_by(step as usize) {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{t}s</text>"#,
            x(t * 1_000_000),
            height - 10.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{History, OpResult, Process};

    /// Records one phase of a fault on `node`, done, with `detail`.
    fn fault(h: &History, name: &str, phase: Phase, node: u64, detail: &str) {
        h.invoke(Process::Nemesis, None, Op::fault(name, phase, vec![node]))
            .ok(OpResult::Fault {
                detail: detail.into(),
            });
    }

    #[test]
    fn windows_and_series_are_drawn() {
        let h = History::new();
        let p = h.next_process();
        fault(&h, "kill <leader>", Phase::Start, 1, "killed");
        let op = h.invoke(p, Some(1), Op::publish("t", vec!["a".into()]));
        op.ok(OpResult::publish(0, 1, false));
        fault(&h, "kill <leader>", Phase::Stop, 1, "restarted");
        let events = h.events();
        let windows = fault_windows(&events);
        assert_eq!(windows.len(), 1);
        assert!(windows[0].start_us <= windows[0].end_us);
        let picture = svg(&events);
        assert!(picture.starts_with("<svg") && picture.trim_end().ends_with("</svg>"));
        assert_eq!(
            picture.matches(r#"class="fault""#).count(),
            2,
            "the window is shaded in both panels"
        );
        assert_eq!(
            picture.matches(r#"class="series""#).count(),
            5,
            "three rates, mean and max latency"
        );
        assert!(picture.contains("kill &lt;leader&gt;"), "names are escaped");
    }

    #[test]
    fn an_unfinished_fault_runs_to_the_end() {
        let h = History::new();
        fault(&h, "pause", Phase::Start, 2, "paused");
        let p = h.next_process();
        let op = h.invoke(p, Some(1), Op::publish("t", vec!["a".into()]));
        op.info("timeout");
        let events = h.events();
        let windows = fault_windows(&events);
        assert_eq!(windows.len(), 1);
        assert_eq!(windows[0].end_us, events.last().unwrap().time_us);
    }
}
