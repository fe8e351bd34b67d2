//! The call's gRPC deadline, read from the `grpc-timeout` header.

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// The time the client gave this call, if it set a deadline.
pub(crate) fn grpc_timeout(md: &MetadataMap) -> Option<Duration> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_rejects_garbage() {
        let mut md = MetadataMap::new();
        for (v, d) in [
            ("5S", Duration::from_secs(5)),
            ("250m", Duration::from_millis(250)),
            ("2M", Duration::from_secs(120)),
        ] {
            md.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(grpc_timeout(&md), Some(d));
        }
        md.insert("grpc-timeout", "5x".parse().unwrap());
        assert_eq!(grpc_timeout(&md), None);
        assert_eq!(grpc_timeout(&MetadataMap::new()), None);
    }
}
