//! The report: markdown and JSON written under the output directory, and the
//! throughput chart.

use std::fmt::Write as _;

use serde_json::{Value, json};

#[derive(Default)]
pub(crate) struct Report {
    pub md: String,
    pub json: serde_json::Map<String, Value>,
}

impl Report {
    pub(crate) fn machine(&mut self) {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_default();
        // SAFETY: no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let date = std::process::Command::new("date")
            .arg("-u")
            .arg("+%Y-%m-%d %H:%M UTC")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let _ = writeln!(self.md, "# ratelimit benchmarks\n");
        let _ = writeln!(
            self.md,
            "Run {date} on {cpu} ({cpus} CPUs), kernel {}. Reproduce with `cargo xtask bench` (as root). \
             Figures drift ±20–30 % between runs on a shared machine: compare the ratios within one run.\n",
            kernel.trim()
        );
        self.json.insert(
            "machine".into(),
            json!({"kernel": kernel.trim(), "cpu": cpu, "cpus": cpus, "date": date}),
        );
    }

    pub(crate) fn section(&mut self, title: &str, intro: &str) {
        let _ = writeln!(self.md, "## {title}\n\n{intro}\n");
        println!("\n== {title}");
    }

    pub(crate) fn write(&self, dir: &std::path::Path) {
        std::fs::create_dir_all(dir).expect("creating the output directory");
        if let Some(svg) = self.chart() {
            std::fs::write(dir.join("throughput.svg"), svg).expect("writing throughput.svg");
            println!("wrote {}", dir.join("throughput.svg").display());
        }
        std::fs::write(dir.join("results.md"), &self.md).expect("writing results.md");
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(&Value::Object(self.json.clone())).expect("json"),
        )
        .expect("writing results.json");
        println!(
            "\nwrote {} and {}",
            dir.join("results.md").display(),
            dir.join("results.json").display()
        );
    }
}

impl Report {
    /// A horizontal bar chart of drop throughput by configuration, as SVG.
    fn chart(&self) -> Option<String> {
        let rows = self.json.get("floods")?.get("rows")?.as_array()?;
        let bars: Vec<(String, f64)> = rows
            .iter()
            .filter_map(|r| {
                Some((
                    format!("{} — {}", r["flood"].as_str()?, r["receiver"].as_str()?),
                    r["fps_median"].as_f64()?,
                ))
            })
            .collect();
        let max = bars.iter().map(|b| b.1).fold(1.0, f64::max);
        let (label_w, bar_w, row_h) = (430.0, 420.0, 26.0);
        let height = 60.0 + row_h * bars.len() as f64;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <text x=\"10\" y=\"22\" font-size=\"15\">Frames received and dropped per second at the receiver (veth, one run)</text>\n",
            label_w + bar_w + 110.0
        );
        for (i, (label, v)) in bars.iter().enumerate() {
            let y = 40.0 + row_h * i as f64;
            let w = bar_w * v / max;
            let colour = if label.contains("ratelimit") {
                "#2b7bb9"
            } else if label.contains("floor") {
                "#999999"
            } else {
                "#d9822b"
            };
            let _ = write!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
                 <rect x=\"{}\" y=\"{}\" width=\"{w:.1}\" height=\"{}\" fill=\"{colour}\"/>\n\
                 <text x=\"{}\" y=\"{}\">{:.2} M/s</text>\n",
                label_w - 8.0,
                y + 15.0,
                label
                    .replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;"),
                label_w,
                y + 3.0,
                row_h - 8.0,
                label_w + w + 6.0,
                y + 15.0,
                v / 1e6
            );
        }
        svg.push_str("</svg>\n");
        Some(svg)
    }
}
