//! The parser of `cubed`'s time flags (`--idle-timeout-secs`,
//! `--frame-timeout-ms`, ...): a whole number in the flag's own unit, as
//! always, or a duration as people type it (`10s`, `2m`, `250ms`,
//! humantime's grammar), converted to that unit; then held to the flag's
//! range like every numeric flag (`config::ranged`).

use std::ops::RangeInclusive;

/// The unit a time flag's plain number is in (the end of its name).
#[derive(Clone, Copy, Debug)]
pub enum TimeUnit {
    Secs,
    Millis,
}

impl TimeUnit {
    fn name(self) -> &'static str {
        match self {
            TimeUnit::Secs => "seconds",
            TimeUnit::Millis => "milliseconds",
        }
    }

    fn nanos(self) -> u128 {
        match self {
            TimeUnit::Secs => 1_000_000_000,
            TimeUnit::Millis => 1_000_000,
        }
    }
}

/// `value_parser = in_unit(TimeUnit::Millis, ITS_RANGE)`.
pub fn in_unit(
    unit: TimeUnit,
    range: RangeInclusive<u64>,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value = parse(unit, text.trim())?;
        if range.contains(&value) {
            Ok(value)
        } else {
            Err(format!(
                "{value} {} is not in {}..={}",
                unit.name(),
                range.start(),
                range.end()
            ))
        }
    }
}

fn parse(unit: TimeUnit, text: &str) -> Result<u64, String> {
    if let Ok(value) = text.parse::<u64>() {
        return Ok(value);
    }
    let duration = humantime::parse_duration(text).map_err(|why| {
        format!(
            "{text:?} is not a duration ({why}): give whole {} or a duration with units \
             (e.g. 10s, 2m, 250ms)",
            unit.name()
        )
    })?;
    let nanos = duration.as_nanos();
    if nanos % unit.nanos() != 0 {
        return Err(format!(
            "{text} is not a whole number of {}; give e.g. {}",
            unit.name(),
            match unit {
                TimeUnit::Secs => "10s or 2m",
                TimeUnit::Millis => "250ms or 2s",
            }
        ));
    }
    u64::try_from(nanos / unit.nanos()).map_err(|_| format!("{text} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_numbers_and_units_in_the_flags_unit() {
        let ms = in_unit(TimeUnit::Millis, 100..=600_000);
        assert_eq!(ms("10000"), Ok(10_000));
        assert_eq!(ms("10s"), Ok(10_000));
        assert_eq!(ms("250ms"), Ok(250));
        assert!(ms("50ms").unwrap_err().contains("100..=600000"));
        assert!(ms("11m").unwrap_err().contains("not in 100..=600000"));
        let secs = in_unit(TimeUnit::Secs, 0..=86_400);
        assert_eq!(secs("5m"), Ok(300));
        assert_eq!(secs("0"), Ok(0));
        assert!(
            secs("1500ms")
                .unwrap_err()
                .contains("whole number of seconds")
        );
        assert!(secs("soon").unwrap_err().contains("e.g. 10s"));
    }

    #[test]
    fn cubed_time_flags_take_units() {
        use clap::Parser;
        let args = crate::Args::try_parse_from([
            "cubed",
            "--idle-timeout-secs",
            "5m",
            "--frame-timeout-ms",
            "10s",
            "--write-timeout-ms",
            "30000",
            "--program-time-ms",
            "250ms",
            "--program-step-ms",
            "2s",
        ])
        .unwrap();
        assert_eq!(
            (
                args.idle_timeout_secs,
                args.frame_timeout_ms,
                args.write_timeout_ms,
                args.program_time_ms,
                args.program_step_ms
            ),
            (300, 10_000, 30_000, 250, 2000)
        );
        let refused =
            crate::Args::try_parse_from(["cubed", "--frame-timeout-ms", "20m"]).unwrap_err();
        assert!(
            refused.to_string().contains("--frame-timeout-ms"),
            "{refused}"
        );
        assert!(refused.to_string().contains("100..=600000"), "{refused}");
    }
}
