//! Latency summaries shared by `ferry bench`, `ferry rtt` and `ferry check-disk`: an HDR
//! histogram of microseconds, shown in milliseconds, as the same JSON keys and table columns.

use std::time::Duration;

use comfy_table::Table;
use hdrhistogram::Histogram;
use serde_json::Value;

/// Each quantile shown: where, its JSON key, its column.
const QUANTILES: [(f64, &str, &str); 4] = [
    (0.5, "p50_ms", "p50 ms"),
    (0.9, "p90_ms", "p90 ms"),
    (0.99, "p99_ms", "p99 ms"),
    (0.999, "p999_ms", "p99.9 ms"),
];

/// Microseconds from 1 to an hour, three significant digits.
pub(super) fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

/// Records `elapsed` (at least 1 µs; past the histogram's range, its top).
pub(super) fn record(h: &mut Histogram<u64>, elapsed: Duration) {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    h.saturating_record(micros.max(1));
}

pub(super) fn ms(micros: u64) -> f64 {
    micros as f64 / 1_000.0
}

/// `summary` (a JSON object) with `p50_ms`, `p90_ms`, `p99_ms`, `p999_ms` and `max_ms` added.
pub(super) fn with_quantiles(mut summary: Value, h: &Histogram<u64>) -> Value {
    if let Some(fields) = summary.as_object_mut() {
        for (q, key, _) in QUANTILES {
            fields.insert(key.into(), ms(h.value_at_quantile(q)).into());
        }
        fields.insert("max_ms".into(), ms(h.max()).into());
    }
    summary
}

/// A one-row table: the given columns and cells, then p50, p90, p99, p99.9 and max.
pub(super) fn table(columns: &[&str], mut cells: Vec<String>, h: &Histogram<u64>) -> Table {
    let mut header: Vec<&str> = columns.to_vec();
    header.extend(QUANTILES.iter().map(|(_, _, column)| *column));
    header.push("max ms");
    let cell = |micros: u64| format!("{:.3}", ms(micros));
    cells.extend(
        QUANTILES
            .iter()
            .map(|(q, _, _)| cell(h.value_at_quantile(*q))),
    );
    cells.push(cell(h.max()));
    let mut t = Table::new();
    t.set_header(header);
    t.add_row(cells);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_go_to_json_and_to_the_table_in_milliseconds() -> anyhow::Result<()> {
        let mut h = histogram()?;
        for micros in 1..=1_000 {
            record(&mut h, Duration::from_micros(micros));
        }
        record(&mut h, Duration::ZERO);
        let j = with_quantiles(serde_json::json!({ "calls": 1001 }), &h);
        assert_eq!(j["calls"], 1001);
        assert!(
            (j["p50_ms"].as_f64().unwrap_or_default() - 0.5).abs() < 0.01,
            "{j}"
        );
        assert!(
            (j["max_ms"].as_f64().unwrap_or_default() - 1.0).abs() < 0.01,
            "{j}"
        );
        let t = table(&["calls"], vec!["1001".into()], &h).to_string();
        assert!(
            t.contains("p99.9 ms") && t.contains("max ms") && t.contains("1001"),
            "{t}"
        );
        Ok(())
    }
}
