//! Durations as people type them on a command line: `6s`, `1m30s`,
//! `250ms` (humantime's grammar), or a plain number of seconds (`2`,
//! `0.5`), which every duration flag accepted before units were.

/// Seconds in `text`: a plain non-negative number of seconds, or a
/// duration with units (`6s`, `1m30s`, `250ms`).
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return if seconds.is_finite() && seconds >= 0.0 {
            Ok(seconds)
        } else {
            Err(format!(
                "{text:?} is not a duration: give seconds (e.g. 2.5) or a duration with units \
                 (e.g. 6s, 1m30s, 250ms)"
            ))
        };
    }
    humantime::parse_duration(text)
        .map(|duration| duration.as_secs_f64())
        .map_err(|why| {
            format!(
                "{text:?} is not a duration ({why}): give seconds (e.g. 2.5) or a duration with \
                 units (e.g. 6s, 1m30s, 250ms)"
            )
        })
}

/// Milliseconds in `text`: a plain whole number of milliseconds (what the
/// `*-ms` flags always took), or a duration with units (`2s`, `250ms`).
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(millis) = text.parse::<u64>() {
        return Ok(millis);
    }
    humantime::parse_duration(text)
        .map(|duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
        .map_err(|why| {
            format!(
                "{text:?} is not a duration ({why}): give milliseconds (e.g. 250) or a duration \
                 with units (e.g. 250ms, 2s)"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_plain_seconds_both_parse() {
        assert_eq!(parse_seconds("6s").unwrap(), 6.0);
        assert_eq!(parse_seconds("1m30s").unwrap(), 90.0);
        assert_eq!(parse_seconds("250ms").unwrap(), 0.25);
        assert_eq!(parse_seconds("2").unwrap(), 2.0);
        assert_eq!(parse_seconds("0.5").unwrap(), 0.5);
        assert_eq!(parse_millis("250").unwrap(), 250);
        assert_eq!(parse_millis("2s").unwrap(), 2000);
        assert_eq!(parse_millis("250ms").unwrap(), 250);
        assert!(parse_millis("-5").unwrap_err().contains("e.g. 250ms"));
        for bad in ["-1", "nan", "inf", "6 parsecs", "", "s"] {
            let why = parse_seconds(bad).unwrap_err();
            assert!(why.contains("e.g. 6s"), "{bad}: {why}");
        }
    }
}
